"""`benchmarks/answer_detection.py` on a small batch made by `benchmarks/answer_corpus.py` (espeak-ng and sox,
through 8 kHz mu-law): the generator is deterministic for its seed, and the scoring reads every class and
prints its figures. The figures themselves are the benchmark's to report (docs/outbound.md), not asserted."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.support import REPO_ROOT, benchmark_module

pytestmark = pytest.mark.skipif(
    not (shutil.which("espeak-ng") and shutil.which("sox")), reason="espeak-ng and sox make the corpus"
)


_module = benchmark_module


def test_a_small_batch_is_reproducible_and_scored(tmp_path):
    corpus, bench = _module("answer_corpus"), _module("answer_detection")
    counts = {kind: 1 for kind in corpus.COUNTS} | {"person": 2, "voicemail": 2}
    items = corpus.generate(tmp_path / "a", "heldout", seed=5, counts=counts)
    corpus.generate(tmp_path / "b", "heldout", seed=5, counts=counts)
    assert corpus.corpus_hash(tmp_path / "a") == corpus.corpus_hash(tmp_path / "b")
    assert len(items) == sum(counts.values())
    assert [it.beep_at_s is not None for it in items if it.kind == "voicemail"] == [True, False]
    figures = bench.score(tmp_path / "a")
    assert set(figures["classes"]) == set(corpus.COUNTS)
    assert figures["people"] == 2 and figures["beeps"]["present"] >= 1
    text = bench.report(figures)
    assert "people called machines" in text and "beeps:" in text
    # each held-out batch's committed seed is the one the generator uses for it
    for batch in [b for b in corpus.SEEDS if b != "tuning"]:
        name = "answer_heldout.json" if batch == "heldout" else f"answer_{batch}.json"
        committed = json.loads((REPO_ROOT / "benchmarks" / name).read_text())
        assert committed["seed"] == corpus.SEEDS[batch] and len(committed["sha256"]) == 64, batch
    # --asr: a transcript that says "leave a message" overturns the people's `human` (source asr, counted)
    heard = []
    asr = bench.score(tmp_path / "a", lambda pcm, rate: heard.append(len(pcm) / rate) or "Please leave a message.")
    assert asr["asr_revised"] >= 2 and asr["human_as_machine"] == 2 and "machine_with_asr_s" in asr
    assert heard and all(0 < s <= 4.0 for s in heard)  # what was heard up to the first verdict, at most 4 s


def test_the_newest_batches_voices_are_new_voices_and_the_ninths_one_was_not(tmp_path):
    """espeak-ng ignores a variant it has no file for (the names are case-sensitive) and any after `en-gb`: the
    voice is then its plain one. The tenth to twelfth held-out batches' variants each change the voice; the ninth's
    `en+Steph2` did not (plain `en`, the tuning batch's `en-gb`), as its committed json now says."""
    corpus = _module("answer_corpus")
    for voice in [v for b in ("heldout10", "heldout11", "heldout12") for v in corpus.BATCHES[b]["voices"]]:
        assert corpus.changes_voice(voice, tmp_path), voice
    assert not corpus.changes_voice("en+Steph2", tmp_path) and corpus.changes_voice("en+steph2", tmp_path)
    assert not corpus.changes_voice("en-gb+m3", tmp_path) and corpus.changes_voice("en+m3", tmp_path)
    assert "correction" in json.loads((REPO_ROOT / "benchmarks" / "answer_heldout9.json").read_text())
