"""baresip scripted as a softphone for the media tests: which codec modules it loads (it offers only those),
SIP over TLS (its CA file is our test certificate), SRTP (`mediaenc`), a fixture as its microphone
(`aufile`) and what it hears written to a wav (`sndfile`). Its SDP names 127.0.0.1 (`net_interface`), so
every packet stays on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import subprocess
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import soxr

from tests.adapters.sip.peer import BARESIP, free_udp_port
from tests.support import load_wav, peer_rtp_ports

OPENSSL = shutil.which("openssl")
needs_openssl = pytest.mark.skipif(
    OPENSSL is None, reason="openssl not installed (makes the test certificate)"
)

CONFIG = """poll_method epoll
sip_listen 127.0.0.1:{sip_port}
net_interface 127.0.0.1
{cafile}audio_source aufile,{wav}
audio_player aufile,/dev/null
audio_alert aufile,/dev/null
ausrc_srate {rate}
auplay_srate {rate}
ausrc_channels 1
auplay_channels 1
rtp_ports {rtp}-{rtp_end}
module_path /usr/lib/baresip/modules
module stdio.so
{codecs}{srtp}module aufile.so
module sndfile.so
module_app account.so
module_app menu.so
snd_path {snd}
{extra}"""


def make_certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (the endpoint's; baresip trusts it as its CA)."""
    assert OPENSSL is not None
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [OPENSSL, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


@dataclass
class Softphone:
    conf: Path
    heard: Path
    tls: bool
    sip_port: int = 0


def softphone(
    folder: Path,
    fixture: str,
    *,
    pad_s: float = 2.0,
    codecs: tuple[str, ...] = ("g711",),
    mediaenc: str | None = None,
    cafile: Path | None = None,
    rate: int = 8000,
    answer: bool = False,
    jitter_frames: str | None = None,
) -> Softphone:
    """A baresip config folder whose microphone is `fixture` at `rate` followed by `pad_s` of silence (baresip
    hangs up when the file ends); it offers only `codecs` (baresip module names). `jitter_frames` ("1-10")
    sets its jitter buffer's delay in frames (its default, 5-10, holds 100 ms before the first decode)."""
    pcm, fixture_rate = load_wav(fixture)
    pcm = np.concatenate([soxr.resample(pcm, fixture_rate, rate), np.zeros(int(pad_s * rate), np.float32)])
    wav = folder / "mic.wav"
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.clip(np.rint(pcm * 32767), -32768, 32767).astype("<i2").tobytes())
    conf, snd = folder / "baresip", folder / "heard"
    conf.mkdir()
    snd.mkdir()
    (rtp, rtp_end), sip_port = peer_rtp_ports(), free_udp_port()  # RTP from this xdist worker's peer block
    text = CONFIG.format(
        sip_port=sip_port, wav=wav, rtp=rtp, rtp_end=rtp_end, snd=snd, rate=rate,
        cafile=f"sip_cafile {cafile}\n" if cafile else "",
        codecs="".join(f"module {c}.so\n" for c in codecs),
        srtp="module srtp.so\n" if mediaenc else "",
        extra=f"jitter_buffer_delay {jitter_frames}\n" if jitter_frames else "",
    )  # fmt: skip
    (conf / "config").write_text(text)
    tls = cafile is not None
    params = (
        ";regint=0" + (f";mediaenc={mediaenc}" if mediaenc else "") + (";answermode=auto" if answer else "")
    )
    (conf / "accounts").write_text(f"<sip:tester@127.0.0.1{';transport=tls' if tls else ''}>{params}\n")
    return Softphone(conf, snd, tls, sip_port)


# baresip's line when one of its calls ended ("sip:tester@127.0.0.1: Call with sip:agent@... terminated
# (duration: 6 secs)"); it stays up until its `-t` timeout after that, doing nothing
CALL_ENDED = re.compile(rb"Call with \S+ terminated")


# baresip's last words when a port of its `sip_listen` is taken (UDP or TCP on it, TLS on the next): it exits at
# once, before it dials ("ua: SIP Transport failed: Address already in use", "ua: init failed (...)")
INIT_FAILED = b"init failed"


async def dial(phone: Softphone, port: int | None, cwd: Path, seconds: int = 30, calls: int = 1) -> str:
    """baresip dials the agent on `port` (None: it only waits for calls) and runs until `calls` of its calls
    ended (then it is stopped with SIGTERM: it stops its user agent and closes its sndfile recordings; a call
    ended at the far end, a REFER's new call and so on count) or for `seconds` at most; its log comes back.

    A dialling baresip whose SIP port another process took between `softphone()` and now (free_udp_port checks
    UDP and TCP, but a port can be taken in between) gets a new one, up to 5 times; one that waits for calls
    cannot (its caller already has the port), and fails with its log."""
    for attempt in range(5):
        out = await _run_baresip(phone, port, cwd, seconds, calls)
        if INIT_FAILED not in out:
            return out.decode(errors="replace")
        if port is None or attempt == 4:
            break
        config = phone.conf / "config"
        phone.sip_port = free_udp_port()
        config.write_text(
            re.sub(r"(?m)^sip_listen .*$", f"sip_listen 127.0.0.1:{phone.sip_port}", config.read_text())
        )
    raise AssertionError(
        f"baresip could not start (its SIP port {phone.sip_port}):\n{out.decode(errors='replace')}"
    )


async def _run_baresip(phone: Softphone, port: int | None, cwd: Path, seconds: int, calls: int) -> bytes:
    assert BARESIP is not None
    uri = f"sip:agent@127.0.0.1:{port}" + (";transport=tls" if phone.tls else "")
    command = ["-e", f"/dial {uri}"] if port is not None else []
    proc = await asyncio.create_subprocess_exec(
        BARESIP, "-f", str(phone.conf), *command, "-t", str(seconds),
        cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert proc.stdout is not None
    out = bytearray()

    async def until_the_calls_ended() -> None:
        while chunk := await proc.stdout.read(4096):
            out.extend(chunk)
            if len(CALL_ENDED.findall(out)) >= calls:
                proc.terminate()
                out.extend(await proc.stdout.read())  # what it says while it stops, to the end
                return

    try:
        await asyncio.wait_for(until_the_calls_ended(), seconds + 30)
        await asyncio.wait_for(proc.wait(), 30)
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    return bytes(out)


def heard(phone: Softphone) -> tuple[np.ndarray, int]:
    """What baresip heard (sndfile's `-dec.wav`, mono) and its rate."""
    path = next(phone.heard.glob("*-dec.wav"))
    with wave.open(str(path)) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768
        channels = w.getnchannels()  # Opus: baresip decodes (and dumps) stereo
        return pcm.reshape(-1, channels).mean(axis=1), w.getframerate()


def dec_offset_s(phone: Softphone) -> float:
    """When `heard()`'s recording starts on the call's timeline (its microphone's, seconds): sndfile's `-enc.wav`
    (what baresip sent: its `aufile` microphone from the call's start) and `-dec.wav` (what it decoded: from
    the first RTP packet that reached it) both close at the hang-up, so the difference of their lengths is how
    long after the call's start the first packet came."""

    def seconds(pattern: str) -> float:
        with wave.open(str(next(phone.heard.glob(pattern)))) as w:
            return w.getnframes() / w.getframerate()

    return seconds("*-enc.wav") - seconds("*-dec.wav")


def audible_share(pcm: np.ndarray, rate: int) -> float:
    """The share of 20 ms windows that are not silence."""
    step = rate // 50
    windows = pcm[: len(pcm) // step * step].reshape(-1, step)
    return float((np.sqrt((windows**2).mean(axis=1)) > 1e-3).mean()) if len(windows) else 0.0
