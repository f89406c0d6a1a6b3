"""Speech-to-text clients: OpenAI-compatible transcriptions, `POST /transcribe`, in-process faster-whisper."""

from duetaspan.adapters.asr.base import ASRClient, ASRError, ASRTimeout, NullASR, clean_transcript, wav_bytes
from duetaspan.adapters.asr.factory import asr_from_config
from duetaspan.adapters.asr.http import OpenAITranscriptionClient, TranscribeClient
from duetaspan.adapters.asr.whisper import FasterWhisperClient

__all__ = [
    "ASRClient",
    "ASRError",
    "ASRTimeout",
    "FasterWhisperClient",
    "NullASR",
    "OpenAITranscriptionClient",
    "TranscribeClient",
    "asr_from_config",
    "clean_transcript",
    "wav_bytes",
]
