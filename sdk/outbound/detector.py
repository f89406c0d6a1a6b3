"""Answer detection from the audio, streamed: who picked up, decided from speech cadence and tones.

`AnswerDetector(rate).push(pcm)` takes the callee's audio as it arrives (any chunk size; 8, 16, 24 kHz...) and
returns the verdicts reached in it, each a `Verdict` with its time from the answer:

- **Cadence** (a VAD over 20 ms frames: a frame is speech when its level stands `margin_db` over a noise floor
  that follows the line's noise, or its voiced band, 200-1600 Hz, stands `band_margin_db` over that band's
  own floor, or it is voiced, periodic at a speaking pitch, and a little over the floor; the last two find
  words on a line whose noise is nearly as loud as they are): a first utterance of at most `max_human_s` followed by a `pause_s` pause is a person ("hello?" then waiting);
  speech running past `machine_s` without such a pause is a greeting (`voicemail`), or hold music (`ivr`)
  when its level and spectrum stay as steady as sustained notes do; nothing said for `silence_s` is
  `silence`.
- **Tones** (`duetaspan.outbound.tones`): a 400-2000 Hz tone of 0.2-1.5 s is the voicemail's `beep` (its
  start in `beep_at_s`); a 2100 Hz answer tone or a 1100 Hz calling tone before any speech is `fax`.

The first verdict is `verdict`; a beep after it comes as a second `beep` verdict (a person's verdict followed
by a beep is revised to `beep`: a short greeting "leave a message" then the tone). A `human` verdict is also
revised to `voicemail` when the line reads on: speech starts again within `recheck_start_s` of the verdict
and either runs past `machine_s` without a pause or comes to `reading_on_speech_s` within `reading_on_s` of
the verdict. A greeting read slowly pauses after its first sentence as a person pauses after "hello?", then reads
its next sentences; a person who said "hello?" and hears the agent start says little. A second
opinion from the transcript (`duetaspan.outbound.phrases`) may refine `voicemail` to `ivr` or `screening`, or
overturn.

Example:
    >>> import numpy as np
    >>> det = AnswerDetector(8000)
    >>> det.push(np.zeros(8000 * 4, dtype=np.float32))[0].verdict
    'silence'
"""

from __future__ import annotations

from collections import deque

import numpy as np

from duetaspan.outbound.dsp import FRAME_S, Frame, PhoneFrames
from duetaspan.outbound.syllables import Nuclei
from duetaspan.outbound.tones import Tone, ToneTracker
from duetaspan.outbound.verdicts import DetectTuning, Verdict

_SMOOTH = 3  # frames averaged (in power) before the floor's percentile
_FLOOR_S = 3.0  # the noise floor: the 5th percentile of the smoothed level of the last few seconds
# no signal at all (a concealed or DTX frame, a PBX's hand-over: zeros, or one code repeated, `Frame.flat`): a
# clean line's own noise through G.711 is -73 to -86 dBFS, and the line's (at -72 its floor had nothing of the
# line to keep and followed hold music from the start)
_DIGITAL_SILENCE_DB = -90.0
_FLOOR_LIVE_FRAMES = 25  # the floor follows the frames with a signal once this many (0.5 s) are in its window
_MUSIC_FRAMES = 50  # hold music is judged on the last second of a long sound
# the floor rises at most this much a frame (10 dB/s; it falls at once, and from digital silence it jumps to
# whatever comes): hold music that starts with the call is a sound, not the line's noise
_FLOOR_RISE_DB = 0.2
_MIN_UTTERANCE_S = 0.12  # less active speech than this is a click or a breath, not an utterance
_NUCLEUS_VOICING = 0.4  # a syllable's top is this periodic (or sounds over the noise)


class AnswerDetector:
    """Streaming answer classifier for one call (see the module docstring)."""

    def __init__(self, sample_rate: int, tuning: DetectTuning | None = None) -> None:
        self.tuning = tuning or DetectTuning()
        self.frames = PhoneFrames(sample_rate)
        self.tones = ToneTracker(self.tuning)
        self.verdict: Verdict | None = None  # the first decision
        self.beep: Verdict | None = None
        self.history: list[Verdict] = []
        self.t = 0.0
        self._recent: deque[float] = deque(maxlen=_SMOOTH)
        self._floor: deque[float] = deque(maxlen=int(_FLOOR_S / FRAME_S))
        self._band_recent: deque[float] = deque(maxlen=_SMOOTH)
        self._band: deque[float] = deque(maxlen=int(_FLOOR_S / FRAME_S))
        self._loud: deque[bool] = deque(maxlen=3)
        self._floor_db: float | None = None  # the floor the last frame was judged against
        self._floor_line = False  # ... and whether it was the line's (not digital silence, nor mixed with it)
        self.speech_s = 0.0  # active speech heard so far
        self.first_speech_s: float | None = None
        self._seg_start: float | None = None
        self._last_active = -1.0
        self._seg_active = 0.0
        self._seg_sound = 0.0  # the segment's frames over `sound_margin_db` (or active)
        self._seg_levels: list[float] = []
        self._seg_sim: list[float] = []
        self._nuclei = Nuclei()  # the syllables of the stretch being heard
        self._utterances: list[tuple[float, float]] = []  # finished (start, end)
        self._ended_at: list[float] = []  # when each was known to have ended (its pause heard)
        self._sit = 0
        self._next_start: float | None = None  # when the first stretch after a `human` verdict started

    def same_line(self, heard: AnswerDetector) -> AnswerDetector:
        """Listen afresh on the line `heard` listened to: its noise floor (the levels in its window, the floor
        and its smoothing) carries over, everything else (time, sounds, verdicts) starts again. A detector new
        to the line learns its floor from its first frames: from a concealed frame (digital silence) among
        them, the line's noise is taken for speech for up to half a second. Returns this detector."""
        self._recent.extend(heard._recent)
        self._floor.extend(heard._floor)
        self._band_recent.extend(heard._band_recent)
        self._band.extend(heard._band)
        self._floor_db, self._floor_line = heard._floor_db, heard._floor_line
        return self

    @property
    def final(self) -> Verdict | None:
        """The verdict as it stands: the last one reached (a beep after a greeting, a revision)."""
        return self.history[-1] if self.history else None

    @property
    def utterances(self) -> list[tuple[float, float]]:
        return list(self._utterances)

    @property
    def ended_at(self) -> list[float]:
        """When each of `utterances` was known to have ended: its end plus the pause that ended it."""
        return list(self._ended_at)

    def push(self, pcm: np.ndarray) -> list[Verdict]:
        out: list[Verdict] = []
        for frame in self.frames.push(pcm):
            out.extend(self._frame(frame))
        return out

    def finish(self) -> list[Verdict]:
        """The input ended: decide with what was heard (an utterance still open is judged as it stands)."""
        out: list[Verdict] = []
        tone = self.tones.push(Frame(self.t + FRAME_S, -120.0, 0.0, 0.0, 0.0))
        if tone is not None:
            out.extend(self._tone(tone))
        if self.verdict is None and self._seg_start is not None:
            out.extend(self._end_utterance(self.t, self.t))
        if self.verdict is None:
            out.append(self._decide(Verdict("silence", 0.6, self.t, reason="the audio ended before anything was said")))
        return out

    # ------------------------------------------------------------------------------------------------
    def _frame(self, f: Frame) -> list[Verdict]:
        self.t = f.t
        out: list[Verdict] = []
        tone = self.tones.push(f)
        if tone is not None:
            out.extend(self._tone(tone))
        cur = self.tones.current
        if cur is not None and self.verdict is None and cur.duration_s >= 0.5:
            if abs(cur.hz - 2100.0) <= 35.0 or (cur.duration_s >= 1.7 and self.speech_s < 0.3):
                out.append(self._decide(Verdict("fax", 0.95, f.t, reason=f"a steady {cur.hz:.0f} Hz tone (fax/modem)")))
        tonal = self.tones.tonal(f) and not self.tones.voiced(f)  # a held vowel's pure frame is speech
        self._recent.append(0.0 if f.flat else 10 ** (f.level_db / 10))  # one code repeated: digital silence
        smoothed = 10 * np.log10(np.mean(self._recent) + 1e-12)
        self._floor.append(smoothed)
        self._band_recent.append(10 ** (f.band_db / 10))
        self._band.append(10 * np.log10(np.mean(self._band_recent) + 1e-12))
        # digital silence is the absence of a line, not its noise floor: once half a second of signal has come
        # after it, the floor is that signal's (else a line's own noise after it counts as speech for 3 s)
        # one pass over the window: the line's floor and the voiced band's, both of the same (live) frames
        window = np.array((self._floor, self._band))
        live = window[0] > _DIGITAL_SILENCE_DB
        n_live = int(live.sum())
        use_live = n_live >= _FLOOR_LIVE_FRAMES
        floor, band_floor = (float(x) for x in np.percentile(window[:, live] if use_live else window, 5, axis=1))
        prev = self._floor_db
        if prev is not None and self._floor_line and floor > prev + _FLOOR_RISE_DB:
            floor = prev + _FLOOR_RISE_DB  # a sound that starts and stays (music) is not the line's noise at once
        # the line's floor: of the signal alone. A window mixing digital silence with under `_FLOOR_LIVE_FRAMES`
        # of signal gives a percentile between the two, no line's noise: held to the rise limit, it stayed 10-25
        # dB under the line's noise for over a second (a line's noise after one concealed frame taken for speech)
        self._floor_db = floor
        self._floor_line = use_live or n_live == len(self._floor)
        audible = not tonal and f.level_db > self.tuning.min_level_db
        over = f.level_db - floor
        # a voiced frame (periodic at a speaking pitch) is speech a little over the floor: on a noisy line the
        # words never stand `margin_db` over the noise, and noise is not periodic
        voiced = f.voicing >= self.tuning.voicing and over > self.tuning.voiced_margin_db
        # ... or the voiced band over its own floor: white noise or a street's hiss spreads over the whole line,
        # a voice mostly under 1600 Hz, so the band stands further over its floor than the whole line does
        in_band = f.band_db - band_floor > self.tuning.band_margin_db
        loud = audible and (over > self.tuning.margin_db or voiced or in_band)
        self._loud.append(loud)
        active = sum(self._loud) >= 2  # two of the last three frames: a lone noise burst is not speech
        if active:
            if self._seg_start is None:
                self._seg_start, self._seg_active, self._seg_sound = f.t - FRAME_S, 0.0, 0.0
                self._seg_levels, self._seg_sim = [], []
                self._nuclei.reset()
                if self._next_start is None and self._rechecking(f.t, self.tuning.recheck_s):
                    self._next_start = self._seg_start
            self._last_active = f.t
            self._seg_active += FRAME_S
            self._seg_levels.append(f.level_db)
            self._seg_sim.append(f.similarity)
        if self._seg_start is not None:
            if active or (audible and over > self.tuning.sound_margin_db):  # a noisy line's quieter syllables
                self._seg_sound += FRAME_S  # sound under `margin_db`, over `sound_margin_db`
            self._nuclei.push(f.band_db, f.voicing >= _NUCLEUS_VOICING or over > self.tuning.sound_margin_db)
            # the speech's extent so far: to its last active frame, not to now (a pause after a slow "Hello, Elena
            # here." is no more speech, however long the pause that ends it is)
            t, running = self.tuning, self._last_active - self._seg_start
            if f.t - self._last_active >= self._pause():
                out.extend(self._end_utterance(self._last_active, f.t))
            elif self.verdict is None and running >= t.machine_s and self._seg_sound >= t.machine_active * running \
                    and not self._waits_for_slow_words(running):
                out.append(self._decide(self._long_sound(f.t)))
            elif active and self._rechecking(f.t, t.recheck_s):
                assert self.verdict is not None
                since, first = self.verdict.decided_at_s, self._next_start
                prompt = first is not None and first - since <= t.recheck_start_s  # reads on, not answers
                runs_on = first == self._seg_start and running >= t.machine_s
                read_on = f.t - since <= t.reading_on_s and self._speech_since(since) >= t.reading_on_speech_s
                if prompt and (runs_on or read_on):
                    out.append(self._revise(f.t, since))
        if self.verdict is None and self.first_speech_s is None and self._seg_start is None and f.t >= self.tuning.silence_s:
            out.append(self._decide(Verdict("silence", 0.8, f.t, reason=f"nothing said in {self.tuning.silence_s:g} s")))
        return out

    def _slow(self, length: float) -> bool:
        """Whether a stretch of `length` seconds could still be a slow person's few words: no longer than
        `slow_human_s`, with a syllable but no more than `slow_syllables` in it (a greeting has more by then;
        a sound without one is no words at all)."""
        t = self.tuning
        return length <= t.slow_human_s and 1 <= self._nuclei.count <= t.slow_syllables

    def _waits_for_slow_words(self, running: float) -> bool:
        """Whether a stretch past `machine_s` is not called a greeting yet: it could be slow words (`_slow`),
        and its last second does not hold its level within `music_level_sd_db` (held notes do, even where a
        noisy line blurs their spectra; words rise and fall with their syllables)."""
        return self._slow(running) and self._level_spread() >= self.tuning.music_level_sd_db

    def _rechecking(self, t: float, within_s: float) -> bool:
        """Whether `t` is within `within_s` of a first `human` verdict that nothing has revised yet."""
        v = self.verdict
        return v is not None and v.verdict == "human" and self.final is v and t - v.decided_at_s <= within_s

    def _speech_since(self, since: float) -> float:
        """Seconds of speech heard after `since`: the utterances' extents, the one being heard to its last
        speech frame."""
        spans = [*self._utterances, *([(self._seg_start, self._last_active)] if self._seg_start is not None else [])]
        return sum(max(0.0, end - max(start, since)) for start, end in spans)

    def _revise(self, t: float, since: float) -> Verdict:
        revised = Verdict("voicemail", 0.7, t, reason=f"{self._speech_since(since):.1f} s of speech in the "
                          f"{t - since:.1f} s after the person's verdict at {since:.2f} s: a greeting reading on")  # fmt: skip
        self.history.append(revised)
        return revised

    def _pause(self) -> float:
        """The pause that ends the utterance being heard: before any verdict, a longer one once the first
        utterance is past `short_human_s` (a greeting's first sentence pauses about as long as a person waits)."""
        t = self.tuning
        if self.verdict is None and self._seg_start is not None and self._last_active - self._seg_start > t.short_human_s:
            return t.long_pause_s
        return t.pause_s

    def _level_spread(self) -> float:
        """The spread (dB, standard deviation) of the level over the latest second of the stretch (after any
        "please hold")."""
        levels = self._seg_levels[-_MUSIC_FRAMES:]
        return float(np.std(levels)) if levels else 99.0

    def _long_sound(self, t: float) -> Verdict:
        start = self._seg_start or 0.0
        steady = self._level_spread()
        alike = float(np.mean(self._seg_sim[-_MUSIC_FRAMES:])) if self._seg_sim else 0.0
        self._note_speech(start)
        if steady < self.tuning.music_level_sd_db and alike > self.tuning.music_similarity:  # sustained notes
            return Verdict("ivr", 0.7, t, reason=f"hold music: level within {steady:.1f} dB, spectra {alike:.2f} alike")
        return Verdict("voicemail", 0.8, t, reason=f"{t - start:.1f} s of speech without a pause (a greeting)")

    def _end_utterance(self, end: float, now: float) -> list[Verdict]:
        start = self._seg_start if self._seg_start is not None else end
        active = self._seg_active
        self._seg_start = None
        if active < _MIN_UTTERANCE_S:
            return []
        self._utterances.append((start, end))
        self._ended_at.append(now)
        self._note_speech(start)
        self.speech_s += active
        if self.verdict is not None:
            return []
        length = end - start
        t = self.tuning
        if length <= t.max_human_s or self._slow(length):
            confidence = 0.55 + 0.4 * min(1.0, max(0.0, (t.max_human_s - length) / t.max_human_s))
            return [self._decide(Verdict("human", confidence, now,
                                         reason=f"a {length:.1f} s utterance, then {now - end:.1f} s of quiet"))]  # fmt: skip
        return [self._decide(Verdict("voicemail", 0.55, now, reason=f"a {length:.1f} s utterance (longer than a hello)"))]

    def _note_speech(self, start: float) -> None:
        if self.first_speech_s is None:
            self.first_speech_s = start

    def _tone(self, tone: Tone) -> list[Verdict]:
        kind = tone.kind(self.tuning, speech_before_s=self.speech_s + self._seg_active)
        if kind in ("ced", "cng"):
            if self.verdict is None:
                return [self._decide(Verdict("fax", 0.95, self.t, reason=f"fax {kind.upper()} tone at {tone.hz:.0f} Hz"))]
            return []
        if kind == "sit":
            self._sit += 1
            if self._sit == 2 and self.verdict is None:  # two in a row: a carrier's intercept message follows
                return [self._decide(Verdict("voicemail", 0.9, self.t, reason="the carrier's SIT tones"))]
            return []
        if kind != "beep" or self.beep is not None:
            return []
        beep = Verdict("beep", 0.9, self.t, reason=f"a {tone.duration_s:.2f} s tone at {tone.hz:.0f} Hz",
                       beep_at_s=tone.start_s, beep_end_s=tone.end_s)  # fmt: skip
        self.beep = beep
        if self._seg_start is not None and self._seg_active < _MIN_UTTERANCE_S:
            self._seg_start = None  # the tone's edges are not speech
        self.history.append(beep)
        if self.verdict is None:
            self.verdict = beep
        return [beep]

    def _decide(self, verdict: Verdict) -> Verdict:
        self.verdict = verdict
        self.history.append(verdict)
        return verdict


def classify(pcm: np.ndarray, sample_rate: int, tuning: DetectTuning | None = None, *, chunk_s: float = 0.02) -> AnswerDetector:
    """Run a whole recording through a detector as if streamed in `chunk_s` pieces; returns the detector
    (its `verdict`, `final`, `beep` and `history`). Stops feeding once the beep is found or the verdict is
    not a greeting's (a person's, silence, fax), as a live call would stop listening."""
    det = AnswerDetector(sample_rate, tuning)
    step = max(1, int(sample_rate * chunk_s))
    for i in range(0, len(pcm), step):
        det.push(pcm[i : i + step])
        v = det.verdict
        if det.beep is not None or (v is not None and v.verdict in ("fax", "silence")):
            break
    else:
        det.finish()
    return det


__all__ = ["AnswerDetector", "classify"]
