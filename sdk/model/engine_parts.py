"""Building the engine's parts, an `LMModel`, a `MimiModel` and a `TextTokenizer`, from a preset or from files.

`DuplexEngine.load` and `DuplexEngine.from_files` call these: weights come from a model folder or the Hugging
Face Hub (`duetaspan.model.hub`), or are seeded random ones built directly on the target device.

Example:
    >>> from duetaspan.model.engine_parts import preset_parts
    >>> from duetaspan.model.presets import get_preset
    >>> lm, mimi, tokenizer = preset_parts(get_preset("tiny-random"), device="cpu", seed=0)
    >>> lm.config.gen_q, mimi.num_codebooks
    (8, 8)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from duetaspan.errors import CheckpointError, ConfigError
from duetaspan.model.lm import LMModel
from duetaspan.model.lm_config import LMConfig
from duetaspan.model.mimi import MimiConfig, MimiModel, load_mimi, random_mimi
from duetaspan.model.presets import Preset
from duetaspan.model.tokenizer import TextTokenizer


def preset_parts(
    preset: Preset,
    *,
    device: str | torch.device = "cpu",
    seed: int = 0,
    dtype: torch.dtype | None = None,
    model_dir: str | Path | None = None,
    random_weights: bool = False,
    token: str | None = None,
) -> tuple[LMModel, MimiModel, TextTokenizer]:
    """The parts of a preset: its files (downloaded if needed), or seeded random weights and the tiny tokenizer
    (`random_weights=True`, or a preset without LM weights)."""
    # Imported here: the Hub client is only needed when weights are fetched.
    from duetaspan.model.hub import fetch_preset_files

    device = torch.device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    if random_weights or preset.lm is None:
        lm = random_lm(LMConfig.preset(preset.lm_config), seed, device, dtype)
        mimi = random_mimi(preset.mimi_config if preset.mimi is None else "mimi", seed=seed, device=device)
        tokenizer = TextTokenizer.tiny()
    else:
        from duetaspan.model.checkpoint import load_lm

        files = fetch_preset_files(preset, model_dir=model_dir, token=token)
        assert files.lm is not None and files.mimi is not None and files.tokenizer is not None
        tokenizer = TextTokenizer.from_file(files.tokenizer)
        lm = load_lm(files.lm, preset.lm_config, device=device, dtype=dtype)
        mimi = load_mimi(files.mimi, preset.mimi_config, device=device)
    return lm, mimi, tokenizer


def file_parts(
    checkpoint: str | Path,
    lm_config: str | Path | LMConfig | None,
    mimi: str | Path | None,
    tokenizer: str | Path | None,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    mimi_config: str | MimiConfig | None = None,
) -> tuple[LMModel, MimiModel, TextTokenizer]:
    """The parts from explicit files (see `DuplexEngine.from_files`); a tokenizer larger than the LM's text
    vocabulary is refused, since it belongs to another checkpoint."""
    from duetaspan.model.checkpoint import load_lm

    if mimi is None or tokenizer is None:
        raise ConfigError("from_files needs the Mimi checkpoint (mimi=) and the tokenizer (tokenizer=)")
    device = torch.device(device)
    dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    text = TextTokenizer.from_file(tokenizer)
    config: Any = lm_config
    if isinstance(lm_config, str | Path):
        config = LMConfig.from_json(lm_config)
    lm = load_lm(checkpoint, config, device=device, dtype=dtype)
    if lm.config.text_card < text.vocab_size:
        raise CheckpointError(
            f"{tokenizer}: {text.vocab_size} pieces but the LM's text_card is {lm.config.text_card}; "
            "this tokenizer does not belong to this checkpoint"
        )
    codec = load_mimi_any(Path(mimi), mimi_config, device)
    return lm, codec, text


def random_lm(config: LMConfig, seed: int, device: torch.device, dtype: torch.dtype) -> LMModel:
    """An LMModel with seeded random weights, built on its device (a 7B never passes through host memory in
    float32); the global RNGs are left untouched."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        model = LMModel(config, device=device, dtype=dtype)
    return model.eval()


def load_mimi_any(path: Path, config: str | MimiConfig | None, device: torch.device) -> MimiModel:
    """`config` None tries the released `mimi` architecture, then `tiny`; the first error is the one raised."""
    if config is not None:
        return load_mimi(path, config, device=device)
    first: CheckpointError | None = None
    for name in ("mimi", "tiny"):
        try:
            return load_mimi(path, name, device=device)
        except CheckpointError as exc:
            first = first or exc
    assert first is not None
    raise first
