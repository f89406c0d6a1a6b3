"""Persona prompts: the text prompt, the PersonaPlex frame layout, voice files (.pt codes and wav at −24 LUFS)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from duetaspan.errors import AudioFormatError, CheckpointError
from duetaspan.model.audio import integrated_loudness, write_wav
from duetaspan.model.convention import (
    PROMPT_SILENCE_FRAMES,
    SILENCE_CODES,
    SINE_CODES,
    TEXT_PAD_ID,
)
from duetaspan.model.mimi import random_mimi
from duetaspan.model.persona import (
    Persona,
    load_voice_codes,
    persona_prompt_text,
    prompt_frames,
    voice_codes_from_wav,
)


def test_prompt_text_phrasing():
    assert persona_prompt_text(Persona()) is None
    assert persona_prompt_text(Persona(text="  ")) is None
    assert persona_prompt_text(Persona(text="You are Ada.")) == "<system> You are Ada. <system>"
    assert (
        persona_prompt_text(Persona(text="<system> You are Ada. <system>"))
        == "<system> You are Ada. <system>"
    )
    p = Persona(text="You are Ada.", user_name="Sam", user_city="Sydney")
    assert (
        persona_prompt_text(p)
        == "<system> You are Ada. The user's name is Sam. The user is in Sydney. <system>"
    )
    assert persona_prompt_text(Persona(user_city="Oslo")) == "<system> The user is in Oslo. <system>"


def test_prompt_frame_layout():
    voice = torch.arange(8 * 3).view(8, 3) + 100
    frames = prompt_frames(voice, [40, 41])
    s = PROMPT_SILENCE_FRAMES
    assert frames.shape == (17, 3 + s + 2 + s)
    assert frames[0].tolist() == [TEXT_PAD_ID] * (3 + s) + [40, 41] + [TEXT_PAD_ID] * s
    assert torch.equal(frames[1:9, :3], voice)  # the voice on the agent's own audio rows
    for j in range(3, frames.shape[1]):
        assert tuple(frames[1:9, j].tolist()) == SILENCE_CODES
    for j in range(frames.shape[1]):
        assert tuple(frames[9:17, j].tolist()) == SINE_CODES  # "nobody is talking yet"
    assert prompt_frames(None, [40]).shape[1] == 2 * s + 1
    assert prompt_frames(voice, []).shape[1] == 3 + 2 * s
    assert prompt_frames(None, []).shape == (17, 0)


def test_voice_pt_files(tmp_path):
    codes = torch.randint(0, 2048, (8, 9))
    torch.save({"codes": codes}, tmp_path / "a.pt")
    assert torch.equal(load_voice_codes(tmp_path / "a.pt"), codes)
    torch.save({"codes": codes[None]}, tmp_path / "b.pt")  # a leading batch dim is accepted
    assert torch.equal(load_voice_codes(tmp_path / "b.pt"), codes)
    torch.save(
        {"codes": torch.randint(0, 2048, (16, 4))}, tmp_path / "c.pt"
    )  # both speakers: agent half kept
    assert load_voice_codes(tmp_path / "c.pt").shape == (8, 4)
    with pytest.raises(CheckpointError, match="not found"):
        load_voice_codes(tmp_path / "missing.pt")
    torch.save({"embeddings": torch.zeros(3)}, tmp_path / "pp.pt")  # PersonaPlex's weight-bound format
    with pytest.raises(CheckpointError, match="'codes'"):
        load_voice_codes(tmp_path / "pp.pt")
    torch.save({"codes": torch.full((8, 2), 4096)}, tmp_path / "range.pt")
    with pytest.raises(CheckpointError, match="within"):
        load_voice_codes(tmp_path / "range.pt")
    (tmp_path / "junk.pt").write_bytes(b"junk")
    with pytest.raises(CheckpointError, match="not a readable voice prompt"):
        load_voice_codes(tmp_path / "junk.pt")


def test_voice_wav_is_normalised_then_encoded(tmp_path):
    t = np.arange(int(16000 * 1.5)) / 16000
    loud = (0.9 * np.sin(2 * np.pi * 200 * t) * (1 + 0.5 * np.sin(5 * t))).astype(np.float32) / 1.5
    write_wav(tmp_path / "v.wav", np.stack([loud, loud], axis=1), 16000)
    seen = []

    def encode(pcm: torch.Tensor) -> torch.Tensor:
        seen.append(pcm)
        return mimi.encode_offline(pcm)

    mimi = random_mimi("tiny", seed=0)
    codes = voice_codes_from_wav(tmp_path / "v.wav", encode)
    heard = seen[0].view(-1).numpy()
    assert abs(len(heard) - 36000) <= 1  # 24 kHz mono
    assert abs(integrated_loudness(heard) - (-24.0)) < 0.5
    assert codes.shape == (8, 19) and codes.dtype == torch.long  # 1.5 s -> 18.75 frames, tail padded
    # quieter source, same shape: normalisation makes the encoder see the same level
    write_wav(tmp_path / "q.wav", np.stack([loud * 0.1] * 2, axis=1), 16000)
    seen.clear()
    voice_codes_from_wav(tmp_path / "q.wav", encode)
    assert abs(integrated_loudness(seen[0].view(-1).numpy()) - (-24.0)) < 0.5
    write_wav(tmp_path / "short.wav", loud[:1000], 16000)
    with pytest.raises(AudioFormatError, match="too short"):
        voice_codes_from_wav(tmp_path / "short.wav", encode)


def test_engine_resolves_voices(tmp_path):
    from tests.model.engine_support import engine, tiny_parts

    eng = engine(tiny_parts(tmp_path), max_slots=1, voices_dir=tmp_path / "voices")
    t = np.arange(24000) / 24000
    write_wav(tmp_path / "me.wav", (0.2 * np.sin(2 * np.pi * 150 * t)).astype(np.float32), 24000)
    (tmp_path / "voices").mkdir()
    torch.save({"codes": torch.randint(0, 2048, (8, 4))}, tmp_path / "voices" / "ada.pt")
    assert eng.voice_codes(tmp_path / "me.wav").shape == (8, 13)
    assert eng.voice_codes("ada").shape == (8, 4)
    slot = eng.open_slot(Persona(text="You are Ada.", voice=tmp_path / "me.wav"))
    assert eng.prompt_stats(slot)[0] == 13 + 2 * PROMPT_SILENCE_FRAMES + len(
        eng.tokenizer.encode("<system> You are Ada. <system>")
    )
    with pytest.raises(Exception, match="no voice presets"):
        eng.voice_codes("nobody")
