"""What a call gets from the agent's store (`agent.store`, opened by the server): its record indexed when it
ends (here, or by the server's `AfterCall` when served: one write either way), and the do-not-call list for the built-in `opt_out` tool (`CallContext.metadata["do_not_call"]`, an
async `add(number)`); and the campaign row's variables filled into the persona prompt (`{name}`)."""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from duetaspan.pipeline.artifacts import CallRecorder
from duetaspan.registry import CallContext
from duetaspan.store import Store, entry_from_record

log = logging.getLogger("duetaspan.store")
DNC_KEY = "do_not_call"
_VARIABLE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]{0,63})\}")


def fill_variables(text: str | None, variables: dict[str, Any]) -> str | None:
    """`{name}` -> the variable's value for each variable the call has; other braces stay as written."""
    if not text or not variables:
        return text
    return _VARIABLE.sub(lambda m: str(variables[m[1]]) if m[1] in variables else m[0], text)


def attach_store(
    store: Store | None, context: CallContext, recorder: CallRecorder | None, *, index: bool = True
) -> None:
    """Index the call's record when it closes (unless `index` is False: a served agent's `AfterCall` writes the
    row with the `call.ended` event, in one transaction); give the call's tools the do-not-call list."""
    if store is None:
        return
    if recorder is not None and index:
        folder = recorder.dir

        def index(record: dict[str, Any]) -> None:
            async def write() -> None:
                async with store.transaction() as tx:
                    await tx.index_call(entry_from_record(record, folder))

            store.spawn(write())

        recorder.after_close.append(index)

    async def add(number: str, source: str = "opt_out") -> bool:
        async with store.transaction() as tx:
            added = await tx.dnc_add([number], now=time.time(), source=source) > 0
            await tx.emit("dnc.added", call_id=context.call_id, data={"number": number, "source": source})
        log.info("call %s: %s added to the do-not-call list (%s)", context.call_id, number, source)
        return added

    context.metadata[DNC_KEY] = add


__all__ = ["DNC_KEY", "attach_store", "fill_variables"]
