"""A replica's watch of its own Serve state (no Ray needed): it drains on `STOPPING`, or once it is no longer
listed after it was; a replica still starting (not listed yet) or a controller that cannot be reached drains
nothing, nor one read that misses it. The drain then ends the live calls at its timeout with `ended_by: "shutdown"`."""

from __future__ import annotations

import asyncio

from duetaspan.adapters.ray.config import RayServeConfig
from duetaspan.adapters.ray.control import ReplicaDrain, control_token, roles
from duetaspan.pipeline.admission import Admission


def _states(*states: object):
    """A `state()` that answers `states` in turn (an exception instance is raised), then the last again."""
    answers = list(states)

    def state() -> str | None:
        now = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(now, Exception):
            raise now
        return now  # type: ignore[return-value]

    return state


async def _watched(*states: object, polls: float = 0.3) -> ReplicaDrain:
    drain = ReplicaDrain("r1", Admission(2), timeout_s=5)
    task = asyncio.create_task(drain.watch(_states(*states), poll_s=0.01))
    await asyncio.wait({task}, timeout=polls)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return drain


async def test_the_watch_drains_on_stopping_or_removal_and_only_then():
    assert (await _watched("STARTING", "RUNNING", RuntimeError("controller away"), "STOPPING")).draining
    assert (await _watched("RUNNING", None)).draining  # listed, then gone: being removed
    assert not (await _watched("RUNNING", None, "RUNNING")).draining  # one read without it: a glitch
    assert not (await _watched(None)).draining  # never listed yet (starting): nothing to drain
    assert not (await _watched("RUNNING", RuntimeError("controller away"))).draining


async def test_a_drain_ends_the_live_call_at_its_timeout_as_shutdown():
    admission = Admission(2)
    slot = admission.try_acquire("twilio", "CA1")
    ended = asyncio.Event()
    slot.on_end(lambda: (ended.set(), slot.release()))
    drain = ReplicaDrain("r1", admission, timeout_s=0.2)
    assert drain.begin("test") and not drain.begin("again")
    assert admission.try_acquire("twilio", "CA2").reason == "draining"
    await asyncio.wait_for(drain.drained.wait(), 30)
    assert ended.is_set() and slot.ended_by == "shutdown"


def test_roles_follow_the_local_demo_rule_and_the_drain_token_is_keyed():
    base = {"webrtc": {"token": "page-token-0123456789"}}
    metrics, admin = roles(RayServeConfig(**base))
    assert metrics.check(None).status == 403 and admin.check(None).status == 403  # off: no token set
    metrics, admin = roles(RayServeConfig(**base, local_demo=True))
    assert metrics.check(None) is None and admin.check(None) is None  # the first-run demo only
    metrics, _ = roles(RayServeConfig(**base, metrics_token="m-token"))
    assert metrics.check(None).status == 401 and metrics.check("Bearer m-token") is None
    assert control_token(b"a" * 32) != control_token(b"b" * 32)
