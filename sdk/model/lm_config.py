"""The language model's architecture configuration (`LMConfig`) and its named presets.

`LMConfig` mirrors the `lm_kwargs` dictionary Kyutai's moshi loaders use, so a checkpoint's `config.json`
reads as-is; values this implementation cannot run (layer scale, conditioners, LoRA, ...) are rejected with a
`ConfigError` naming the field instead of being silently ignored.

Example:
    >>> from duetaspan.model.lm_config import LMConfig
    >>> cfg = LMConfig.preset("personaplex-7b")
    >>> (cfg.dim, cfg.dep_q, cfg.ffn_hidden, cfg.depformer_ffn_hidden)
    (4096, 16, 11264, 2816)
    >>> LMConfig.from_lm_kwargs({**cfg.to_lm_kwargs(), "dep_q": 8}).dep_q
    8
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from duetaspan.errors import ConfigError
from duetaspan.model.convention import (
    AUDIO_CARD,
    CONTEXT_FRAMES,
    DELAYS,
    N_AUDIO_CODEBOOKS,
    TEXT_CARD,
    TEXT_PAD_ID,
)

# moshi kwargs that only have one value we can run; anything else is a ConfigError naming the key.
_FIXED_KWARGS: dict[str, Any] = {
    "causal": True,
    "layer_scale": None,
    "depformer_layer_scale": None,
    "gating": "silu",
    "depformer_gating": "silu",
    "positional_embedding": "rope",
    "kv_repeat": 1,
    "depformer_kv_repeat": 1,
    "demux_second_text_stream": False,
    "demux_second_stream": False,
    "norm_emb": False,
    "bias_proj": False,
    "depformer_norm": None,
    "depformer_weights_per_step_schedule": None,
    "depformer_low_rank_embeddings": None,
    "extra_heads_num_heads": 0,
    "conditioners": None,
    "fuser": None,
    "lora": False,
    "cross_attention": False,
}
# moshi kwargs with no effect on inference here (moshi itself overrides or ignores them).
_IGNORED_KWARGS = frozenset(
    {"depformer_context", "depformer_max_period", "depformer_causal", "extra_heads_dim", "lora_rank",
     "lora_scaling"}
)  # fmt: skip
# repository-level keys of a Kyutai-style config.json that are not LM architecture.
_REPO_KEYS = frozenset(
    {"moshi_name", "mimi_name", "mimi_config_name", "tokenizer_name", "lora_name", "model_type",
     "lm_gen_config", "tts_config", "stt_config", "model_id"}
)  # fmt: skip


def _gated_hidden(dim: int, dim_feedforward: int) -> int:
    # Moshi's ActivationGating: 21/8 of dim when the FFN is exactly 4x, else two thirds of it.
    if dim_feedforward == 4 * dim:
        return (21 * dim) // 8
    return (2 * dim_feedforward) // 3


class LMConfig(BaseModel):
    """Architecture of the temporal + depth transformer (Moshi `lm_kwargs` field names)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dim: int
    num_heads: int
    num_layers: int
    hidden_scale: float
    context: int = CONTEXT_FRAMES
    max_period: float = 10_000.0
    text_card: int = TEXT_CARD
    text_card_out: int | None = None
    card: int = AUDIO_CARD
    n_q: int = 2 * N_AUDIO_CODEBOOKS
    dep_q: int = N_AUDIO_CODEBOOKS
    depformer_dim: int
    depformer_num_heads: int
    depformer_num_layers: int
    depformer_dim_feedforward: int | None = None
    depformer_multi_linear: bool = True
    depformer_weights_per_step: bool = True
    depformer_pos_emb: Literal["none"] = "none"
    delays: tuple[int, ...] = DELAYS
    existing_text_padding_id: int = TEXT_PAD_ID
    existing_text_end_padding_id: int = 0
    norm: Literal["rms_norm_f32", "rms_norm"] = "rms_norm_f32"

    @field_validator("dim", "num_heads", "num_layers", "context", "text_card", "card", "depformer_dim")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v <= 0:
            raise ValueError("must be > 0")
        return v

    @field_validator("depformer_weights_per_step")
    @classmethod
    def _per_step(cls, v: bool) -> bool:
        if not v:
            raise ValueError(
                "only depformer_weights_per_step=True is supported (as in every Moshi checkpoint)"
            )
        return v

    @model_validator(mode="after")
    def _consistent(self) -> LMConfig:
        if len(self.delays) != self.n_q + 1:
            raise ValueError(f"delays: expected n_q + 1 = {self.n_q + 1} values, got {len(self.delays)}")
        if self.n_q != 2 * N_AUDIO_CODEBOOKS:
            raise ValueError(f"n_q: this runtime needs {2 * N_AUDIO_CODEBOOKS} audio streams, got {self.n_q}")
        if self.dep_q < self.gen_q:
            raise ValueError(f"dep_q: must be >= {self.gen_q} (the agent codebooks), got {self.dep_q}")
        if self.dim % self.num_heads or (self.dim // self.num_heads) % 2:
            raise ValueError(f"num_heads: dim {self.dim} must split into even-sized heads")
        if self.depformer_dim % self.depformer_num_heads:
            raise ValueError(f"depformer_num_heads: must divide depformer_dim {self.depformer_dim}")
        if any(d < 0 for d in self.delays) or self.delays[0] != 0:
            raise ValueError("delays: must be >= 0, with 0 for the text stream")
        return self

    # -- derived sizes ------------------------------------------------------------------------------------
    @property
    def gen_q(self) -> int:
        """Codebooks the depformer generates at run time (the agent's; user codes always come from the caller)."""
        return N_AUDIO_CODEBOOKS

    @property
    def num_streams(self) -> int:
        return self.n_q + 1

    @property
    def max_delay(self) -> int:
        return max(self.delays)

    @property
    def norm_eps(self) -> float:
        return 1e-8 if self.norm == "rms_norm_f32" else 1e-5

    @property
    def ffn_hidden(self) -> int:
        return _gated_hidden(self.dim, int(self.hidden_scale * self.dim))

    @property
    def depformer_ffn_hidden(self) -> int:
        ff = self.depformer_dim_feedforward
        if ff is None:
            ff = int(self.hidden_scale * self.depformer_dim)
        return _gated_hidden(self.depformer_dim, ff)

    @property
    def text_vocab_out(self) -> int:
        return self.text_card if self.text_card_out is None else self.text_card_out

    # -- construction -------------------------------------------------------------------------------------
    @classmethod
    def from_lm_kwargs(cls, kwargs: dict[str, Any]) -> LMConfig:
        """Build from a Moshi-style `lm_kwargs` dict; unknown or unsupported fields raise `ConfigError`."""
        if not isinstance(kwargs, dict):
            raise ConfigError(f"lm_kwargs must be a JSON object, got {type(kwargs).__name__}")
        fields: dict[str, Any] = {}
        for key, value in kwargs.items():
            if key in _FIXED_KWARGS:
                if value != _FIXED_KWARGS[key] and not (key in ("conditioners", "fuser") and not value):
                    raise ConfigError(
                        f"lm_kwargs field {key!r}={value!r} is not supported; only {_FIXED_KWARGS[key]!r} is"
                    )
            elif key in _IGNORED_KWARGS:
                continue
            else:
                fields[key] = value
        fields.setdefault("depformer_num_heads", fields.get("num_heads"))
        fields.setdefault("depformer_num_layers", fields.get("num_layers"))
        try:
            return cls(**fields)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'lm_kwargs'}: {err['msg']}" for err in exc.errors()
            )
            raise ConfigError(f"invalid LM config: {problems}") from None

    @classmethod
    def from_json(cls, path: str | Path) -> LMConfig:
        """Read a `config.json` (flat `lm_kwargs`, Kyutai repo-style, or `{"lm_kwargs": {...}}`)."""
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: LM config file not found") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from None
        if isinstance(raw, dict) and isinstance(raw.get("lm_kwargs"), dict):
            raw = raw["lm_kwargs"]
        if isinstance(raw, dict):
            raw = {k: v for k, v in raw.items() if k not in _REPO_KEYS}
        try:
            return cls.from_lm_kwargs(raw)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None

    @classmethod
    def preset(cls, name: str) -> LMConfig:
        """A named architecture: `duetaspan-7b`, `personaplex-7b`, `moshi-7b` or `tiny-random`."""
        try:
            kwargs = _PRESETS[name]
        except KeyError:
            raise ConfigError(f"unknown LM preset {name!r}; choose one of {sorted(_PRESETS)}") from None
        return cls.from_lm_kwargs(kwargs)

    @staticmethod
    def preset_names() -> tuple[str, ...]:
        return tuple(_PRESETS)

    def to_lm_kwargs(self) -> dict[str, Any]:
        """The Moshi `lm_kwargs` equivalent (feeds `moshi.models.lm.LMModel(**kwargs)` in parity tests)."""
        out = self.model_dump()
        out["delays"] = list(self.delays)
        out.update(
            causal=True, layer_scale=None, gating="silu", positional_embedding="rope",
            depformer_gating="silu", depformer_layer_scale=None, depformer_context=self.dep_q,
            depformer_max_period=self.max_period,
        )  # fmt: skip
        return out


_7B: dict[str, Any] = {
    "dim": 4096,
    "text_card": TEXT_CARD,
    "existing_text_padding_id": TEXT_PAD_ID,
    "n_q": 16,
    "dep_q": 8,
    "card": AUDIO_CARD,
    "num_heads": 32,
    "num_layers": 32,
    "hidden_scale": 4.125,
    "causal": True,
    "layer_scale": None,
    "context": CONTEXT_FRAMES,
    "max_period": 10000,
    "gating": "silu",
    "norm": "rms_norm_f32",
    "positional_embedding": "rope",
    "depformer_dim": 1024,
    "depformer_dim_feedforward": int(4.125 * 1024),
    "depformer_num_heads": 16,
    "depformer_num_layers": 6,
    "depformer_layer_scale": None,
    "depformer_multi_linear": True,
    "depformer_context": 8,
    "depformer_max_period": 10000,
    "depformer_gating": "silu",
    "depformer_pos_emb": "none",
    "depformer_weights_per_step": True,
    "delays": list(DELAYS),
}

_PRESETS: dict[str, dict[str, Any]] = {
    "moshi-7b": _7B,
    # PersonaPlex and its DuetaSpan fine-tune ship 16 depformer steps (8 of them predict the user, unused).
    "personaplex-7b": {**_7B, "dep_q": 16},
    "duetaspan-7b": {**_7B, "dep_q": 16},
    # Small random-weight model for tests and CPU demos; text_card matches the tiny test tokenizer.
    "tiny-random": {
        **_7B,
        "dim": 128,
        "num_heads": 4,
        "num_layers": 2,
        "text_card": 1024,
        "depformer_dim": 64,
        "depformer_num_heads": 4,
        "depformer_num_layers": 2,
        "depformer_dim_feedforward": int(4.125 * 64),
    },
}
