"""The emulated graph backend fails where CUDA graphs fail (issue 26 part 1): host syncs and unkeepable
allocations raise during capture, replay replays the recorded ops (so Python values frozen at capture stay
frozen), and `cuda_branches` runs the hot path's CUDA branch on the CPU. Each bug class is planted once in a
copy of the engine's tick and caught; without the emulation (eager ticks, or the old re-run replay) the same
plant passes unseen."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from duetaspan.model.device_paths import capturing, cpu_fast_path, cuda_branches
from duetaspan.model.graph_emulation import GraphCaptureError, record
from duetaspan.model.graphs import EmulatedGraphBackend
from duetaspan.model.mimi import conv as conv_mod
from duetaspan.model.transformer import attention_span
from tests.model.engine_support import GREEDY, caller_audio, engine, tiny_parts

pytestmark = pytest.mark.cuda_logic
N = 8


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return tiny_parts(tmp_path_factory.mktemp("tok"))


def _run(eng, n: int = N) -> list[tuple]:
    """One greedy call for `n` ticks: per tick (text token, agent codes, pcm)."""
    slot = eng.open_slot(sampling=GREEDY, seed=1)
    audio = caller_audio(n, seed=7)
    out = []
    for t in range(n):
        r = eng.step({slot: audio[t]})[slot]
        out.append((r.text_token, r.agent_codes, r.pcm))
    return out


def _same(a: list[tuple], b: list[tuple]) -> bool:
    return all(x[0] == y[0] and x[1] == y[1] and np.allclose(x[2], y[2], atol=1e-5) for x, y in zip(a, b, strict=True))


# -- host syncs and allocations a graph cannot keep, refused during capture -----------------------------------


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("item", lambda x: x + x.sum().item()),
        ("tolist", lambda x: x + len(x.tolist())),
        ("numpy", lambda x: x + float(x.numpy()[0])),
        ("cpu", lambda x: x.cpu() + 1),
        ("to cpu", lambda x: x.to("cpu") + 1),
        ("bool", lambda x: x + 1 if bool(x.sum() > 0) else x),
        ("int", lambda x: x + int(x[0])),
        ("synchronize", lambda x: (torch.cuda.synchronize(), x + 1)[1]),
        ("nonzero", lambda x: x[x > 0].sum() + x),
        ("torch.tensor", lambda x: x + torch.tensor([1.0, 2.0])),
    ],
)  # fmt: skip
def test_host_syncs_and_value_shaped_allocations_raise_during_capture(name, body):
    x = torch.ones(2)
    if name != "synchronize":  # (a CPU build of torch has no CUDA to synchronize)
        body(x)  # fine eagerly, on the CPU: all the old emulation (re-running Python) could see
    with pytest.raises(GraphCaptureError, match="graph capture"):
        record(lambda: body(x))


def test_a_tensor_made_during_capture_and_kept_is_refused():
    x, cache = torch.ones(2), {}

    def cached(x):
        if "freqs" not in cache:  # the bug: caching while `capturing()` is True
            cache["freqs"] = torch.arange(2.0) * 3
        return x * cache["freqs"]

    with pytest.raises(GraphCaptureError, match="still referenced after it"):
        record(lambda: cached(x))

    def guarded(x):
        freqs = torch.arange(2.0) * 3
        if not capturing(x.device):
            cache["freqs"] = freqs
        return x * freqs

    cache.clear()
    recording, _ = record(lambda: guarded(x))
    assert not cache and recording.replay().tolist() == [0.0, 3.0]


def test_replay_runs_the_recorded_ops_over_the_current_buffers():
    x, state = torch.zeros(3), torch.zeros(3)
    scale = {"v": 2.0}

    def tick():
        state.add_(x)  # in place: a replay updates the real state
        return state * scale["v"]

    recording, _ = record(tick)
    x.fill_(1.0)
    scale["v"] = 10.0  # Python state after the capture: frozen in the graph
    assert recording.replay().tolist() == [2.0, 2.0, 2.0]
    assert recording.replay().tolist() == [4.0, 4.0, 4.0] and state.tolist() == [2.0, 2.0, 2.0]


# -- the three bug classes, planted in the engine's tick ------------------------------------------------------


def test_planted_item_in_the_tick_fails_its_capture(parts, caplog, monkeypatch):
    from duetaspan.model.generator import LMGenerator

    real = LMGenerator.device_step

    def planted(self, size, codes, active, noise):
        step = real(self, size, codes, active, noise)
        step.ret_prob.mul_(1.0 if step.ret_prob.max().item() >= 0 else 0.0)  # the bug: a host read
        return step

    monkeypatch.setattr(LMGenerator, "device_step", planted)
    eager = _run(engine(parts, sampling=GREEDY, max_slots=1, max_span=32, cuda_graphs=False))  # passes eagerly
    with caplog.at_level(logging.WARNING, logger="duetaspan.model.batching"):
        eng = engine(parts, sampling=GREEDY, max_slots=1, max_span=32, graph_backend=EmulatedGraphBackend("cpu"))
    assert eng.batch.graph_count == 0 and eng.batch.failed_graphs
    assert "GraphCaptureError" in caplog.text and "tensor.item()" in caplog.text
    assert _same(_run(eng), eager)  # those ticks fall back to eager


def test_planted_frozen_position_gives_the_wrong_answer_a_gpu_would(parts, monkeypatch):
    from duetaspan.model.generator import LMGenerator

    want = _run(engine(parts, sampling=GREEDY, max_slots=1, max_span=32, cuda_graphs=False))
    fine = _run(engine(parts, sampling=GREEDY, max_slots=1, max_span=32, graph_backend=EmulatedGraphBackend("cpu")))
    assert _same(fine, want), "the unplanted tick replays equal to eager"

    real = LMGenerator._advance_tensors

    def planted(self, lo, hi, codes, forced, active, noise):
        # the bug: the device offsets re-synced from the host mirror, a Python int read at capture time
        self.offsets[lo:hi].fill_(self._offsets_host[lo])
        return real(self, lo, hi, codes, forced, active, noise)

    monkeypatch.setattr(LMGenerator, "_advance_tensors", planted)
    eager = _run(engine(parts, sampling=GREEDY, max_slots=1, max_span=32, cuda_graphs=False))
    assert _same(eager, want), "eagerly the plant is harmless (host mirror == device offsets)"
    backend = EmulatedGraphBackend("cpu")
    graphed = _run(engine(parts, sampling=GREEDY, max_slots=1, max_span=32, graph_backend=backend))
    assert backend.replays == N
    assert not _same(graphed, want), "a replay must keep the capture-time offset, as a CUDA graph does"


def test_planted_bug_in_a_cuda_branch_shows_only_with_cuda_branches(parts, monkeypatch):
    cpu = torch.device("cpu")
    assert cpu_fast_path(cpu) and attention_span(cpu, 10, 3000) == 512
    with cuda_branches():
        assert not cpu_fast_path(cpu) and attention_span(cpu, 10, 3000) is None
        with_cuda = _run(engine(parts, sampling=GREEDY, max_slots=1, max_span=32, cuda_graphs=False))
    reference = _run(engine(parts, sampling=GREEDY, max_slots=1, max_span=32, cuda_graphs=False))
    assert _same(with_cuda, reference), "the CUDA branches compute what the CPU shortcuts compute"

    real = conv_mod._fast_conv

    def planted(conv, x):
        if cpu_fast_path(x.device):
            return real(conv, x)
        return real(conv, x) * 1.5  # the bug lives in the branch a GPU takes

    monkeypatch.setattr(conv_mod, "_fast_conv", planted)
    assert _same(_run(engine(parts, sampling=GREEDY, max_slots=1, max_span=32, cuda_graphs=False)), reference), (
        "without the switch the CPU never runs the broken branch"
    )
    with cuda_branches():
        broken = _run(engine(parts, sampling=GREEDY, max_slots=1, max_span=32, cuda_graphs=False))
    assert not _same(broken, reference)
