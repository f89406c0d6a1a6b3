"""The call viewer's HTML: one self-contained file (inline CSS, script and data; no network) per call.

The record's data goes in as JSON inside `<script type="application/json">` with `<`, `>` and `&` escaped,
so no transcript or tool reference can close the tag; the page's script writes every text with
`textContent`. A Content-Security-Policy forbids any network access from the page.

The wav next to the record (`<call id>.wav`, left caller, right agent) gives the waveforms (peak per 20 ms
per channel, one byte each) and, with `audio="embed"`, the playable audio: re-encoded as Ogg/Opus (about
3.5 KB per second of call, stereo) inside the page, or as the original wav when Opus is unavailable.
`audio="link"` points the player at the wav instead (the page must stay next to it); `"none"` leaves it out.

Example:
    >>> render_call("calls/CA123.json", "CA123.html")  # doctest: +SKIP
    PosixPath('CA123.html')
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import re
import wave
from importlib import resources
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import numpy as np

from duetaspan.errors import DuetaspanError
from duetaspan.pipeline.artifacts import consolidate, read_events
from duetaspan.view.timeline import build_view

log = logging.getLogger(__name__)

AudioMode = Literal["embed", "link", "none"]
_PLACEHOLDER = re.compile(r"\{\{([A-Z_]+)\}\}")
PEAKS_PER_S = 50
MAX_EMBED_S = 3600.0  # longer calls link to their wav instead of growing the page past ~15 MB
# libsndfile's Opus "compression level" sets the bitrate: 0.97 is ~26 kbit/s stereo (speech stays clear; the
# default, ~68 kbit/s, makes pages 2.5x bigger for nothing a listener of a phone call would hear)
OPUS_COMPRESSION = 0.97


class ViewError(DuetaspanError):
    """The call record cannot be read (missing, not JSON, not a call record)."""


def load_record(path: str | Path) -> dict[str, Any]:
    """A call record from its `.json`, or rebuilt from its `.jsonl` (a call whose process died)."""
    path = Path(path)
    if not path.is_file():
        raise ViewError(f"no call record at {path} (pass the <call id>.json from the record dir)")
    if path.suffix == ".jsonl":
        return consolidate(read_events(path))
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ViewError(f"{path} is not a JSON call record ({exc})") from None
    if not isinstance(record, dict) or "frames" not in record or "call_id" not in record:
        raise ViewError(f"{path} is not a duetaspan call record (no call_id/frames): pass <call id>.json")
    return record


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """The recording as int16 `(samples, 2)` (caller, agent) and its sample rate."""
    try:
        with wave.open(str(path), "rb") as w:
            channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            raw = w.readframes(w.getnframes())
    except (wave.Error, EOFError, OSError) as exc:
        raise ViewError(f"cannot read the call's wav {path}: {exc}") from None
    if width != 2:
        raise ViewError(f"{path}: {8 * width}-bit audio; call recordings are 16-bit")
    pcm = np.frombuffer(raw[: len(raw) // (2 * channels) * 2 * channels], "<i2").reshape(-1, channels)
    if channels == 1:
        pcm = np.repeat(pcm, 2, axis=1)
    return pcm[:, :2], rate


def peaks(pcm: np.ndarray, rate: int, per_s: int = PEAKS_PER_S) -> dict[str, Any]:
    """Per-channel peak of each 1/per_s s, square-root companded to one byte (quiet speech stays visible)."""
    hop = max(1, rate // per_s)
    n = pcm.shape[0] // hop
    out: dict[str, Any] = {"rate": rate / hop}
    for i, name in enumerate(("caller", "agent")):
        if n == 0:
            out[name] = ""
            continue
        block = np.abs(pcm[: n * hop, i].astype(np.int32)).reshape(n, hop).max(axis=1) / 32768.0
        out[name] = base64.b64encode(np.rint(np.sqrt(block) * 255).astype(np.uint8).tobytes()).decode()
    return out


def encode_audio(pcm: np.ndarray, rate: int) -> tuple[str, bytes]:
    """(mime type, bytes) of the stereo recording for the page's player: Ogg/Opus, else the wav itself."""
    try:
        import soundfile

        buf = io.BytesIO()
        soundfile.write(buf, pcm, rate, format="OGG", subtype="OPUS", compression_level=OPUS_COMPRESSION)
        return "audio/ogg", buf.getvalue()
    except Exception as exc:  # libsndfile without Opus (or an odd rate): a bigger page, still playable
        log.info("Opus encoding unavailable (%s); embedding 16-bit wav", exc)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.astype("<i2").tobytes())
    return "audio/wav", buf.getvalue()


def _asset(name: str) -> str:
    return (resources.files("duetaspan.view") / name).read_text(encoding="utf-8")


def _script_json(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def render_html(
    view: dict[str, Any],
    *,
    wave_peaks: dict[str, Any] | None = None,
    audio_src: str | None = None,
    media_src: str = "",
) -> str:
    """The page for `view` (`timeline.build_view`), with waveform peaks and an audio source when given.

    `audio_src`: a `data:` URI or a relative URL (then `media_src` is what the page's CSP must allow).
    """
    call_id = str(view.get("call", {}).get("call_id") or "call")
    if audio_src:
        player = (
            f'<audio id="audio" controls preload="auto" src="{html.escape(audio_src, quote=True)}"></audio>'
        )
    else:
        player = '<span class="noaudio">no audio: the wav is not next to the record</span>'
    values = {
        "TITLE": html.escape(f"duetaspan · {call_id}"),
        "MEDIA_SRC": media_src,
        "CSS": _asset("viewer.css"),
        "AUDIO": player,
        "DATA": _script_json({**view, "peaks": wave_peaks}),
        "JS": _asset("viewer.js"),
    }
    # one pass over the template: a `{{JS}}` said by a caller and recorded in the data stays text
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], _asset("viewer.html"))


def render_call(
    record_path: str | Path,
    out_path: str | Path | None = None,
    *,
    audio: AudioMode = "embed",
    max_embed_s: float = MAX_EMBED_S,
) -> Path:
    """Write the viewer page of the call at `record_path` (`.json`, or `.jsonl` after a crash).

    Args:
        out_path: the page (default: the record's path with `.html`).
        audio: "embed" the recording in the page, "link" to the wav next to it, or "none".
        max_embed_s: longer recordings are linked rather than embedded.
    """
    record_path = Path(record_path)
    out = Path(out_path) if out_path is not None else record_path.with_suffix(".html")
    page = call_page(record_path, audio=audio, max_embed_s=max_embed_s, page_dir=out.parent)
    out.write_text(page, "utf-8")
    return out


def call_page(
    record_path: str | Path,
    *,
    audio: AudioMode = "embed",
    max_embed_s: float = MAX_EMBED_S,
    page_dir: Path | None = None,
) -> str:
    """The viewer page of the call at `record_path`, as a string (`page_dir`: where a linked wav is
    resolved from; without one, a long recording is left out rather than linked)."""
    record_path = Path(record_path)
    view = build_view(load_record(record_path))
    wav = record_path.with_suffix(".wav")
    wave_peaks, audio_src, media_src = None, None, ""
    if wav.is_file():
        pcm, rate = read_wav(wav)
        wave_peaks = peaks(pcm, rate)
        seconds = pcm.shape[0] / rate
        view["call"]["duration_s"] = max(view["call"]["duration_s"] or 0.0, round(seconds, 3))
        if audio == "embed" and seconds > max_embed_s:
            log.warning("call is %.0f s long: its audio is not embedded (over %.0f s)", seconds, max_embed_s)
            audio = "link" if page_dir is not None else "none"
        if audio == "embed":
            mime, data = encode_audio(pcm, rate)
            audio_src = f"data:{mime};base64,{base64.b64encode(data).decode()}"
        elif audio == "link" and page_dir is not None:
            audio_src = _relative(wav, page_dir)
            media_src = "'self' file:"
    return render_html(view, wave_peaks=wave_peaks, audio_src=audio_src, media_src=media_src)


def _relative(target: Path, folder: Path) -> str:
    try:
        rel = target.resolve().relative_to(folder.resolve())
        return quote(rel.as_posix())
    except ValueError:
        return target.resolve().as_uri()
