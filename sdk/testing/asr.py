"""`ScriptedASR`: a loopback transcription server speaking both protocols the SDK supports, answering from a
script and recording every request, so a test decides what the question capture "hears".

    POST /v1/audio/transcriptions   multipart (`file` = WAV, `model`, ...)  -> {"text": ...}
    POST /transcribe                raw WAV body (or multipart `file`)       -> {"text": ...}

Script (dict or JSON file): `steps` (replies in order), `default` (then). A reply is a dict with any of
`text`, `status` (HTTP error), `delay_s`, `hang` (never answer), `body` (raw, not JSON), `words` (word times
sent back, `[{"word", "start", "end"}]` in seconds; with `"words_from": "speech"` they count from the first
sample of the received audio above 0.02 full scale, where the caller's speech begins, so a test can place words
in its own caller audio wherever voice detection cut the utterance). A plain string
is shorthand for `{"text": ...}`. Every request is recorded in `requests` as
`{"path", "sample_rate", "seconds", "model", "language"}` so tests can check what audio was sent.

Example:
    >>> asr = ScriptedASR({"steps": ["what time is it in tokyo"], "default": ""})
    >>> asr.hears("please book a table").default
    'please book a table'
    >>> # async with asr as base_url:  Agent(asr={"kind": "transcribe", "url": asr.transcribe_url}, ...)

Command line:
    python -m duetaspan.testing.asr --port 8990 --script script.json
"""

from __future__ import annotations

import asyncio
import io
import wave
from typing import Any

import numpy as np
from aiohttp import BodyPartReader, web

from duetaspan.testing.servers import ScriptedServer, hang_until_disconnect


def _wav_info(data: bytes) -> tuple[int, float]:
    with wave.open(io.BytesIO(data), "rb") as w:
        return w.getframerate(), w.getnframes() / float(w.getframerate())


def _speech_onset(data: bytes, threshold: float = 0.02) -> float:
    """Seconds from the start of a 16-bit mono WAV to its first sample above `threshold` (0.0: none)."""
    with wave.open(io.BytesIO(data), "rb") as w:
        rate, frames = w.getframerate(), w.readframes(w.getnframes())
    pcm = np.frombuffer(frames, "<i2")
    loud = np.flatnonzero(np.abs(pcm) > threshold * 32768)
    return float(loud[0]) / rate if loud.size else 0.0


class ScriptedASR(ScriptedServer):
    """Answers transcription requests from a script; records each request in `requests`."""

    description = "Scripted ASR server (tests only)."
    script_help = "JSON script (steps / default)"

    def __init__(self, script: dict[str, Any] | None = None) -> None:
        script = script or {}
        self.steps: list[Any] = list(script.get("steps", []))
        self.default: Any = script.get("default", "")
        self.requests: list[dict[str, Any]] = []

    def hears(self, text: str) -> ScriptedASR:
        """From now on every transcription is `text` (however voice detection cuts the utterance)."""
        self.default = text
        return self

    @property
    def transcribe_url(self) -> str:
        """The `POST /transcribe` endpoint (`asr={"kind": "transcribe", "url": ...}`) while served."""
        return self.base_url.removesuffix("/v1") + "/transcribe"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/audio/transcriptions", self._handle)
        app.router.add_post("/transcribe", self._handle)
        app.router.add_get("/transcribe", self._health)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def _handle(self, request: web.Request) -> web.Response:
        fields: dict[str, str] = {}
        if request.content_type.startswith("multipart/"):
            audio = b""
            reader = await request.multipart()
            async for part in reader:
                if not isinstance(part, BodyPartReader):  # a nested multipart: not a form field
                    continue
                if part.name == "file":
                    audio = bytes(await part.read())
                else:
                    fields[part.name or ""] = await part.text()
        else:
            audio = await request.read()
        try:
            rate, seconds = _wav_info(audio)
        except (wave.Error, EOFError):
            return web.json_response({"text": "", "error": "body is not a WAV file"}, status=400)
        self.requests.append(
            {
                "path": request.path,
                "sample_rate": rate,
                "seconds": seconds,
                "model": fields.get("model"),
                "language": fields.get("language") or request.query.get("language"),
            }
        )
        reply = self.steps.pop(0) if self.steps else self.default
        if isinstance(reply, str):
            reply = {"text": reply}
        if reply.get("delay_s"):
            await asyncio.sleep(float(reply["delay_s"]))
        if reply.get("hang"):
            await hang_until_disconnect(request)
            return web.Response(status=504)
        if "status" in reply:
            return web.json_response({"text": "", "error": "scripted failure"}, status=int(reply["status"]))
        if "body" in reply:
            return web.Response(text=str(reply["body"]))
        body: dict[str, Any] = {"text": reply.get("text", "")}
        if isinstance(reply.get("words"), list):
            shift = _speech_onset(audio) if reply.get("words_from") == "speech" else 0.0
            body["words"] = [{**w, "start": round(float(w["start"]) + shift, 3),
                              "end": round(float(w["end"]) + shift, 3)} for w in reply["words"]]  # fmt: skip
        return web.json_response(body)


main = ScriptedASR.main

__all__ = ["ScriptedASR", "main"]

if __name__ == "__main__":
    main()
