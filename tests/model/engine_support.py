"""Small shared builders for the engine tests: tiny parts built once, fresh engines per test."""

from __future__ import annotations

import numpy as np
import torch

from duetaspan.model.engine import DuplexEngine
from duetaspan.model.lm import LMModel
from duetaspan.model.lm_config import LMConfig
from duetaspan.model.mimi import random_mimi
from duetaspan.model.slots import SamplingParams
from duetaspan.model.tokenizer import TextTokenizer

GREEDY = SamplingParams(temperature=0.0, text_temperature=0.0)


def tiny_parts(tmp_dir, context: int | None = None, seed: int = 0):
    cfg = LMConfig.preset("tiny-random")
    if context is not None:
        cfg = LMConfig.from_lm_kwargs({**cfg.to_lm_kwargs(), "context": context})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        lm = LMModel(cfg).eval()
    return lm, random_mimi("tiny", seed=seed), TextTokenizer.tiny(tmp_dir)


def engine(parts, **kw) -> DuplexEngine:
    lm, mimi, tok = parts
    kw.setdefault("max_slots", 2)
    kw.setdefault("max_span", 64)
    return DuplexEngine(lm, mimi, tok, **kw)


def caller_audio(n_frames: int, seed: int = 0) -> np.ndarray:
    """[n, 1920] float32 noise-like caller frames (deterministic)."""
    rng = np.random.default_rng(seed)
    t = np.arange(n_frames * 1920) / 24000
    pcm = 0.2 * np.sin(2 * np.pi * (180 + 40 * np.sin(t)) * t) + 0.05 * rng.standard_normal(t.shape)
    return pcm.astype(np.float32).reshape(n_frames, 1920)
