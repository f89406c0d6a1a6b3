"""The LM's batched streaming generator, `LMGenerator`: B independent call slots over one `LMModel`.

It owns per-slot offsets, a KV ring of `context + max_span` cells, a token ring that applies the per-stream
delays, and per-slot sampling (`duetaspan.model.slot_sampling`). It follows Kyutai `LMGen` scheduling: the
caller's frame is consumed in the same tick it is given. `prefill` writes n forced frames in one pass.
A *held* slot (`set_hold`) hears and steps, but writes pad text and `SILENCE_CODES` as its own agent streams.

Example:
    >>> import torch
    >>> from duetaspan.model.generator import LMGenerator
    >>> from duetaspan.model.lm import LMModel
    >>> from duetaspan.model.lm_config import LMConfig
    >>> from duetaspan.model.sampling import SamplingParams
    >>> torch.manual_seed(0) and None
    >>> gen = LMGenerator(LMModel(LMConfig.preset("tiny-random")).eval(), batch_size=2, max_span=16)
    >>> gen.set_sampling(0, SamplingParams.greedy())
    >>> out = gen.step(torch.zeros(2, 8, dtype=torch.long), torch.tensor([True, False]))
    >>> out.agent_codes.shape, int(out.text[0])        # -2: slot 0 is still warming up (delay 1)
    (torch.Size([2, 8]), -2)
    >>> frames = torch.zeros(17, 5, dtype=torch.long)  # 5 forced frames: text row 0, agent 1-8, user 9-16
    >>> gen.prefill(0, frames).frames, gen.offset(0)
    (5, 6)
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from duetaspan.model.convention import N_AUDIO_CODEBOOKS, N_STREAMS, SILENT_AGENT_TOKENS, UNGENERATED_TOKEN_ID
from duetaspan.model.generator_types import GeneratorError, LMStep, PrefillStats, SlotState
from duetaspan.model.graphs import StepGraphs, graphs_disabled_by_env
from duetaspan.model.lm import LMModel
from duetaspan.model.sampling import SamplingParams
from duetaspan.model.slot_sampling import SamplingShape, SlotSampling
from duetaspan.model.transformer import attention_span


class LMGenerator:
    """B independent streaming slots over one `LMModel` (Kyutai `LMGen` scheduling, exec-mask semantics).

    Slots that are not `active` in a `step` do not advance and their state stays bit-identical. `prefill`
    writes n forced frames into one slot in a single temporal pass (persona prompts, Context Spans), exactly
    as n `force_step` calls would. The KV ring has `context + max_span` cells so that pass never evicts keys
    the mask (which still uses `context`) could see. `step` is the whole tick for direct use; a batched tick
    that owns its buffers (`duetaspan.model.batching`) uses `draw_noise` + `device_step` + `commit_steps`
    instead, keyed by `sampling_shape`.

    Example:
        >>> import torch
        >>> from duetaspan.model.generator import LMGenerator
        >>> from duetaspan.model.lm import LMModel
        >>> from duetaspan.model.lm_config import LMConfig
        >>> gen = LMGenerator(LMModel(LMConfig.preset("tiny-random")).eval(), batch_size=1, max_span=8)
        >>> gen.step(torch.zeros(1, 8, dtype=torch.long)).text.shape
        torch.Size([1])
    """

    def __init__(
        self,
        model: LMModel,
        batch_size: int,
        max_span: int = 256,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        sampling: SamplingParams | None = None,
        cuda_graph: bool = True,
    ) -> None:
        if batch_size < 1:
            raise GeneratorError(f"batch_size must be >= 1, got {batch_size}")
        if max_span < 1:
            raise GeneratorError(f"max_span must be >= 1, got {max_span}")
        if device is not None or dtype is not None:
            model = model.to(device=device, dtype=dtype)
        self.model = model.eval()
        cfg = model.config
        self.config = cfg
        self.batch_size = batch_size
        self.max_span = max_span
        self.device = model.device
        self.dtype = model.dtype
        self.capacity = cfg.context + max_span
        self._ct = cfg.max_delay + 2  # token ring width, as Kyutai's LMGen
        self._gen = 1 + cfg.gen_q  # generated streams: text + agent codebooks
        dev = self.device
        self._delays = torch.tensor(cfg.delays, dtype=torch.long, device=dev)
        self._initial = model.initial_tokens(dev)
        # Streams a forced step still samples (their next cell is the next frame's, not the forced one's).
        self._forced_write = (self._delays[: self._gen] == 0)[None]
        # A held slot's agent tokens (no text, a silent frame); the holds are a static buffer the graphs read.
        self._held = torch.tensor(SILENT_AGENT_TOKENS[: self._gen], dtype=torch.long, device=dev)
        self.hold = torch.zeros(batch_size, dtype=torch.bool, device=dev)
        self._hold_host = [False] * batch_size
        undelayed = [k for k in range(self._gen) if cfg.delays[k] == 0]
        self._prefill_dep_steps = max(undelayed)  # depformer steps needed for the undelayed agent codebooks
        self.ring = torch.full(
            (batch_size, N_STREAMS, self._ct), UNGENERATED_TOKEN_ID, dtype=torch.long, device=dev
        )
        self.offsets = torch.zeros(batch_size, dtype=torch.long, device=dev)
        self._offsets_host = [0] * batch_size
        self._ret_prob = torch.zeros(batch_size, dtype=torch.float32, device=dev)
        self.kv = model.transformer.new_kv(batch_size, self.capacity, dev, self.dtype)
        self._dep_kv = model.depformer.new_kv(batch_size, dev, self.dtype)
        self._user_delays = self._delays[self._gen :]
        # Full-batch steps replay a CUDA graph per (mask, sampling, top-k) shape; prefill stays eager.
        use_graph = cuda_graph and dev.type == "cuda" and not graphs_disabled_by_env()
        self._graphs = StepGraphs(dev) if use_graph else None
        self._sampling = SlotSampling(batch_size, cfg.text_vocab_out, cfg.card, cfg.gen_q, dev)
        for slot in range(batch_size):
            self.set_sampling(slot, sampling or SamplingParams(seed=slot))
        self.capture_step_graphs()

    def capture_step_graphs(self) -> int:
        """Capture the full-batch `step` graphs (every slot / masked, greedy / sampling) for the current
        settings; done at construction, again after changing settings, never inside a step. GPU only."""
        if self._graphs is None:
            return 0
        B, dev = self.batch_size, self.device
        codes = torch.zeros(B, N_AUDIO_CODEBOOKS, dtype=torch.long, device=dev)
        idle = torch.zeros(B, dtype=torch.bool, device=dev)
        shape = self.sampling_shape(0, B)
        with torch.inference_mode():
            self._advance_tensors(0, B, codes, False, idle, None)  # warm-up, every row masked: state unchanged
            greedy = shape.text_mode == shape.audio_mode == 0
            noises = [None] if greedy else [None, torch.ones(B, self.noise_width, device=dev)]
            return sum(
                self._graphs.capture((active is None, noise is None, shape), self._full_step, codes, active, noise)
                for active in (None, idle)
                for noise in noises
            )

    # -- slot management ----------------------------------------------------------------------------------
    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.batch_size:
            raise GeneratorError(f"slot {slot} out of range [0, {self.batch_size})")

    def offset(self, slot: int) -> int:
        """Frames this slot has consumed since its last reset (steps plus prefilled frames)."""
        self._check_slot(slot)
        return self._offsets_host[slot]

    def sampling(self, slot: int) -> SamplingParams:
        self._check_slot(slot)
        return self._sampling.params[slot]

    def set_sampling(self, slot: int, params: SamplingParams) -> None:
        """Set a slot's temperatures/top-k and reseed its generator with `params.seed`."""
        self._check_slot(slot)
        self._sampling.set(slot, params)

    def set_hold(self, slot: int, on: bool) -> None:
        """From the slot's next step, write pad text and `SILENCE_CODES` as its own agent tokens (and report
        them, with P(`<ret>`) 0) instead of its samples, or let them through again. Between steps only."""
        self._check_slot(slot)
        if self._hold_host[slot] != bool(on):
            self._hold_host[slot] = self.hold[slot] = bool(on)

    @torch.no_grad()
    def reset(self, slot: int) -> None:
        """Start the slot afresh (offset 0, empty KV and token ring, generator reseeded); others untouched."""
        self._check_slot(slot)
        self.set_hold(slot, False)
        self.offsets[slot] = 0
        self._offsets_host[slot] = 0
        self.kv.positions[slot] = -1
        self.ring[slot] = UNGENERATED_TOKEN_ID
        self._ret_prob[slot] = 0.0
        self._sampling.reseed(slot)

    def slot_state(self, slot: int) -> SlotState:
        """A detached copy of the slot's state."""
        self._check_slot(slot)
        return SlotState(
            offset=self._offsets_host[slot],
            token_ring=self.ring[slot].clone(),
            kv=self.kv.kv[:, :, slot].clone(),
            positions=self.kv.positions[slot].clone(),
            ret_prob=float(self._ret_prob[slot]),
        )

    # -- the batched tick's view (device-only stepping; see `duetaspan.model.batching`) -------------------
    @property
    def noise_width(self) -> int:
        """Exp(1) draws per slot and step: the text vocabulary, then `card` per agent codebook."""
        return self._sampling.noise_width

    def sampling_shape(self, lo: int, hi: int) -> SamplingShape:
        """The `SamplingShape` of slots [lo, hi) (cached until a `set_sampling`)."""
        return self._sampling.shape(lo, hi)

    def shape_of(self, params: Sequence[SamplingParams]) -> SamplingShape:
        """The `SamplingShape` slots with these settings would have (capture planning)."""
        return self._sampling._compute_shape(params)

    def draw_noise(self, rows: Sequence[bool], out: torch.Tensor, start: int = 0) -> bool:
        """Fill `out` [len(rows), noise_width] for slots `start + i`: Exp(1) draws from the generator of each
        executing, non-greedy slot, ones elsewhere. Returns False (and leaves `out` alone) when no slot draws.

        A slot's generator is used only when it executes, so its tokens never depend on the other calls.
        """
        return self._sampling.draw_noise(rows, out, start)

    @torch.inference_mode()
    def device_step(
        self,
        size: int,
        user_codes: torch.Tensor,
        active: torch.Tensor | None,
        noise: torch.Tensor | None,
    ) -> LMStep:
        """One step of slots [0, size) as device work only: no host sync, state updated in place, so it can
        be captured in a CUDA graph. `user_codes` [size, 8] long, `active` [size] bool (None: every slot runs;
        results are the same as an all-True mask), `noise` [size, noise_width] from `draw_noise` (None: no
        slot samples). The host mirror of the offsets is NOT advanced: call `commit_steps(rows)` after.

        >>> from duetaspan.model.lm_config import LMConfig
        >>> gen = LMGenerator(LMModel(LMConfig.preset("tiny-random")).eval(), batch_size=2, max_span=8)
        >>> out = gen.device_step(2, torch.zeros(2, 8, dtype=torch.long), None, None)
        >>> gen.commit_steps([True, True]); gen.offset(1)
        1
        """
        text, agent, shown = self._advance_tensors(0, size, user_codes, False, active, noise)
        return LMStep(text=text, agent_codes=agent, ret_prob=shown)

    def commit_steps(self, rows: Sequence[bool], start: int = 0) -> None:
        """Advance the host mirror of the offsets of slots `start + i` that executed a `device_step`."""
        offsets = self._offsets_host
        for i, run in enumerate(rows):
            if run:
                offsets[start + i] += 1

    # -- sampling (per-slot settings and draws live in `SlotSampling`) ------------------------------------
    def _depformer(
        self,
        text: torch.Tensor,
        hidden: torch.Tensor,
        lo: int,
        hi: int,
        noise: torch.Tensor | None,
        steps: int,
        shape: SamplingShape,
    ) -> torch.Tensor:
        c = self.config
        if steps == 0:
            return text.new_empty(text.shape[0], 0)
        model = self.model
        kv = model.depformer.split_kv(self._dep_kv[:, :, lo:hi])
        segs = None if noise is None else noise[:, c.text_vocab_out :].split(c.card, dim=1)
        prev, out = text, []
        for s in range(steps):
            logits = model.depformer_step(s, prev, hidden, kv).float()
            seg = None if segs is None else segs[s]
            prev = self._sampling.sample(logits, None, seg, lo, hi, False, shape)
            out.append(prev)
        return torch.stack(out, dim=1)

    # -- stepping -----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def _advance(
        self,
        lo: int,
        hi: int,
        codes: torch.Tensor,
        forced: bool,
        active: torch.Tensor | None,
        rows: list[bool],
    ) -> LMStep:
        noise = self._noise(lo, hi, rows)
        if self._graphs is not None and not forced and hi - lo == self.batch_size:
            key = (active is None, noise is None, self.sampling_shape(0, self.batch_size))
            text, agent, shown = self._graphs.run(key, self._full_step, codes, active, noise)
        else:
            text, agent, shown = self._advance_tensors(lo, hi, codes, forced, active, noise)
        self.commit_steps(rows, lo)
        return LMStep(text=text, agent_codes=agent, ret_prob=shown)

    def _noise(self, lo: int, hi: int, rows: Sequence[bool]) -> torch.Tensor | None:
        noise = torch.empty(hi - lo, self.noise_width, device=self.device)
        return noise if self.draw_noise(rows, noise, lo) else None

    def _full_step(
        self, codes: torch.Tensor, active: torch.Tensor | None, noise: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._advance_tensors(0, self.batch_size, codes, False, active, noise)

    def _advance_tensors(
        self,
        lo: int,
        hi: int,
        codes: torch.Tensor,
        forced: bool,
        active: torch.Tensor | None,
        noise: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Device work of one step of rows [lo, hi); no host syncs, state updated in place only."""
        b = hi - lo
        shape = self.sampling_shape(lo, hi)
        ring = self.ring[lo:hi]
        offsets = self.offsets[lo:hi]
        first = 0 if forced else self._gen  # a normal step writes only the user rows
        delays = self._delays if forced else self._user_delays
        sub = ring[:, first:]
        idx = ((offsets[:, None] + delays[None]) % self._ct)[:, :, None]
        if active is None:
            sub.scatter_(2, idx, codes[:, :, None])
        else:
            sub.scatter_(2, idx, torch.where(active[:, None, None], codes[:, :, None], sub.gather(2, idx)))
        held = None if forced else self.hold[lo:hi] if active is None else self.hold[lo:hi] & active
        if held is not None:  # a held slot reads silence as its own undelayed agent tokens, whatever is there
            here, mine = (offsets % self._ct)[:, None, None].expand(b, self._gen, 1), ring[:, : self._gen]
            now = (held[:, None] & self._forced_write)[:, :, None]  # text and codebook 0 of the read frame
            mine.scatter_(2, here, torch.where(now, self._held[None, :, None], mine.gather(2, here)))

        is_init = offsets[:, None] <= self._delays[None]
        if active is not None:
            is_init = is_init | ~active[:, None]
        col = ring.gather(2, (offsets % self._ct)[:, None, None].expand(b, N_STREAMS, 1))[:, :, 0]
        inputs = torch.where(is_init, self._initial[None], col)

        hidden, text_logits = self.model.forward_text(
            inputs[:, :, None], self.kv.rows(lo, hi), offsets, active, kv_len=self._kv_len(lo, hi, 1)
        )
        text, ret_prob = self._sampling.sample_text(text_logits[:, -1], lo, hi, noise, shape)
        audio = self._depformer(text, hidden, lo, hi, noise, self.config.gen_q, shape)

        step = active.long() if active is not None else 1
        offsets.copy_(offsets + step)
        gen = torch.cat([text[:, None], audio], dim=1)  # [b, 9]
        if held is not None:  # a held slot's own past (and report) is silence, not its samples, and no <ret>
            gen, ret_prob = torch.where(held[:, None], self._held[None], gen), ret_prob.masked_fill(held, 0.0)
        write = self._forced_write.expand(b, -1) if forced else torch.ones_like(gen, dtype=torch.bool)
        if active is not None:
            write = write & active[:, None]
        pos = (offsets % self._ct)[:, None, None].expand(b, self._gen, 1)
        gsub = ring[:, : self._gen]
        gsub.scatter_(2, pos, torch.where(write[:, :, None], gen[:, :, None], gsub.gather(2, pos)))

        md = self.config.max_delay
        out_idx = ((offsets[:, None] - md + self._delays[None, : self._gen]) % self._ct)[:, :, None]
        out = ring[:, : self._gen].gather(2, out_idx)[:, :, 0]
        hidden_rows = offsets <= md
        if active is not None:
            hidden_rows = hidden_rows | ~active
        out = out.masked_fill(hidden_rows[:, None], UNGENERATED_TOKEN_ID)

        prev_ret = self._ret_prob[lo:hi]
        shown = torch.zeros_like(prev_ret) if held is None else prev_ret.masked_fill(hidden_rows | held, 0.0)
        prev_ret.copy_(ret_prob if active is None else torch.where(active, ret_prob, prev_ret))
        return out[:, 0], out[:, 1:], shown

    def step(self, user_codes: torch.Tensor, active: torch.Tensor | None = None) -> LMStep:
        """Consume one caller frame per slot (`user_codes` [B, 8]) and generate the agent's frame.

        `active` [B] (bool; pass it on the CPU to avoid a device sync) selects the slots that execute; the
        others are not advanced and their state is untouched. None means every slot.
        """
        B = self.batch_size
        if tuple(user_codes.shape) != (B, N_AUDIO_CODEBOOKS):
            raise GeneratorError(
                f"user_codes must be [{B}, {N_AUDIO_CODEBOOKS}], got {tuple(user_codes.shape)}"
            )
        codes = user_codes.to(device=self.device, dtype=torch.long)
        if active is None:
            return self._advance(0, B, codes, False, None, [True] * B)
        if tuple(active.shape) != (B,):
            raise GeneratorError(f"active must be [{B}], got {tuple(active.shape)}")
        rows = [bool(a) for a in active.cpu().tolist()]
        act = active.to(device=self.device, dtype=torch.bool)
        return self._advance(0, B, codes, False, None if all(rows) else act, rows)

    def force_step(self, slot: int, frame: torch.Tensor) -> LMStep:
        """A normal step of one slot with all 17 streams forced from `frame` [17] (undelayed: text, agent
        codes, user codes of one frame). The reference for `prefill`; returns [1]-shaped tensors."""
        self._check_slot(slot)
        if tuple(frame.shape) != (N_STREAMS,):
            raise GeneratorError(f"frame must be [{N_STREAMS}], got {tuple(frame.shape)}")
        codes = frame.to(device=self.device, dtype=torch.long)[None]
        return self._advance(slot, slot + 1, codes, True, None, [True])

    @torch.inference_mode()
    def prefill(self, slot: int, frames: torch.Tensor, sample: bool = True) -> PrefillStats:
        """Write n forced frames `frames` [17, n] into `slot` in ONE temporal forward pass.

        Rows are undelayed (row 0 text, 1-8 agent codes, 9-16 user codes of each frame). Delayed streams
        keep the previous live frame's tokens at the entry boundary and carry the last forced frame into
        the next live step at the exit boundary; the post-block text and agent codebook 0 are sampled from
        the last position, so the slot ends in exactly the state n `force_step` calls leave. n <= max_span.

        `sample=False` writes a block that more forced frames will follow (a chunk of a longer prefill): the
        post-block tokens would be overwritten by the next block, so they are not sampled (no draw from the
        slot's generator, no depformer), and chunks then a last `sample=True` block leave the state one pass
        over all the frames leaves.
        """
        self._check_slot(slot)
        if frames.dim() != 2 or frames.shape[0] != N_STREAMS:
            raise GeneratorError(f"frames must be [{N_STREAMS}, n], got {tuple(frames.shape)}")
        n = frames.shape[1]
        if not 1 <= n <= self.max_span:
            raise GeneratorError(f"prefill of {n} frames: must be between 1 and max_span={self.max_span}")
        t0 = time.perf_counter()
        dev = self.device
        frames = frames.to(device=dev, dtype=torch.long)
        o = self._offsets_host[slot]
        lo, hi = slot, slot + 1
        ring = self.ring[slot]
        j = torch.arange(n, device=dev)
        src = j[None] - self._delays[:, None]  # [17, n]: which frame feeds column j of each stream
        from_frames = frames.gather(1, src.clamp(min=0))
        from_ring = ring.gather(1, ((o + j) % self._ct)[None].expand(N_STREAMS, n))
        block = torch.where(src >= 0, from_frames, from_ring)
        block = torch.where((o + j)[None] <= self._delays[:, None], self._initial[:, None], block)

        t1 = time.perf_counter()
        hidden, text_logits = self.model.forward_text(
            block[None], self.kv.rows(lo, hi), self.offsets[lo:hi], None, True, self._kv_len(lo, hi, n)
        )
        self._sync()
        t2 = time.perf_counter()
        # Final token ring = the last writes n forced steps would make; earlier ones are overwritten.
        for f in range(max(0, n - self._ct - 1), n):
            ring.scatter_(1, ((o + f + self._delays) % self._ct)[:, None], frames[:, f : f + 1])
        if sample:
            noise = self._noise(lo, hi, [True])
            shape = self.sampling_shape(lo, hi)
            text, ret_prob = self._sampling.sample_text(text_logits[:, -1], lo, hi, noise, shape)
            audio = self._depformer(text, hidden[:, -1:], lo, hi, noise, self._prefill_dep_steps, shape)
            gen = torch.cat([text[:, None], audio], 1)
            after = (o + n) % self._ct
            for k in range(gen.shape[1]):
                if self.config.delays[k] == 0:
                    ring[k, after] = gen[0, k]
            self._ret_prob[slot] = ret_prob[0]
        self.offsets[slot] += n
        self._offsets_host[slot] = o + n
        self._sync()
        t3 = time.perf_counter()
        return PrefillStats(frames=n, offset=o + n, forward_ms=(t2 - t1) * 1e3, total_ms=(t3 - t0) * 1e3)

    def _kv_len(self, lo: int, hi: int, frames: int) -> int | None:
        # Before a slot's KV ring wraps, only its first offset + frames cells hold keys (read from the host
        # mirror, so no sync). Inside a CUDA graph capture the hint is None anyway (CPU only).
        written = max(self._offsets_host[lo:hi]) + frames
        return attention_span(self.device, written, self.capacity)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
