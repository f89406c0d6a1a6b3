"""The duplex engine: B call slots over one LM and one Mimi, stepped together every 80 ms.

Per `step`, for every slot given a caller frame: land its queued Context Spans (and a due persona re-pin) as
one prefill pass each, Mimi-encode all caller frames in one batch, run one batched LM step, Mimi-decode the
agent codes, and report the text token and `<ret>`. Slots not in the step are idle and bit-identical
afterwards. Everything here is blocking compute: call `open_slot`, `close_slot` and `step` from one engine
thread; `inject`, `force_ret` and `hold_agent` are thread-safe and may be called from anywhere (the event loop).

A call opened with `defer_prefill=True` (what the engine host does) has its persona prompt written in chunks
between ticks (`prefill_pending`, `duetaspan.model.opening`); meanwhile its steps are silent frames.

`FrameResult.silent` is True when the agent frame carries no sound: the slot is still warming up (no agent
codes yet), the eight agent codes are exactly `SILENCE_CODES`, or the decoded frame's RMS is below −50 dBFS.

Example:
    >>> import numpy as np
    >>> from duetaspan.model.engine import DuplexEngine, Persona
    >>> engine = DuplexEngine.load("tiny-random", device="cpu", max_slots=2, seed=0)
    >>> slot = engine.open_slot(Persona(text="You are Ada."), seed=1)
    >>> engine.inject(slot, "(tool result) it is 22 degrees and sunny")
    True
    >>> result = engine.step({slot: np.zeros(1920, np.float32)})[slot]
    >>> result.spans[0].n_frames, result.pcm.shape
    (12, (1920,))
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from duetaspan.errors import AudioFormatError, ConfigError
from duetaspan.model.batching import BatchedTick
from duetaspan.model.convention import (
    FRAME_SIZE,
    N_AUDIO_CODEBOOKS,
    RET_ID,
    SAMPLE_RATE,
    SPAN_CLOSE_ID,
    UNGENERATED_TOKEN_ID,
)
from duetaspan.model.engine_parts import file_parts, preset_parts
from duetaspan.model.generator import LMGenerator
from duetaspan.model.graphs import GraphBackend
from duetaspan.model.lm import LMModel
from duetaspan.model.lm_config import LMConfig
from duetaspan.model.mimi import MimiConfig, MimiModel, MimiStream
from duetaspan.model.opening import OpeningQueue, start_persona, waiting_result
from duetaspan.model.persona import Persona, resolve_voice
from duetaspan.model.presets import Preset, get_preset
from duetaspan.model.slots import (
    EngineError,
    EngineFullError,
    FrameResult,
    SamplingParams,
    SlotId,
    SlotRecord,
    agent_frame,
)
from duetaspan.model.span_landing import apply_forced_ret, land_spans, prefill
from duetaspan.model.tokenizer import TextTokenizer
from duetaspan.spans.events import RetGate, SpanLanded
from duetaspan.spans.pending import QueuedSpan, SpanQueue
from duetaspan.spans.reference import DEFAULT_MAX_TOKENS, prepare_reference

log = logging.getLogger(__name__)

DEFAULT_MAX_SPAN = 256

__all__ = ["DuplexEngine", "EngineError", "EngineFullError", "FrameResult", "Persona", "SamplingParams", "SlotId",
           "SpanLanded"]  # fmt: skip


class DuplexEngine:
    """B call slots over one LM + Mimi. Build it with `load` (a preset) or `from_files`.

    Args:
        lm, mimi, tokenizer: the parts (weights already on `device`).
        max_slots: B, the number of concurrent calls.
        max_span: the longest single prefill (frames); longer prompts are written in several passes.
        seed: base seed for slots opened without one.
        span_close_id: 13, or 12 for checkpoints trained before 2026-09-08.
        max_reference_tokens: cap on a reference's tokens (cut at a sentence or word boundary).
        ret_gate: (threshold, refractory_frames) to also force `<ret>` when P(`<ret>`) passes the threshold.
        pin_persona: keep the persona text prompt in the attention window for calls of any length.
        buckets: batch sizes a tick rounds the active slots up to (see `duetaspan.model.batching`).
        cuda_graphs: None = one CUDA graph per bucket on GPUs unless `NO_CUDA_GRAPH`; False = eager.
        graph_backend: an explicit graph backend (`duetaspan.model.graphs`, e.g. the CPU emulation in tests).
            Graphs are captured here, once: for the default sampling and every mix with `samplings`.
        samplings: other `SamplingParams` calls may open with (their graphs are captured at start; a call
            with settings outside them runs its ticks eagerly, with a warning, and never captures).
        sampling: the default `SamplingParams` of slots opened without their own (e.g.
            `SamplingParams(allow_ret=False)` for scripted tests and demos: only `force_ret` or the gate ask).
    """

    sample_rate = SAMPLE_RATE
    frame_size = FRAME_SIZE

    def __init__(
        self,
        lm: LMModel,
        mimi: MimiModel,
        tokenizer: TextTokenizer,
        *,
        max_slots: int = 1,
        max_span: int = DEFAULT_MAX_SPAN,
        seed: int = 0,
        span_close_id: int = SPAN_CLOSE_ID,
        max_reference_tokens: int = DEFAULT_MAX_TOKENS,
        ret_gate: tuple[float, int] | None = None,
        pin_persona: bool = True,
        preset: Preset | None = None,
        model_dir: str | Path | None = None,
        voices_dir: str | Path | None = None,
        buckets: tuple[int, ...] | None = None,
        cuda_graphs: bool | None = None,
        sampling: SamplingParams | None = None,
        graph_backend: GraphBackend | None = None,
        samplings: tuple[SamplingParams, ...] = (),
    ) -> None:
        if max_slots < 1:
            raise ConfigError(f"max_slots must be >= 1, got {max_slots}")
        if max_span < 3:
            raise ConfigError(
                f"max_span must be >= 3 (a span is at least open + one token + close), got {max_span}"
            )
        if mimi.num_codebooks < N_AUDIO_CODEBOOKS:
            raise ConfigError(f"Mimi emits {mimi.num_codebooks} codebooks; the LM needs {N_AUDIO_CODEBOOKS}")
        self.lm_model = lm
        self.mimi_model = mimi
        self.tokenizer = tokenizer
        self.max_slots = max_slots
        self.max_span = max_span
        self.seed = seed
        self.span_close_id = span_close_id
        self.max_reference_tokens = min(max_reference_tokens, max_span - 2)
        self.ret_gate = ret_gate
        self.pin_persona = pin_persona
        self.sampling = sampling or SamplingParams()
        self.preset = preset
        self.model_dir = model_dir
        self.voices_dir = Path(voices_dir) if voices_dir is not None else None
        self.device = lm.device
        self.lm = LMGenerator(lm, batch_size=max_slots, max_span=max_span, cuda_graph=False)
        self.openings = OpeningQueue(self.lm, max_span)  # deferred persona prefills (bounded call opening)
        self.mimi = MimiStream(mimi, batch_size=max_slots)
        for slot in range(max_slots):  # free slots carry the default sampling: one graph key per bucket
            self.lm.set_sampling(slot, self.sampling.model_copy(update={"seed": seed + slot}))
        self.batch = BatchedTick(
            self.lm, self.mimi, buckets=buckets, cuda_graphs=cuda_graphs, graph_backend=graph_backend
        )
        # Every graph now, before the first call: never inside a tick or a call's opening (a no-op without graphs).
        self.batch.capture(samplings=tuple(s.model_copy(update={"seed": seed}) for s in samplings))
        self.spans = SpanQueue()
        self._slots = [SlotRecord() for _ in range(max_slots)]
        self._lock = threading.Lock()  # guards generations, open flags and forced <ret>s
        self._forced: set[tuple[int, int]] = set()
        self._opens = 0

    # -- construction -------------------------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        model: str = "tiny-random",
        *,
        device: str | torch.device = "cpu",
        max_slots: int = 1,
        seed: int = 0,
        dtype: torch.dtype | None = None,
        model_dir: str | Path | None = None,
        random_weights: bool = False,
        token: str | None = None,
        **options: Any,
    ) -> DuplexEngine:
        """Build from a preset (`tiny-random`, `duetaspan-7b`, `personaplex-7b`, `moshi-7b`).

        Weights come from `model_dir` / `$DUETASPAN_MODEL_DIR` or the Hugging Face Hub. `random_weights=True`
        builds the preset's architecture with seeded random weights and the tiny tokenizer (benchmarks).
        """
        preset = get_preset(model)
        lm, mimi, tokenizer = preset_parts(
            preset, device=device, seed=seed, dtype=dtype, model_dir=model_dir,
            random_weights=random_weights, token=token,
        )  # fmt: skip
        options.setdefault("span_close_id", preset.span_close_id)
        return cls(
            lm, mimi, tokenizer, max_slots=max_slots, seed=seed, preset=preset, model_dir=model_dir, **options
        )

    @classmethod
    def from_files(
        cls,
        checkpoint: str | Path,
        lm_config: str | Path | LMConfig | None = None,
        mimi: str | Path | None = None,
        tokenizer: str | Path | None = None,
        *,
        device: str | torch.device = "cpu",
        max_slots: int = 1,
        seed: int = 0,
        dtype: torch.dtype | None = None,
        mimi_config: str | MimiConfig | None = None,
        **options: Any,
    ) -> DuplexEngine:
        """Build from explicit files: LM `.pt`/`.safetensors`, its `lm_kwargs` JSON, Mimi safetensors, spm model.

        `lm_config` None reads `config.json` beside the checkpoint, else matches a preset by shapes. Named voices
        resolve to `voices/NAME.pt` beside the checkpoint. `mimi_config` None tries the released `mimi`
        architecture, then `tiny`.
        """
        lm, codec, text = file_parts(
            checkpoint, lm_config, mimi, tokenizer, device=device, dtype=dtype, mimi_config=mimi_config
        )
        options.setdefault("voices_dir", Path(checkpoint).parent / "voices")
        return cls(lm, codec, text, max_slots=max_slots, seed=seed, **options)

    # -- slots --------------------------------------------------------------------------------------------
    def open_slot(
        self,
        persona: Persona | None = None,
        sampling: SamplingParams | None = None,
        seed: int | None = None,
        *,
        defer_prefill: bool = False,
        hold_agent: bool = False,
    ) -> SlotId:
        """Take a free slot, reset it and prefill the persona prompt in one pass; returns its `SlotId`.

        `defer_prefill=True` queues the prompt instead: `prefill_pending` writes it in chunks between ticks,
        and until it is written the slot's steps return silence without running the model.
        `hold_agent=True` opens it held at silence, as `hold_agent(slot, True)` before its first step would.
        Blocking compute: call it from the engine thread. Raises `EngineFullError` when no slot is free.
        """
        with self._lock:
            free = next((i for i, s in enumerate(self._slots) if not s.open), None)
            if free is None:
                raise EngineFullError(
                    f"all {self.max_slots} slots are in use; close one or load more max_slots"
                )
            state = self._slots[free]
            state.generation += 1
            state.open, state.hold = True, hold_agent
            self._opens += 1
            generation = state.generation
            self._forced = {f for f in self._forced if f[0] != free}
        try:
            self._start(free, state, persona, sampling, seed, defer_prefill)
        except BaseException:
            with self._lock:
                state.open = False
            raise
        return SlotId(free, generation)

    def _start(
        self,
        slot: int,
        state: SlotRecord,
        persona: Persona | None,
        sampling: SamplingParams | None,
        seed: int | None,
        defer: bool = False,
    ) -> None:
        params = sampling or self.sampling
        if seed is None:
            seed = self.seed + self._opens
        self.lm.set_sampling(slot, params.model_copy(update={"seed": int(seed)}))
        self.lm.reset(slot)
        self.mimi.reset(slot)
        self.openings.drop(slot)
        self.spans.drop_slot(slot, reason="slot reopened")
        state.frame_index = 0
        state.landed = []
        state.pin = state.pin_frames = None
        state.gate = RetGate(*self.ret_gate) if self.ret_gate else None
        state.prompt_ms, state.prompt_frames = 0.0, 0
        if persona is not None:
            queue, gen = self.openings, state.generation
            write = (lambda f: queue.add(slot, gen, f)) if defer else (lambda f: self._prefill(slot, f))
            start_persona(
                persona, state, voice_codes=self.voice_codes, tokenizer=self.tokenizer,
                context=self.lm.config.context, pin_persona=self.pin_persona, write=write,
            )  # fmt: skip

    def prefill_pending(self, budget_ms: float, at_least: int = 0) -> int:
        """Write queued persona prompts (`open_slot(defer_prefill=True)`) for up to `budget_ms`, in chunks
        sized to the measured cost (the first at least `at_least` frames); returns the calls whose prompt is
        now complete. Engine thread only."""
        done = self.openings.run(budget_ms, at_least)
        for p in done:
            self._slots[p.slot].prompt_ms = p.ms
        return len(done)

    def close_slot(self, slot: int) -> None:
        """Free a slot; spans still queued for it are dropped (and logged). Closing a free slot is a no-op."""
        index = int(slot)
        self._check_index(index)
        with self._lock:
            state = self._slots[index]
            if isinstance(slot, SlotId) and slot.generation != state.generation:
                return  # an older call's handle: that call is already gone
            state.open = False
            self._forced = {f for f in self._forced if f[0] != index}
        self.openings.drop(index)
        self.spans.drop_slot(index, reason="call ended")

    def is_open(self, slot: int) -> bool:
        self._check_index(int(slot))
        with self._lock:
            return self._slots[int(slot)].open

    def prompt_stats(self, slot: int) -> tuple[int, float]:
        """(frames, milliseconds) of the persona prefill of an open slot."""
        state = self._slots[int(slot)]
        return state.prompt_frames, state.prompt_ms

    def voice_codes(self, voice: str | Path) -> torch.Tensor:
        """Mimi codes [8, P] of a voice: a `.pt` codes file, a wav, or a preset voice name (`main`, `f0`...)."""
        return resolve_voice(
            voice, card=self.lm.config.card, encode=self.mimi_model.encode_offline,
            voices_dir=self.voices_dir, preset=self.preset, model_dir=self.model_dir,
        )  # fmt: skip

    # -- spans and <ret> (thread-safe) ------------------------------------------------------------------------
    def inject(self, slot: int, reference: str, span_id: int | None = None) -> bool:
        """Queue a Context Span; it lands before the slot's next step as one prefill pass.

        Thread-safe. Returns False (and queues nothing) for an empty reference or a slot that is not open for
        this call. The reference is normalised and capped (see `duetaspan.spans.reference`), so the landed
        span's text may differ from `reference`: its `SpanLanded.span_id` is the `span_id` given here.
        """
        index = int(slot)
        self._check_index(index)
        with self._lock:
            state = self._slots[index]
            generation = state.generation
            stale = isinstance(slot, SlotId) and slot.generation != generation
            if not state.open or stale:
                log.warning("span for slot %d dropped: the call has ended: %.60r", index, reference)
                return False
        prepared = prepare_reference(reference, self.tokenizer, self.max_reference_tokens)
        if not prepared.tokens:
            log.info("empty reference for slot %d: no span", index)
            return False
        self.spans.put(
            QueuedSpan(
                index, generation, prepared.text, prepared.tokens, truncated=prepared.truncated, span_id=span_id
            )
        )
        return True

    def force_ret(self, slot: int) -> None:
        """Make the slot's next frame carry `<ret>` (id 4) as if the model sampled it. Thread-safe."""
        index = int(slot)
        self._check_index(index)
        with self._lock:
            state = self._slots[index]
            if not state.open or (isinstance(slot, SlotId) and slot.generation != state.generation):
                log.warning("force_ret for slot %d ignored: the call has ended", index)
                return
            self._forced.add((index, state.generation))

    def hold_agent(self, slot: int, on: bool = True) -> None:
        """From the slot's next step, hold its agent at silence (`on`: answer detection) or let it speak.
        A held slot hears and steps, but its context and its frames get pad text and `SILENCE_CODES` as the
        agent's, not what it samples; its `<ret>` never fires and a forced one waits. Thread-safe."""
        self._check_index(int(slot))
        with self._lock:
            state = self._slots[int(slot)]
            if state.open and getattr(slot, "generation", state.generation) == state.generation:
                state.hold = bool(on)  # applied by `step`; a closed slot or an ended call's handle is ignored

    # -- the tick -------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self, frames: dict[int, np.ndarray]) -> dict[int, FrameResult]:
        """One batched 80 ms tick for the given slots (float32[1920] caller audio each); others stay idle."""
        t0 = time.perf_counter()
        if not frames:
            return {}
        B = self.max_slots
        pcm = np.zeros((B, FRAME_SIZE), dtype=np.float32)
        rows, held = [False] * B, [False] * B
        waiting = set()
        with self._lock:
            for slot, audio in frames.items():
                index = int(slot)
                self._check_index(index)
                state = self._slots[index]
                if not state.open:
                    raise EngineError(f"slot {index} is not open; call open_slot first")
                if isinstance(slot, SlotId) and slot.generation != state.generation:
                    raise EngineError(f"slot {index}: this handle belongs to an ended call")
                audio = np.asarray(audio, dtype=np.float32).reshape(-1)
                if audio.shape[0] != FRAME_SIZE:
                    raise AudioFormatError(f"slot {index}: expected {FRAME_SIZE} samples, got {audio.shape[0]}")
                if self.openings.waiting(index):
                    waiting.add(index)  # its persona is still being written: silence, no model step
                    continue
                pcm[index] = audio
                rows[index], held[index] = True, state.hold
                self.lm.set_hold(index, state.hold)  # from this step on
        landed = {
            i: land_spans(self.lm, self.spans, i, self._slots[i], self.span_close_id, self.max_span)
            for i in range(B)
            if rows[i]
        }
        with self._lock:  # a held slot's forced <ret> waits for its release
            apply_forced_ret(self.lm, self._forced, [s.generation for s in self._slots], rows, held)

        results: dict[int, FrameResult] = {s: waiting_result(int(s), self._slots[int(s)]) for s in frames
                                            if int(s) in waiting}  # fmt: skip
        if not any(rows):
            return results
        # Encode, LM step and decode of the active bucket of slots in one pass (a CUDA graph on GPUs).
        tick = self.batch.run(pcm, rows)
        text, ret_prob, audio_out, agent = tick.text, tick.ret_prob, tick.pcm, tick.agent_codes
        ready = [rows[i] and text[i] != UNGENERATED_TOKEN_ID for i in range(B)]
        step_ms = (time.perf_counter() - t0) * 1e3

        for slot in frames:
            i = int(slot)
            if i in waiting:
                continue
            state = self._slots[i]
            token = int(text[i])
            piece = self.tokenizer.piece(token) if token >= 0 else ""
            results[slot] = agent_frame(
                i, state.frame_index, token, piece, tuple(agent[i].tolist()), audio_out[i], ready[i],
                landed[i], step_ms, float(ret_prob[i]), held[i],
            )  # fmt: skip
            is_ret = token == RET_ID
            state.frame_index += 1
            if state.gate is not None and not held[i] and state.gate.update(float(ret_prob[i]), sampled=is_ret):
                with self._lock:
                    self._forced.add((i, state.generation))
        return results

    # -- internals ------------------------------------------------------------------------------------------
    def _check_index(self, index: int) -> None:
        if not 0 <= index < self.max_slots:
            raise EngineError(f"slot {index} out of range [0, {self.max_slots})")

    def _prefill(self, slot: int, frames: torch.Tensor) -> float:
        """Write forced frames into a slot (one pass per `max_span` frames); returns milliseconds."""
        return prefill(self.lm, slot, frames, self.max_span)
