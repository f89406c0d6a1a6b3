"""Persona prompts: a voice prompt and a text prompt written into a slot's streams before the call starts.

PersonaPlex's layout, written by the engine in ONE prefill pass instead of one step per frame:
voice frames (agent rows = the voice's Mimi codes, text PAD), 6 silence frames, one frame per text-prompt token
(`<system> … <system>`), 6 silence frames; the agent rows hold `SILENCE_CODES` outside the voice and the user
rows hold `SINE_CODES` ("nobody is talking yet") throughout. A voice is `voices/NAME.pt` holding
`{"codes": LongTensor[8, P]}` or any wav, which is resampled to 24 kHz, normalised to −24 LUFS and Mimi-encoded.

Example:
    >>> p = Persona(text="You are Ada, a booking assistant.", user_name="Sam", user_city="Sydney")
    >>> persona_prompt_text(p)
    "<system> You are Ada, a booking assistant. The user's name is Sam. The user is in Sydney. <system>"
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from duetaspan.errors import AudioFormatError, CheckpointError, ConfigError
from duetaspan.model.audio import normalize_loudness, read_wav, to_model_rate
from duetaspan.model.convention import (
    AGENT_ROWS,
    AUDIO_CARD,
    N_AUDIO_CODEBOOKS,
    SAMPLE_RATE,
    TEXT_PAD_ID,
    wrap_system_prompt,
)
from duetaspan.model.presets import Preset
from duetaspan.spans.block import persona_text_frames, placeholder_frames

MIN_VOICE_SECONDS = 0.5


@dataclass(frozen=True)
class Persona:
    """Who the agent is: a text prompt, a voice (preset name, `.pt` codes or a wav) and what it knows of the user.

    >>> Persona(text="You enjoy having a good conversation.", voice="main")
    Persona(text='You enjoy having a good conversation.', voice='main', user_name=None, user_city=None)
    """

    text: str | None = None
    voice: str | Path | None = None
    user_name: str | None = None
    user_city: str | None = None


def persona_prompt_text(persona: Persona) -> str | None:
    """The `<system> … <system>` text prompt, with the user's name and city in the corpus phrasing; None if empty."""
    parts = [persona.text.strip()] if persona.text and persona.text.strip() else []
    if persona.user_name:
        parts.append(f"The user's name is {persona.user_name.strip()}.")
    if persona.user_city:
        parts.append(f"The user is in {persona.user_city.strip()}.")
    if not parts:
        return None
    return wrap_system_prompt(" ".join(parts))


def load_voice_codes(path: str | Path, card: int = AUDIO_CARD) -> torch.Tensor:
    """Read a `voices/NAME.pt` file: `{"codes": LongTensor[8, P]}` (a leading batch dim of 1 is accepted)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"voice prompt not found: {path}")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several unrelated types for a bad pickle
        raise CheckpointError(
            f"{path}: not a readable voice prompt ({exc.__class__.__name__}: {exc})"
        ) from exc
    codes = data.get("codes") if isinstance(data, dict) else None
    if not isinstance(codes, torch.Tensor):
        raise CheckpointError(f"{path}: expected a dict with a 'codes' tensor [8, P]")
    if codes.dim() == 3 and codes.shape[0] == 1:
        codes = codes[0]
    if codes.dim() != 2 or codes.shape[0] < N_AUDIO_CODEBOOKS or codes.shape[1] < 1:
        raise CheckpointError(f"{path}: 'codes' must be [8, P], got {list(codes.shape)}")
    codes = codes[:N_AUDIO_CODEBOOKS].long()
    if int(codes.min()) < 0 or int(codes.max()) >= card:
        raise CheckpointError(f"{path}: codes must be within [0, {card})")
    return codes


def voice_codes_from_wav(path: str | Path, encode: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Encode a wav voice prompt: 24 kHz mono, −24 LUFS, then `encode` ([1, 1, N] float -> [1, 8, P] codes).

    The audio goes in on the CPU (`encode` moves it to its model); the codes stay on the model's device, so a
    voice prompt never makes a round trip through the host.
    """
    pcm, rate = read_wav(path)
    mono = to_model_rate(pcm, rate)
    if len(mono) < MIN_VOICE_SECONDS * SAMPLE_RATE:
        raise AudioFormatError(
            f"{path}: voice prompt of {len(mono) / SAMPLE_RATE:.2f} s is too short (>= 0.5 s)"
        )
    mono = normalize_loudness(mono, SAMPLE_RATE)
    codes = encode(torch.from_numpy(np.ascontiguousarray(mono)).view(1, 1, -1))
    return codes[0, :N_AUDIO_CODEBOOKS].long()


def resolve_voice(
    voice: str | Path,
    *,
    card: int,
    encode: Callable[[torch.Tensor], torch.Tensor],
    voices_dir: Path | None = None,
    preset: Preset | None = None,
    model_dir: str | Path | None = None,
) -> torch.Tensor:
    """Mimi codes [8, P] of a voice: a `.pt` codes file, a wav (encoded with `encode`), or a preset voice name
    (`main`, `f0`...) looked up as `voices_dir/NAME.pt`, then in the preset's voice repository."""
    path = Path(voice)
    if path.suffix.lower() == ".pt" or (path.is_file() and path.suffix.lower() != ".wav"):
        return load_voice_codes(path, card)
    if path.suffix.lower() == ".wav":
        if not path.is_file():
            raise AudioFormatError(f"voice prompt not found: {path}")
        return voice_codes_from_wav(path, encode)
    name = str(voice)
    if voices_dir is not None and (voices_dir / f"{name}.pt").is_file():
        return load_voice_codes(voices_dir / f"{name}.pt", card)
    if preset is None or preset.voices_repo is None:
        raise ConfigError(f"voice {name!r}: not a file, and this model has no voice presets")
    # Imported here: the Hub client is only needed for preset voices.
    from duetaspan.model.hub import fetch_voice

    return load_voice_codes(fetch_voice(preset, name, model_dir), card)


def prompt_frames(voice_codes: torch.Tensor | None, text_tokens: Sequence[int]) -> torch.Tensor:
    """The whole persona prefix `[17, n]`: voice frames, silence, text frames, silence (user rows = sine).

    With neither a voice nor text the result has no frames. The text section is `persona_text_frames`, the same
    block persona pinning re-injects later. The frames live where the voice codes do (the CPU without them).
    """
    parts: list[torch.Tensor] = []
    device = voice_codes.device if voice_codes is not None else torch.device("cpu")
    if voice_codes is not None and voice_codes.shape[1] > 0:
        voice = placeholder_frames([TEXT_PAD_ID] * voice_codes.shape[1]).to(device)
        voice[AGENT_ROWS] = voice_codes.long()
        parts.append(voice)
    if parts or text_tokens:
        # a voice alone still gets both silence runs
        parts.append(persona_text_frames(text_tokens).to(device))
    if not parts:
        return placeholder_frames([])
    return torch.cat(parts, dim=1)
