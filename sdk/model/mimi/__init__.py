"""The Mimi neural audio codec (24 kHz <-> 12.5 Hz codes) on plain torch: streaming per-slot codec and loading."""

from duetaspan.model.mimi.checkpoint import load_mimi, random_mimi, save_mimi
from duetaspan.model.mimi.codec import CodesError, MimiModel
from duetaspan.model.mimi.config import MimiConfig, QuantizerConfig, SeanetConfig, TransformerConfig
from duetaspan.model.mimi.stream import MimiStream

__all__ = [
    "CodesError",
    "MimiConfig",
    "MimiModel",
    "MimiStream",
    "QuantizerConfig",
    "SeanetConfig",
    "TransformerConfig",
    "load_mimi",
    "random_mimi",
    "save_mimi",
]
