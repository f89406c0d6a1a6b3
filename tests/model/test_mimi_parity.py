"""Parity of our Mimi with Kyutai's moshi==0.2.13 on a full-size random Mimi saved in the released layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from duetaspan.model.mimi import MimiStream, load_mimi
from duetaspan.model.mimi.checkpoint import calibrate_codebooks, released_state_dict
from tests.support import load_wav

loaders = pytest.importorskip("moshi.models.loaders")
pytestmark = [pytest.mark.parity, pytest.mark.usefixtures("one_thread")]

FRAME = 1920
N_FRAMES = 6


def _speech(name: str, start_frame: int, n: int = N_FRAMES) -> torch.Tensor:
    pcm, sr = load_wav(name)
    assert sr == 24_000
    chunk = np.ascontiguousarray(pcm[start_frame * FRAME : (start_frame + n) * FRAME])
    return torch.from_numpy(chunk).view(1, 1, -1)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """moshi's random Mimi with seeded, speech-scaled codebooks, and ours loaded strictly from its file."""
    from safetensors.torch import save_file

    with torch.random.fork_rng():
        torch.manual_seed(1234)
        ref = loaders.get_mimi(None, device="cpu")
    with torch.no_grad():
        latents = ref._encode_to_unquantized_latent(_speech("greeting", 0, 40))
    calibrate_codebooks(ref.quantizer, latents, seed=7)
    path = tmp_path_factory.mktemp("mimi") / "tokenizer-e351c8d8-checkpoint125.safetensors"
    state = released_state_dict(ref.state_dict())
    assert "encoder_transformer.transformer.layers.0.self_attn.in_proj_weight" in state
    save_file(state, str(path))
    ours = load_mimi(path, "mimi", num_codebooks=8)
    # The file also round-trips through moshi's own loader (the released-layout check from the other side).
    loaders.get_mimi(str(path), device="cpu")
    return ref, ours


def _frames(x: torch.Tensor) -> list[torch.Tensor]:
    return list(x.split(FRAME, dim=-1))


@torch.no_grad()
def test_streaming_encode_and_decode_match_moshi(models):
    ref, ours = models
    speech = _speech("greeting", 8)
    stream = MimiStream(ours, batch_size=1)
    ref_codes, our_codes = [], []
    with ref.streaming(1):
        for frame in _frames(speech):
            ref_codes.append(ref.encode(frame))
            our_codes.append(stream.encode(frame))
    ref_codes, our_codes = torch.cat(ref_codes, -1), torch.cat(our_codes, -1)
    assert our_codes.shape == (1, 8, N_FRAMES) and our_codes.dtype == torch.long
    assert torch.equal(our_codes, ref_codes)
    assert len(torch.unique(our_codes[0, 0])) > 1, "codes should follow the audio, not stick to one centroid"

    with ref.streaming(1):
        for t in range(N_FRAMES):
            want = ref.decode(ref_codes[..., t : t + 1])
            got = stream.decode(ref_codes[..., t : t + 1])
            assert got.shape == want.shape == (1, 1, FRAME)
            torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@torch.no_grad()
def test_batched_streaming_with_one_slot_reset_matches_moshi_and_a_fresh_stream(models):
    ref, ours = models
    a, b = _speech("greeting", 10), _speech("weather_sydney", 10)
    batch = torch.cat([a, b])
    stream = MimiStream(ours, batch_size=2)
    fresh = MimiStream(ours, batch_size=1)
    reset_at = 3
    with ref.streaming(2):
        for t, frame in enumerate(_frames(batch)):
            if t == reset_at:
                ref.reset_streaming(torch.tensor([False, True]))
                stream.reset(1)
            want = ref.encode(frame)
            got = stream.encode(frame)
            assert torch.equal(got, want), f"frame {t}"
            if t >= reset_at:
                assert torch.equal(got[1:], fresh.encode(frame[1:])), f"slot 1 after reset, frame {t}"

            dec_want = ref.decode(want)
            dec_got = stream.decode(want)
            torch.testing.assert_close(dec_got, dec_want, atol=1e-4, rtol=0)


@torch.no_grad()
def test_offline_encode_matches_moshi(models):
    ref, ours = models
    speech = _speech("book_table", 5, 4)[..., : 4 * FRAME - 700]  # not a whole number of frames: padded
    want = ref.encode(speech)
    got = ours.encode_offline(speech)
    assert torch.equal(got, want)
    torch.testing.assert_close(ours.decode_offline(got), ref.decode(want), atol=1e-4, rtol=0)
