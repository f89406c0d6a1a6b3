"""The tiny Mimi: batched per-slot streaming, slot resets, idle slots, input checks, offline paths."""

from __future__ import annotations

import pytest
import torch

from duetaspan.errors import AudioFormatError, ConfigError
from duetaspan.model.mimi import CodesError, MimiConfig, MimiStream, random_mimi

FRAME = 1920

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return random_mimi("tiny", seed=3)


def _signals(batch: int, frames: int, seed: int = 0) -> torch.Tensor:
    """Distinct chirps plus noise per slot, [B, 1, frames*1920]."""
    gen = torch.Generator().manual_seed(seed)
    t = torch.arange(frames * FRAME) / 24_000
    rows = [
        0.4 * torch.sin(2 * torch.pi * (150 + 90 * b) * t * (1 + 0.5 * t))
        + 0.05 * torch.randn(t.shape, generator=gen)
        for b in range(batch)
    ]
    return torch.stack(rows).unsqueeze(1)


def _run(stream: MimiStream, pcm: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    codes, audio = [], []
    for frame in pcm.split(FRAME, dim=-1):
        c = stream.encode(frame)
        codes.append(c)
        audio.append(stream.decode(c))
    return torch.cat(codes, -1), torch.cat(audio, -1)


def test_presets_have_the_telephony_framing():
    for name in ("mimi", "tiny"):
        cfg = MimiConfig.preset(name)
        assert (cfg.frame_size, cfg.frame_rate, cfg.num_codebooks, cfg.quantizer.bins) == (
            1920,
            12.5,
            8,
            2048,
        )
    with pytest.raises(ConfigError, match="unknown Mimi preset"):
        MimiConfig.preset("huge")


def test_codes_follow_the_input(model):
    codes, audio = _run(MimiStream(model, 1), _signals(1, 6))
    assert codes.shape == (1, 8, 6) and codes.dtype == torch.long
    assert int(codes.min()) >= 0 and int(codes.max()) < 2048
    assert all(len(torch.unique(codes[0, k])) > 1 for k in range(8))
    assert audio.shape == (1, 1, 6 * FRAME) and audio.dtype == torch.float32 and torch.isfinite(audio).all()


def test_batched_streaming_equals_per_slot_streaming(model):
    pcm = _signals(3, 5)
    codes, audio = _run(MimiStream(model, 3), pcm)
    for b in range(3):
        solo_codes, solo_audio = _run(MimiStream(model, 1), pcm[b : b + 1])
        assert torch.equal(codes[b : b + 1], solo_codes)
        torch.testing.assert_close(audio[b : b + 1], solo_audio, atol=1e-5, rtol=0)


def test_multi_frame_calls_equal_frame_by_frame(model):
    pcm = _signals(2, 4)
    codes, audio = _run(MimiStream(model, 2), pcm)
    stream = MimiStream(model, 2)
    chunked = torch.cat([stream.encode(pcm[..., : 2 * FRAME]), stream.encode(pcm[..., 2 * FRAME :])], -1)
    assert torch.equal(chunked, codes)
    torch.testing.assert_close(stream.decode(codes), audio, atol=1e-5, rtol=0)


def test_reset_of_slot_0_leaves_slot_1_bit_identical_and_restarts_slot_0(model):
    pcm = _signals(2, 6, seed=1)
    plain, reset = MimiStream(model, 2), MimiStream(model, 2)
    fresh = MimiStream(model, 1)
    for t, frame in enumerate(pcm.split(FRAME, dim=-1)):
        if t == 3:
            reset.reset(0)
        c_plain, c_reset = plain.encode(frame), reset.encode(frame)
        a_plain, a_reset = plain.decode(c_plain), reset.decode(c_reset)
        assert torch.equal(c_reset[1], c_plain[1]) and torch.equal(a_reset[1], a_plain[1]), f"frame {t}"
        if t >= 3:
            c_fresh = fresh.encode(frame[:1])
            assert torch.equal(c_reset[:1], c_fresh)
            torch.testing.assert_close(a_reset[:1], fresh.decode(c_fresh), atol=1e-5, rtol=0)


def test_reset_accepts_indices_and_masks(model):
    stream = MimiStream(model, 3)
    pcm = _signals(3, 1)
    first = stream.encode(pcm)
    stream.encode(pcm)
    stream.reset(torch.tensor([True, False, True]))
    stream.reset([1])
    assert torch.equal(stream.encode(pcm), first)  # every slot is back at its start
    with pytest.raises(IndexError):
        stream.reset(3)


def test_idle_slots_keep_their_state(model):
    pcm = _signals(2, 5, seed=2)
    frames = list(pcm.split(FRAME, dim=-1))
    noise = torch.randn(2, 1, FRAME)
    stream, steady = MimiStream(model, 2), MimiStream(model, 1)
    for t, frame in enumerate(frames):
        if t == 2:  # slot 1 idles for two ticks while slot 0 runs on garbage-free audio
            stream.active = torch.tensor([True, False])
            for _ in range(2):
                idle = torch.cat([frame[:1], noise[1:]])
                stream.decode(stream.encode(idle))
            stream.active = [True, True]
        c = stream.encode(frame)
        c_steady = steady.encode(frame[1:])
        assert torch.equal(c[1:], c_steady), f"frame {t}"
        torch.testing.assert_close(stream.decode(c)[1:], steady.decode(c_steady), atol=1e-5, rtol=0)


def test_per_call_active_argument(model):
    pcm = _signals(2, 2, seed=4)
    a, b = MimiStream(model, 2), MimiStream(model, 2)
    a.encode(pcm[..., :FRAME], active=[False, True])
    b.encode(pcm[..., :FRAME])
    # slot 0 of `a` did not advance, so its next frame matches a fresh slot fed that frame
    fresh = MimiStream(model, 1)
    assert torch.equal(a.encode(pcm[..., FRAME:])[:1], fresh.encode(pcm[:1, :, FRAME:]))
    assert a.active.all()  # the argument does not change the standing mask


def test_bad_inputs_raise_clear_errors(model):
    stream = MimiStream(model, 2)
    with pytest.raises(AudioFormatError, match="multiple of 1920"):
        stream.encode(torch.zeros(2, 1, 1000))
    with pytest.raises(AudioFormatError, match="multiple of 1920"):
        stream.encode(torch.zeros(2, 1, 0))
    with pytest.raises(AudioFormatError, match="2 slots"):
        stream.encode(torch.zeros(3, 1, FRAME))
    with pytest.raises(CodesError, match=r"within \[0, 2048\)"):
        stream.decode(torch.full((2, 8, 1), 2048))
    with pytest.raises(CodesError, match="integers"):
        stream.decode(torch.zeros(2, 8, 1))
    with pytest.raises(CodesError, match="shape"):
        stream.decode(torch.zeros(1, 8, 1, dtype=torch.long))
    with pytest.raises(CodesError, match="shape"):
        stream.decode(torch.zeros(2, 9, 1, dtype=torch.long))  # the tiny Mimi has 8 codebooks in all
    assert stream.decode(torch.zeros(2, 3, 1, dtype=torch.long)).shape == (2, 1, FRAME)  # fewer is fine


def test_offline_encode_pads_and_matches_streaming(model):
    pcm = _signals(1, 3, seed=5)
    streamed, _ = _run(MimiStream(model, 1), pcm)
    assert torch.equal(model.encode_offline(pcm), streamed)
    assert model.encode_offline(pcm[0, 0, : 2 * FRAME + 5]).shape == (1, 8, 3)
    assert model.decode_offline(streamed).shape == (1, 1, 3 * FRAME)


def test_random_mimi_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(11)
    before = torch.rand(1)
    torch.manual_seed(11)
    a = random_mimi("tiny", seed=5)
    after = torch.rand(1)
    b = random_mimi("tiny", seed=5)
    assert torch.equal(before, after)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


def test_bfloat16_model_streams(model):
    half = random_mimi("tiny", seed=3, dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16
    assert half.quantizer.rvq_first.vq.layers[0]._codebook.embedding_sum.dtype == torch.float32
    stream = MimiStream(half, 2)
    codes, audio = _run(stream, _signals(2, 2))
    assert codes.shape == (2, 8, 2) and audio.dtype == torch.float32 and torch.isfinite(audio).all()
