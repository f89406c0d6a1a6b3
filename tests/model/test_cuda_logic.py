"""The CUDA tick's logic on a CPU (issue 13): emulated graphs equal eager ticks token for token; captures
happen outside ticks only; a failed capture falls back for its shape alone; `cuda:N` capture and replay run
under that device. Marked `cuda_logic`: they run in the normal suite, whatever `NO_CUDA_GRAPH` says (the
backend is given explicitly), with the CUDA branches of the hot path on (`cuda_branches`). Where CUDA is
available the graph tests also run with real CUDA graphs (the device list is decided at collection, so
nothing is skipped anywhere)."""

from __future__ import annotations

import contextlib
import logging

import numpy as np
import pytest
import torch

from duetaspan.model import graphs as graphs_mod
from duetaspan.model.device_paths import cuda_branches
from duetaspan.model.engine import Persona
from duetaspan.model.graphs import (
    CudaGraphBackend,
    EmulatedGraphBackend,
    GraphBackend,
    graphs_disabled_by_env,
)
from duetaspan.model.mimi.checkpoint import _finish
from duetaspan.model.slots import SamplingParams
from tests.model.engine_support import GREEDY, caller_audio, engine, tiny_parts

pytestmark = pytest.mark.cuda_logic

SAMPLED = SamplingParams(temperature=0.8, text_temperature=0.7, top_k=50, text_top_k=10, allow_ret=True)
MIXED = SamplingParams(temperature=0.0, text_temperature=0.9, text_top_k=5)  # greedy audio, sampled text
ALLOWED = (GREEDY, SAMPLED, MIXED)  # what the scenario's calls open with: every mix is captured at start
N = 10
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.fixture(autouse=True)
def _cuda_branches():
    """Every tick here, eager or graphed, runs the CUDA branches of the hot path (on the CPU too)."""
    with cuda_branches():
        yield


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return tiny_parts(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module", params=DEVICES)
def device_parts(request, tmp_path_factory):
    """Tiny parts on each device: the CPU (emulated graphs) and, where there is one, a GPU (CUDA graphs)."""
    lm, mimi, tok = tiny_parts(tmp_path_factory.mktemp("tok"))
    device = torch.device(request.param)
    return lm.to(device), _finish(mimi, device, torch.float32), tok


class Recorder:
    """The device's graph backend (emulated on the CPU, CUDA graphs on a GPU), counting what it does and
    whether a capture ever ran inside `BatchedTick.run`; `fail_bucket` makes that bucket's captures fail."""

    def __init__(self, device: torch.device | str = "cpu", fail_bucket: int | None = None) -> None:
        device = torch.device(device)
        inner: GraphBackend = (
            CudaGraphBackend(device) if device.type == "cuda" else EmulatedGraphBackend(device)
        )
        self.inner, self.name, self.device = inner, inner.name, device
        self.in_tick, self.fail_bucket = False, fail_bucket
        self.captures = self.replays = self.captures_in_tick = 0

    def warm_up(self, fn, times):
        self.inner.warm_up(fn, times)

    def capture(self, fn):
        self.captures_in_tick += self.in_tick
        graph = self.inner.capture(fn)
        self.captures += 1
        if graph.output.shape[0] == self.fail_bucket:
            raise RuntimeError("simulated capture failure")
        return graph

    def replay(self, graph):
        self.replays += 1
        return self.inner.replay(graph)

    def synchronize(self):
        self.inner.synchronize()


def _watch_ticks(eng, backend: Recorder) -> list[bool]:
    """Wrap the engine's tick so the backend knows when one runs; returns the per-tick `graphed` flags."""
    graphed: list[bool] = []
    run = eng.batch.run

    def watched(pcm, rows):
        backend.in_tick = True
        try:
            out = run(pcm, rows)
        finally:
            backend.in_tick = False
        graphed.append(out.graphed)
        return out

    eng.batch.run = watched
    return graphed


def _scenario(eng) -> list[dict[int, tuple]]:
    """Bucket changes (2 -> 4 -> 2 -> 4), joins and leaves, slot reuse, spans in three slots in one tick,
    `force_ret`, greedy / sampled / mixed slots. Returns per tick {call: (token, codes, pcm, P(<ret>))}."""
    audio = [caller_audio(N, seed=30 + i) for i in range(5)]
    slots: dict[int, int] = {}
    ticks = []
    for t in range(N):
        if t == 0:
            slots[0] = eng.open_slot(Persona(text="You are Ada."), sampling=GREEDY, seed=1)
            slots[1] = eng.open_slot(Persona(text="You are Ben."), sampling=SAMPLED, seed=2)
        if t == 1:
            slots[2] = eng.open_slot(Persona(text="You are Cy."), sampling=MIXED, seed=3)
            slots[3] = eng.open_slot(sampling=GREEDY, seed=4)
        if t == 2:
            for i, ref in ((0, "It is 22 degrees."), (1, "Gate 4."), (2, "Room 12 is free.")):
                assert eng.inject(slots[i], ref)
        if t in (3, 7):
            eng.force_ret(slots[1])
        if t == 4:
            eng.close_slot(slots.pop(0))
            eng.close_slot(slots.pop(3))
        if t == 6:
            eng.close_slot(slots.pop(2))
            slots[4] = eng.open_slot(Persona(text="You are Dee."), sampling=GREEDY, seed=5)  # reuses slot 0
            assert eng.inject(slots[4], "The shop opens at nine.")
        if t == 8:
            eng.force_ret(slots[4])
        out = eng.step({s: audio[i][t] for i, s in slots.items()})
        ticks.append({i: (out[s].text_token, out[s].agent_codes, out[s].pcm, out[s].ret_prob)
                      for i, s in slots.items()})  # fmt: skip
    return ticks


def _assert_same(got: list[dict[int, tuple]], want: list[dict[int, tuple]]) -> None:
    assert len(got) == len(want)
    for t, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.keys() == w.keys()
        for i in g:
            assert g[i][0] == w[i][0] and g[i][1] == w[i][1], f"tick {t} call {i}: tokens differ from eager"
            np.testing.assert_allclose(g[i][2], w[i][2], atol=1e-5, err_msg=f"tick {t} call {i}: audio")
            assert g[i][3] == pytest.approx(w[i][3], abs=1e-6), f"tick {t} call {i}: P(<ret>)"


def test_graphs_equal_eager_token_for_token(device_parts):
    parts = device_parts
    want = _scenario(engine(parts, max_slots=4, max_span=32, cuda_graphs=False))
    backend = Recorder(parts[0].device)
    eng = engine(parts, max_slots=4, max_span=32, graph_backend=backend, samplings=ALLOWED)
    assert eng.batch.graphs_enabled and eng.batch.graph_count > 0, "graphs are captured at start"
    graphed = _watch_ticks(eng, backend)
    got = _scenario(eng)
    _assert_same(got, want)
    assert all(graphed) and len(graphed) == N, f"some ticks ran eagerly: {graphed}"
    assert backend.replays == N and backend.captures_in_tick == 0
    assert not eng.batch.eager_keys and not eng.batch.failed_graphs
    assert {b for b, _ in _keys(eng)} == {1, 2, 4}
    # the run really used several buckets and several sampling shapes per bucket
    assert len([k for b, k in _keys(eng) if b == 4]) >= 3
    assert [t[1][0] for t in got[3:4]] == [4], "force_ret did not reach slot 1's next frame"


def _keys(eng) -> list[tuple[int, object]]:
    return [(bk.size, key) for bk in eng.batch._buckets.values() for key in bk.graphs]


def test_every_allowed_sampling_is_captured_at_start_and_nothing_after(parts, caplog):
    """Issue 23.3: no capture (and so no device sync, gc.collect or empty_cache) once calls run. Every mix of
    the allowed samplings is captured at start; a call with other settings runs eagerly, with a warning."""
    backend = Recorder()
    eng = engine(parts, max_slots=2, max_span=32, graph_backend=backend, samplings=(GREEDY,))
    # bucket 1: default (greedy and sampling ticks), GREEDY (greedy ticks only); bucket 2: those and the mix
    assert eng.batch.graph_count == backend.captures == 3 + 5
    assert eng.lm.sampling(1) == eng.sampling.model_copy(update={"seed": 1}), "free slots' settings restored"
    captured = backend.captures
    graphed = _watch_ticks(eng, backend)
    a = eng.open_slot(seed=1)
    b = eng.open_slot(sampling=GREEDY, seed=2)
    for _ in range(2):
        eng.step({a: caller_audio(1)[0], b: caller_audio(1)[0]})
    assert graphed == [True, True] and backend.captures == captured and backend.captures_in_tick == 0
    eng.close_slot(b)
    with caplog.at_level(logging.WARNING, logger="duetaspan.model.batching"):
        c = eng.open_slot(sampling=MIXED, seed=3)  # not allowed: never captured, eager ticks
        eng.step({a: caller_audio(1)[0], c: caller_audio(1)[0]})
        eng.step({a: caller_audio(1)[0], c: caller_audio(1)[0]})
    assert graphed[2:] == [False, False] and backend.captures == captured
    assert caplog.text.count("no graph captured for these sampling settings") == 1


def test_failed_capture_falls_back_for_that_shape_only(device_parts, caplog):
    parts = device_parts
    want = _scenario(engine(parts, max_slots=4, max_span=32, cuda_graphs=False))
    backend = Recorder(parts[0].device, fail_bucket=2)
    with caplog.at_level(logging.WARNING, logger="duetaspan.model.batching"):
        eng = engine(parts, max_slots=4, max_span=32, graph_backend=backend, samplings=ALLOWED)
    failed = [r.getMessage() for r in caplog.records if "capture" in r.getMessage()]
    assert failed and all("bucket 2" in m and "simulated capture failure" in m for m in failed)
    assert "top-k" in failed[0], "the warning names the sampling shape"
    assert eng.batch.failed_graphs and all(f.startswith("bucket 2,") for f in eng.batch.failed_graphs)
    graphed = _watch_ticks(eng, backend)
    got = _scenario(eng)
    _assert_same(got, want)
    buckets = [eng.batch.bucket_for([True] * n + [False] * (4 - n)) for n in (1, 2, 3)]
    assert buckets == [1, 2, 4]
    assert eng.batch.graphs_enabled, "one failed shape must not turn graphs off"
    assert any(graphed) and not all(graphed), "bucket 4 ticks replay, bucket 2 ticks run eagerly"


def test_capture_and_replay_run_under_the_engine_device(monkeypatch):
    """`cuda:1`: warm-up, capture and replay each happen with device 1 current (faked CUDA calls)."""
    current = [0]
    seen: list[tuple[str, int]] = []

    @contextlib.contextmanager
    def device(dev):
        saved, current[0] = current[0], torch.device(dev).index
        try:
            yield
        finally:
            current[0] = saved

    class FakeStream:
        def __init__(self, dev=None):
            seen.append(("stream", current[0]))

        def wait_stream(self, other):
            return None

        def synchronize(self):
            seen.append(("sync", current[0]))

    class FakeGraph:
        def replay(self):
            seen.append(("replay", current[0]))

    @contextlib.contextmanager
    def graph(g, pool=None):
        seen.append(("capture", current[0]))
        yield

    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda dev=None: FakeStream())
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    backend = CudaGraphBackend(torch.device("cuda:1"))
    ran_on = []
    backend.warm_up(lambda: ran_on.append(current[0]), 2)
    g = backend.capture(lambda: (ran_on.append(current[0]), torch.zeros(1))[1])
    backend.replay(g)
    assert ran_on == [1, 1, 1]
    assert ("capture", 1) in seen and ("replay", 1) in seen and current[0] == 0
    with pytest.raises(ValueError, match="CUDA device"):
        CudaGraphBackend(torch.device("cpu"))


def test_cuda_graph_creation_failure_is_caught_per_shape(monkeypatch, parts, caplog):
    """`CUDAGraph()` itself failing (no driver, out of memory) is a failed capture, not a failed tick."""

    class Broken(CudaGraphBackend):
        def __init__(self):
            self.device, self._pool, self.name = torch.device("cpu"), None, "cuda"

        def warm_up(self, fn, times):
            fn()

        def synchronize(self):
            return None

    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    monkeypatch.setattr(torch.cuda, "device", lambda dev: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: (_ for _ in ()).throw(RuntimeError("no driver")))
    with caplog.at_level(logging.WARNING, logger="duetaspan.model.batching"):
        eng = engine(parts, max_slots=2, max_span=32, graph_backend=Broken())
    assert eng.batch.graph_count == 0 and len(eng.batch.failed_graphs) == 4
    assert "no driver" in caplog.text
    slot = eng.open_slot(sampling=GREEDY, seed=1)
    assert eng.step({slot: caller_audio(1)[0]})[slot].pcm.shape == (1920,)


@pytest.mark.parametrize(
    ("value", "off"),
    [("", False), ("0", False), ("false", False), ("No", False), ("off", False),
     ("1", True), ("true", True), ("YES", True), ("on", True), ("maybe", True)],
)  # fmt: skip
def test_one_no_cuda_graph_parser_for_the_lm_and_the_tick(monkeypatch, value, off):
    assert graphs_disabled_by_env({"NO_CUDA_GRAPH": value}) is off
    monkeypatch.setenv("NO_CUDA_GRAPH", value)
    from duetaspan.model.batching import cuda_graphs_wanted

    assert cuda_graphs_wanted(torch.device("cuda")) is not off
    assert (graphs_mod.graph_backend_for(torch.device("cuda")) is None) is off


def test_an_agents_sampling_is_the_engines_default_so_its_graphs_exist_before_the_first_call():
    from duetaspan.agent import Agent

    sampling = SamplingParams(temperature=0.6, top_k=100, text_temperature=0.0)
    agent = Agent(
        persona="Hi", model="tiny-random", device="cpu", max_calls=2, sampling=sampling, builtins=[]
    )
    eng = agent._load_engine()
    assert eng.sampling == sampling
    # every free slot carries it, so the captured keys are the ones the calls will use
    assert all(eng.lm.sampling(s).audio_top_k == 100 for s in range(2))


def test_a_buffer_swapped_after_capture_is_caught_as_stale(parts):
    """A CUDA graph replays over the addresses it captured: swapping a captured buffer for a new tensor
    (instead of writing it in place) would silently replay over stale memory on a GPU. The emulation
    refuses it."""
    from duetaspan.model.graphs import StaleGraphError

    eng = engine(parts, max_slots=2, max_span=32, graph_backend=EmulatedGraphBackend("cpu"))
    slot = eng.open_slot(seed=1)
    eng.step({slot: caller_audio(1)[0]})  # replays fine while buffers are updated in place
    eng.lm._ret_prob = eng.lm._ret_prob.clone()
    with pytest.raises(StaleGraphError, match="reallocated after capture"):
        eng.step({slot: caller_audio(1)[0]})


def test_the_generators_step_graphs_are_captured_at_start_never_inside_a_step(monkeypatch, caplog):
    """`StepGraphs` (direct `LMGenerator.step` on a GPU) with torch.cuda's graph API faked on the CPU: `run`
    never captures (issue 23.3: a capture syncs the device and runs gc.collect/empty_cache); a key captured
    by `capture` over cloned static inputs replays after copying new inputs into those buffers; a key never
    captured runs eagerly with one warning; a failed capture leaves only that key eager."""
    replays, devices, made = [], [], []
    fail = {"on": False}

    class FakeGraph:
        def __init__(self):
            if fail["on"]:
                raise RuntimeError("no capture here")
            made.append(self)

        def replay(self):
            replays.append(self)

    @contextlib.contextmanager
    def fake_device(device):
        devices.append(device)
        yield

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "device", fake_device)
    seen = []

    def step(x, mask):
        seen.append(x)
        return x * 2, x + 1

    graphs = graphs_mod.StepGraphs(torch.device("cuda:1"))
    x = torch.tensor([1.0, 2.0])
    with caplog.at_level(logging.WARNING, logger="duetaspan.model.graphs"):
        for _ in range(3):  # an uncaptured key: eager every time, never captured on a later use
            assert [t.tolist() for t in graphs.run("a", step, x, None)] == [[2.0, 4.0], [2.0, 3.0]]
    assert seen == [x, x, x] and not made and not replays
    assert caplog.text.count("no CUDA graph was captured") == 1

    assert graphs.capture("b", step, x, None)
    static = seen[-1]
    assert static is not x and len(made) == 1 and devices == [torch.device("cuda:1")]
    out = graphs.run("b", step, torch.tensor([5.0, 6.0]), None)
    assert len(seen) == 4 and len(replays) == 1 and static.tolist() == [5.0, 6.0]  # replayed, inputs copied
    assert out[0] is not seen[-1] and graphs.capture("b", step, x, None) and len(made) == 1

    fail["on"] = True
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="duetaspan.model.graphs"):
        assert not graphs.capture("c", step, x, None)
    assert "capture of the LM step failed" in caplog.text
    graphs.run("c", step, x, None)
    assert seen[-1] is x and len(replays) == 1  # that key stays eager; "b" still replays
    graphs.run("b", step, x, None)
    assert len(replays) == 2
