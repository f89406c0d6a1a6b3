"""The `[persona]`, `[voice]`, `[model]` and `[engine]` sections: who speaks, in which voice, on which
checkpoint, and what happens when the engine fails."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from duetaspan.config.base import _Section


class PersonaConfig(_Section):
    """Who the agent is: a name and the text prompt (inline or from a file).

    Attributes:
        name: the agent's name (logs, the page, your prompt's own use).
        prompt: the text prompt the model is conditioned on: who it is, what it does, how it speaks.
        prompt_file: read the prompt from this file instead (relative to agent.toml).
    """

    name: str = "Assistant"
    prompt: str = ""
    prompt_file: Path | None = None

    def text(self) -> str:
        """The prompt text: `prompt_file`'s contents when set, else `prompt`."""
        if self.prompt_file is not None:
            return self.prompt_file.read_text(encoding="utf-8").strip()
        return self.prompt


class VoiceConfig(_Section):
    """The agent's voice: a preset voice name or a voice-prompt file (wav or precomputed embeddings).

    Attributes:
        name: a voice of the model preset (`voices/NAME.pt` in its repository, e.g. "main"); unset: the
            preset's default voice.
        path: a voice-prompt file instead: `.pt` Mimi codes or a wav of the voice (>= 0.5 s).
    """

    name: str | None = None
    path: Path | None = None


class ModelConfig(_Section):
    """Which weights to run and where: a preset, or explicit checkpoint files.

    Attributes:
        preset: "duetaspan-7b" (default), "personaplex-7b", "moshi-7b", or "tiny-random" (random weights,
            CPU demos and tests); `--model` overrides it.
        checkpoint: LM weights file (`.pt` or `.safetensors`) instead of a preset's download.
        lm_config: Moshi-style `lm_kwargs` JSON for `checkpoint` (default: `config.json` beside it, else the
            preset whose shapes match).
        mimi: Mimi codec weights (safetensors) to go with `checkpoint`.
        tokenizer: SentencePiece model to go with `checkpoint`.
        dir: a local folder with the preset's weights (`DIR/<file>` or `DIR/<repo-name>/<file>`), looked in
            before the Hugging Face Hub (`--model-dir`; default `$DUETASPAN_MODEL_DIR`).
        device: "cuda", "cuda:1", "cpu", or "auto" (CUDA when available).
        dtype: compute dtype (default: bfloat16 on CUDA, float32 on CPU).
    """

    preset: str | None = None
    checkpoint: Path | None = None
    lm_config: Path | None = None
    mimi: Path | None = None
    tokenizer: Path | None = None
    dir: Path | None = None
    device: str = "auto"
    dtype: Literal["bfloat16", "float16", "float32"] | None = None


class EngineConfig(_Section):
    """What happens when the engine fails under calls.

    Attributes:
        max_failed_steps: engine steps that may fail in a row before the engine counts as down: every call
            on it then ends (`ended_by: "engine_error"`, the caller hears an apology), `/health` turns
            unhealthy and new calls are refused. An error the engine marks fatal (a sticky CUDA error)
            takes it down at once.
        max_restarts: with `--engine-process`, fresh engine processes started after crashes over the
            server's life (the calls of the crashed one are not resumed); 0 leaves it down.
        restart_delay_s: the wait before such a restart.
    """

    max_failed_steps: int = Field(3, ge=1)
    max_restarts: int = Field(3, ge=0)
    restart_delay_s: float = Field(1.0, ge=0)


__all__ = ["EngineConfig", "ModelConfig", "PersonaConfig", "VoiceConfig"]
