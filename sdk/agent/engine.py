"""Which engine an agent runs and how it is loaded: in this process (`load_engine`) or described for an
engine process (`engine_spec`), both from `[model]` with the same model, files, device and slots."""

from __future__ import annotations

from typing import Any

from duetaspan.config import EngineConfig, ModelConfig

DEFAULT_MODEL = "duetaspan-7b"


def resolve_device(device: str | None) -> str:
    """`auto` (or unset) means the first GPU when torch sees one, else the CPU."""
    if device and device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def engine_spec(
    m: ModelConfig, *, max_slots: int, seed: int | None, engine: EngineConfig | None = None
) -> Any:
    """What an engine process loads: the same model, files, device and slots as `load_engine`."""
    from duetaspan.pipeline.engine_process import EngineProcessSpec

    device = resolve_device(m.device)
    return EngineProcessSpec(
        model=m.preset or DEFAULT_MODEL,
        device=device,
        dtype=m.dtype,
        max_slots=max_slots,
        seed=seed or 0,
        checkpoint=str(m.checkpoint) if m.checkpoint else None,
        lm_config=str(m.lm_config) if m.lm_config else None,
        mimi=str(m.mimi) if m.mimi else None,
        tokenizer=str(m.tokenizer) if m.tokenizer else None,
        model_dir=str(m.dir) if m.dir else None,
        max_failed_steps=(engine or EngineConfig()).max_failed_steps,
    )


def load_engine(m: ModelConfig, *, max_slots: int, seed: int | None, sampling: Any) -> Any:
    """A `DuplexEngine` in this process (blocking: the agent runs it in an executor)."""
    from duetaspan.model.engine import DuplexEngine

    kw: dict[str, Any] = {"max_slots": max_slots, "device": resolve_device(m.device)}
    if m.dtype:
        import torch

        kw["dtype"] = getattr(torch, m.dtype)
    if seed is not None:
        kw["seed"] = seed
    if sampling is not None:  # the calls' sampling is the engine's default: its graphs exist at start
        kw["sampling"] = sampling
    if m.checkpoint is not None:
        return DuplexEngine.from_files(
            checkpoint=m.checkpoint, lm_config=m.lm_config, mimi=m.mimi, tokenizer=m.tokenizer, **kw
        )
    return DuplexEngine.load(m.preset or DEFAULT_MODEL, model_dir=m.dir, **kw)


__all__ = ["DEFAULT_MODEL", "engine_spec", "load_engine", "resolve_device"]
