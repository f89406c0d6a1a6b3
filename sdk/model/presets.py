"""Model presets: which LM config, weights, Mimi, tokenizer and voices make up each named model.

A preset only names files (Hugging Face repo + file name); `duetaspan.model.hub` fetches them and
`duetaspan.model.engine.DuplexEngine.load` builds the engine. `tiny-random` downloads nothing: random weights,
a tiny Mimi and a tokenizer trained in-process, for tests and demos on a CPU.

Example:
    >>> from duetaspan.model.presets import get_preset
    >>> get_preset("duetaspan-7b").lm.repo
    'mindlogicinc/context-spanning-7b'
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from duetaspan.errors import ConfigError
from duetaspan.model.convention import SPAN_CLOSE_ID

PERSONAPLEX_REPO = "nvidia/personaplex-7b-v1"
DUETASPAN_REPO = "mindlogicinc/context-spanning-7b"
MOSHIKO_REPO = "kyutai/moshiko-pytorch-bf16"
MIMI_FILE = "tokenizer-e351c8d8-checkpoint125.safetensors"
SPM_FILE = "tokenizer_spm_32k_3.model"


class FileSpec(BaseModel):
    """One file of a Hugging Face model repository."""

    model_config = ConfigDict(frozen=True)

    repo: str
    filename: str
    gated: bool = False  # the repo needs an accepted licence and HF_TOKEN


class Preset(BaseModel):
    """A named model: files to fetch (None = random init / built in) and the configs to build it with."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    lm_config: str  # an LMConfig preset name
    mimi_config: str = "mimi"  # a MimiConfig preset name
    lm: FileSpec | None = None  # None: random weights
    mimi: FileSpec | None = None
    tokenizer: FileSpec | None = None  # None: the tiny trained tokenizer
    voices_repo: str | None = None  # where `voices/NAME.pt` live
    default_voice: str | None = None
    default_text_prompt: str | None = None
    span_close_id: int = SPAN_CLOSE_ID


_PP_MIMI = FileSpec(repo=PERSONAPLEX_REPO, filename=MIMI_FILE, gated=True)
_PP_SPM = FileSpec(repo=PERSONAPLEX_REPO, filename=SPM_FILE, gated=True)

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="tiny-random",
            description="random weights, tiny LM and Mimi, trained 1024-piece tokenizer (CPU tests and demos)",
            lm_config="tiny-random",
            mimi_config="tiny",
            default_text_prompt="You enjoy having a good conversation.",
        ),
        Preset(
            name="duetaspan-7b",
            description="DuetaSpan-7B (Context Spanning): PersonaPlex fine-tune that asks for Context Spans",
            lm_config="duetaspan-7b",
            lm=FileSpec(repo=DUETASPAN_REPO, filename="context_spanning_7b.pt"),
            mimi=_PP_MIMI,
            tokenizer=_PP_SPM,
            voices_repo=DUETASPAN_REPO,
            default_voice="main",
            default_text_prompt="You are a kind and steady voice assistant who also handles everyday requests.",
        ),
        Preset(
            name="personaplex-7b",
            description="NVIDIA PersonaPlex-7B v1 (no <ret>, no spans; persona prompts)",
            lm_config="personaplex-7b",
            lm=FileSpec(repo=PERSONAPLEX_REPO, filename="model.safetensors", gated=True),
            mimi=_PP_MIMI,
            tokenizer=_PP_SPM,
            default_text_prompt="You enjoy having a good conversation.",
        ),
        Preset(
            name="moshi-7b",
            description="Kyutai Moshiko 7B (bf16): the base architecture, no prompts",
            lm_config="moshi-7b",
            lm=FileSpec(repo=MOSHIKO_REPO, filename="model.safetensors"),
            mimi=FileSpec(repo=MOSHIKO_REPO, filename=MIMI_FILE),
            tokenizer=FileSpec(repo=MOSHIKO_REPO, filename=SPM_FILE),
        ),
    )
}


def get_preset(name: str) -> Preset:
    """The preset called `name`; ConfigError lists the known ones otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model preset {name!r}; choose one of: {', '.join(PRESETS)}") from None
