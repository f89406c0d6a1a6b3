"""The agent text tokenizer: SentencePiece with the convention's special ids, plus a tiny trainable model.

The real checkpoints use PersonaPlex's `tokenizer_spm_32k_3.model`. For the `tiny-random` preset (no downloads)
`tiny_tokenizer()` trains a 1024-piece SentencePiece model in-process on a built-in English corpus, with
byte fallback and unk 0 / bos 1 / eos 2 / pad 3, so that byte pieces start at id 4 exactly like the real model:
`<0x00>` is `<ret>` (4), `<0x08>` the span open (12), `<0x09>` the span close (13). Training is deterministic and
cached under the user cache directory.

Example:
    >>> tok = TextTokenizer.tiny()                                # doctest: +SKIP
    >>> ids = tok.encode("What is the weather in Sydney?")        # doctest: +SKIP
    >>> tok.decode(ids)                                           # doctest: +SKIP
    'What is the weather in Sydney?'
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

from duetaspan.errors import CheckpointError
from duetaspan.model.convention import (
    NON_TEXT_IDS,
    RET_ID,
    SPAN_CLOSE_ID,
    SPAN_OPEN_ID,
    TEXT_BOS_ID,
    TEXT_EOS_ID,
    TEXT_EPAD_ID,
    TEXT_PAD_ID,
)

log = logging.getLogger(__name__)

TINY_VOCAB_SIZE = 1024
_TINY_FORMAT_VERSION = "1"
_WORD_BOUNDARY = "\u2581"  # SentencePiece's "▁"


class TextTokenizer:
    """A SentencePiece text tokenizer that knows which ids are stream signals rather than words.

    >>> tok = TextTokenizer.from_file("tokenizer_spm_32k_3.model")   # doctest: +SKIP
    >>> tok.piece(tok.encode("hello")[0])                             # doctest: +SKIP
    ' hello'
    """

    def __init__(self, processor: spm.SentencePieceProcessor, path: Path | None = None) -> None:
        self._sp = processor
        self.path = path
        self.vocab_size = int(processor.get_piece_size())
        self._check_specials()

    @classmethod
    def from_file(cls, path: str | Path) -> TextTokenizer:
        """Load a `.model` file; raises CheckpointError when it is missing or not a SentencePiece model."""
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"tokenizer not found: {path} (pass --tokenizer FILE or --model PRESET)")
        processor = spm.SentencePieceProcessor()
        try:
            processor.load(str(path))
        except (OSError, RuntimeError) as exc:
            raise CheckpointError(f"{path}: not a SentencePiece model ({exc})") from exc
        return cls(processor, path)

    @classmethod
    def tiny(cls, cache_dir: str | Path | None = None) -> TextTokenizer:
        """The `tiny-random` tokenizer, trained once and cached (see `tiny_tokenizer_path`)."""
        return cls.from_file(tiny_tokenizer_path(cache_dir))

    def _check_specials(self) -> None:
        # The stream signals are byte pieces; a tokenizer without byte fallback at these ids would silently map
        # `<ret>` and the span markers to ordinary words.
        expected = {RET_ID: "<0x00>", SPAN_OPEN_ID: "<0x08>", SPAN_CLOSE_ID: "<0x09>"}
        if self.vocab_size <= SPAN_CLOSE_ID:
            raise CheckpointError(
                f"tokenizer {self.path}: vocabulary of {self.vocab_size} pieces is too small"
            )
        wrong = {i: self._sp.id_to_piece(i) for i, p in expected.items() if self._sp.id_to_piece(i) != p}
        if wrong:
            log.warning("tokenizer %s: unexpected pieces at the special ids %s", self.path, wrong)

    def encode(self, text: str) -> list[int]:
        """Word-piece ids of `text`; never contains a stream signal id (those are removed)."""
        ids = self._sp.encode(text, out_type=int)
        return [i for i in ids if i not in NON_TEXT_IDS]

    def piece(self, token: int) -> str:
        """The rendered word piece of one id ("" for special ids): `▁` becomes a leading space."""
        if token in NON_TEXT_IDS or token < 0 or token >= self.vocab_size:
            return ""
        piece = self._sp.id_to_piece(int(token))
        if self._sp.is_byte(int(token)):
            value = int(piece[3:5], 16)
            return chr(value) if 32 <= value < 127 else ""
        return piece.replace(_WORD_BOUNDARY, " ")

    def decode(self, tokens: Iterable[int]) -> str:
        """Text of a token sequence, skipping the convention's non-text ids (pad, `<ret>`, span markers...)."""
        kept = [int(t) for t in tokens if int(t) not in NON_TEXT_IDS and 0 <= int(t) < self.vocab_size]
        return self._sp.decode(kept)

    def is_representable(self, text: str) -> bool:
        """True when `text` encodes without byte-fallback pieces (every character is in the vocabulary)."""
        return not any(self._sp.is_byte(i) for i in self._sp.encode(text, out_type=int))


# ---------------------------------------------------------------------------------------------------------------
# The tiny tokenizer: a built-in corpus, trained deterministically.

_SUBJECTS = (
    "the weather",
    "the time",
    "your order",
    "the table",
    "the flight",
    "the account",
    "the meeting",
    "the doctor",
    "the delivery",
    "the payment",
    "the reservation",
    "the train",
    "the bus",
    "the hotel",
)
_CITIES = (
    "Sydney",
    "London",
    "Paris",
    "Tokyo",
    "Seoul",
    "Berlin",
    "Madrid",
    "Toronto",
    "Chicago",
    "Boston",
    "Denver",
    "Austin",
    "Dublin",
    "Lisbon",
    "Vienna",
    "Prague",
    "Oslo",
    "Rome",
    "Cairo",
    "Lima",
)
_NAMES = ("Ada", "Ben", "Carla", "David", "Emma", "Frank", "Grace", "Hugo", "Iris", "Jack", "Kelina", "Liam")
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_SENTENCES = (
    "Hello, thanks for calling, how can I help you today?",
    "Sure, let me check that for you.",
    "One moment please, I am looking it up.",
    "Is there anything else I can help you with?",
    "You are a helpful and friendly phone assistant.",
    "You enjoy having a good conversation.",
    "You work for a small restaurant and take bookings by phone.",
    "Please speak clearly and keep your answers short.",
    "I would like to book a table for four people at seven o'clock.",
    "What is the balance of my savings account?",
    "Can you tell me what time it is in Tokyo right now?",
    "The current temperature is twenty one degrees with light rain.",
    "It is sunny and warm with a gentle breeze from the north.",
    "Your package was shipped yesterday and arrives on Friday.",
    "I'm sorry, I couldn't find any information about that.",
    "(tool result) the weather in Sydney is 22 degrees and sunny.",
    "(no information found)",
    "The square root of one hundred forty four is twelve.",
    "Okay, got it. Yeah, right. Mm-hmm. Oh, really? That's great!",
    "Goodbye, and have a wonderful day.",
    "Could you repeat that, please? I didn't quite catch it.",
    "The store opens at nine in the morning and closes at six in the evening.",
    "Your appointment is confirmed for next Tuesday at half past ten.",
    "The price of one share is one hundred and twelve dollars and forty cents.",
    "Let me transfer you to a colleague who can help with that.",
    "Numbers like 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 42, 100, 2024 and 3.14 are common.",
    "Questions start with who, what, when, where, why, which and how.",
)


def tiny_corpus() -> list[str]:
    """The built-in English corpus (deterministic) the tiny tokenizer is trained on."""
    lines = list(_SENTENCES)
    for i, city in enumerate(_CITIES):
        name = _NAMES[i % len(_NAMES)]
        day = _DAYS[i % len(_DAYS)]
        subject = _SUBJECTS[i % len(_SUBJECTS)]
        lines += [
            f"What is the weather like in {city} on {day}?",
            f"The user's name is {name}. The user is in {city}.",
            f"<system> You are {name}, a kind assistant for callers from {city}. <system>",
            f"(tool result) {subject} in {city} is confirmed for {day} at {i % 12 + 1} pm.",
            f"{name} asked about {subject} and I said it was fine.",
            f"It is {10 + i} degrees in {city} and the wind is {i + 3} kilometers per hour.",
        ]
    for day in _DAYS:
        for subject in _SUBJECTS:
            lines.append(f"Can you check {subject} for {day} morning or afternoon?")
    return lines


def tiny_tokenizer_path(cache_dir: str | Path | None = None) -> Path:
    """Path of the trained tiny tokenizer, training it first when it is not cached yet.

    The file name carries a hash of the corpus and options, so a changed corpus never reuses a stale model.
    """
    corpus = tiny_corpus()
    digest = hashlib.sha256(("\n".join(corpus) + _TINY_FORMAT_VERSION).encode()).hexdigest()[:12]
    folder = Path(cache_dir) if cache_dir is not None else user_cache_dir()
    path = folder / f"tokenizer-tiny-{TINY_VOCAB_SIZE}-{digest}.model"
    if not path.is_file():
        train_tiny_tokenizer(path, corpus)
    return path


def train_tiny_tokenizer(path: Path, corpus: Sequence[str], vocab_size: int = TINY_VOCAB_SIZE) -> Path:
    """Train a byte-fallback SentencePiece model on `corpus` and write it atomically to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    # Training from an iterator into memory keeps temp paths out of the model, so equal corpora give equal bytes.
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        unk_id=TEXT_EPAD_ID,
        bos_id=TEXT_BOS_ID,
        eos_id=TEXT_EOS_ID,
        pad_id=TEXT_PAD_ID,
        num_threads=1,
        shuffle_input_sentence=False,
        # a small corpus may not fill the vocabulary with merges; then it stops short instead of failing
        hard_vocab_limit=False,
        minloglevel=2,
    )
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as tmp:
        tmp.write(model.getvalue())
    os.replace(tmp.name, path)
    return path


def user_cache_dir() -> Path:
    """`$DUETASPAN_CACHE`, else `$XDG_CACHE_HOME/duetaspan`, else `~/.cache/duetaspan`."""
    if env := os.environ.get("DUETASPAN_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "duetaspan"
