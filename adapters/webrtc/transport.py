"""`PageTransport`: Pipecat's SmallWebRTC transport for one browser page, with the page's event stream.

`input()` is `SmallWebRTCInputTransport -> CallerEvents` and `output()` is `AgentEvents ->
SmallWebRTCOutputTransport` (nested pipelines), so an agent session runs
`transport.input() -> DuetaSpanService -> transport.output()` unchanged and the page still gets every word,
span and counter over the data channel (see `events.py`). Both directions run at the model's 24 kHz:
Pipecat resamples the browser's 48 kHz Opus once on the way in, aiortc's Opus encoder once on the way out.

Events: `on_client_connected(transport)`, `on_client_disconnected(transport)`,
`on_force_ret(transport)` (the page asked for a `<ret>`; only when `allow_force_ret`).

Example:
    >>> async def on_offer(connection: SmallWebRTCConnection, session_for):     # doctest: +SKIP
    ...     transport = PageTransport(connection, call_id="web-1")
    ...     session = session_for(transport)                   # agent.create_session(info, transport)
    ...     await session.run()
"""

from __future__ import annotations

import logging
from typing import Any

from pipecat.pipeline.pipeline import Pipeline
from pipecat.transports.base_transport import BaseTransport, TransportParams
from pipecat.transports.smallwebrtc.connection import SmallWebRTCConnection
from pipecat.transports.smallwebrtc.transport import SmallWebRTCTransport
from pydantic import ValidationError

from duetaspan.adapters.webrtc.events import AgentEvents, CallerEvents, HelloEvent, PageCommand
from duetaspan.model.convention import SAMPLE_RATE

logger = logging.getLogger("duetaspan.webrtc")


def page_transport_params() -> TransportParams:
    """Mono 24 kHz both ways: the model's own rate, so no resampling happens inside the pipeline."""
    return TransportParams(
        audio_in_enabled=True,
        audio_in_sample_rate=SAMPLE_RATE,
        audio_in_channels=1,
        audio_out_enabled=True,
        audio_out_sample_rate=SAMPLE_RATE,
        audio_out_channels=1,
    )


class PageTransport(BaseTransport):
    """One page's call over SmallWebRTC (see the module docstring)."""

    def __init__(
        self,
        connection: SmallWebRTCConnection,
        *,
        call_id: str,
        allow_force_ret: bool = False,
        params: TransportParams | None = None,
        stats_interval_s: float = 0.5,
    ) -> None:
        super().__init__(input_name=f"PageInput#{call_id}", output_name=f"PageOutput#{call_id}")
        self.call_id = call_id
        self.connection = connection
        self.allow_force_ret = allow_force_ret
        self.webrtc = SmallWebRTCTransport(connection, params or page_transport_params())
        self.agent_events = AgentEvents(name=f"AgentEvents#{call_id}")
        self.caller_events = CallerEvents(
            self.agent_events, stats_interval_s=stats_interval_s, name=f"CallerEvents#{call_id}"
        )
        self._input = Pipeline([self.webrtc.input(), self.caller_events])
        self._output = Pipeline([self.agent_events, self.webrtc.output()])
        self.connected = False
        self._agent_track: Any = None
        for name in ("on_client_connected", "on_client_disconnected", "on_force_ret"):
            self._register_event_handler(name)

        @self.webrtc.event_handler("on_client_connected")
        async def _connected(_transport: Any, _client: Any) -> None:
            self.connected = True
            # the agent's audio track, kept: Pipecat forgets it before `on_client_disconnected` fires
            self._agent_track = getattr(getattr(self.webrtc, "_client", None), "_audio_output_track", None)
            logger.info("page call %s: connected", call_id)
            await self.caller_events.send(HelloEvent(call_id=call_id, force_ret=allow_force_ret))
            await self._call_event_handler("on_client_connected")

        @self.webrtc.event_handler("on_client_disconnected")
        async def _disconnected(_transport: Any, _client: Any) -> None:
            logger.info("page call %s: the page disconnected", call_id)
            await self._drop_agent_audio()
            await self._call_event_handler("on_client_disconnected")

        @self.webrtc.event_handler("on_app_message")
        async def _message(_transport: Any, message: Any, _sender: Any) -> None:
            await self._on_page_message(message)

    async def _drop_agent_audio(self) -> None:
        """The page hung up: nobody reads the agent's audio any more. A write waits until the track's reader
        takes its last 10 ms chunk, so queued audio would block the output until Pipecat's write timeout
        (10 s) and log a normal hang-up as two ERRORs. Mark the output unusable (later writes are dropped at
        once) and release the writes waiting on the track (Pipecat has no public call for this)."""
        await self.webrtc.output().set_usable(False)
        chunks = getattr(self._agent_track, "_chunk_queue", None)
        if not chunks:
            return
        for _chunk, future in list(chunks):
            if future is not None and not future.done():
                future.set_result(False)
        chunks.clear()

    def input(self) -> Pipeline:  # type: ignore[override]
        return self._input

    def output(self) -> Pipeline:  # type: ignore[override]
        return self._output

    async def _on_page_message(self, message: Any) -> None:
        if not isinstance(message, dict) or message.get("label") != "duetaspan":
            return  # Pipecat's own messages, or other clients' chatter
        try:
            command = PageCommand.model_validate(message)
        except ValidationError:
            logger.warning("page call %s: ignored an unknown page message %.200r", self.call_id, message)
            return
        if command.type == "force_ret":
            if not self.allow_force_ret:
                logger.warning("page call %s: force_ret refused (serve with --allow-force-ret)", self.call_id)
                return
            await self._call_event_handler("on_force_ret")
