"""`duetaspan infer`: run the duplex model over a recorded caller wav, offline, frame by frame.

The input (any sample rate, any channel count) is resampled to 24 kHz mono and fed in 80 ms frames (the tail is
zero-padded to a whole frame); OUT.wav is stereo 24 kHz (left caller, right agent) as long as the input; OUT.json
holds the agent transcript and events (`<ret>`, spans with frame, n and prefill ms), and with `--trace` a list
`frames` of `{"i", "text_token", "agent_codes"}` for every input frame. These flags and fields are relied on by
tests and tools: keep them.

Example:
    $ duetaspan infer --model tiny-random --input-wav in.wav --output-wav out.wav --output-json out.json \\
        --inject "10:(tool result) it is 22 degrees in Sydney" --trace
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from duetaspan.errors import AudioFormatError, ConfigError, DuetaspanError
from duetaspan.model.audio import read_wav, to_model_rate, write_wav
from duetaspan.model.convention import FRAME_MS, FRAME_SIZE, RET_ID, SAMPLE_RATE, SPAN_CLOSE_ID


def _inject_spec(value: str) -> tuple[int, str]:
    frame, sep, text = value.partition(":")
    if not sep or not frame.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected FRAME:TEXT with a frame index >= 0, got {value!r}")
    return int(frame), text


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "infer",
        help="run the model over a caller wav (offline) and write stereo audio + a JSON transcript",
        description="Run the duplex model over a caller recording, 80 ms at a time, with optional Context Spans.",
    )
    io = p.add_argument_group("files")
    io.add_argument("--input-wav", required=True, type=Path, help="caller audio (any rate, any channels)")
    io.add_argument("--output-wav", required=True, type=Path, help="stereo 24 kHz: left caller, right agent")
    io.add_argument("--output-json", required=True, type=Path, help="transcript, events and optional trace")
    m = p.add_argument_group("model")
    m.add_argument(
        "--model", default=None, help="preset: duetaspan-7b (default), personaplex-7b, moshi-7b, tiny-random"
    )
    m.add_argument(
        "--model-dir", type=Path, default=None, help="local folder with the weights ($DUETASPAN_MODEL_DIR)"
    )
    m.add_argument("--checkpoint", type=Path, help="LM weights (.pt {'model': sd} or .safetensors)")
    m.add_argument("--lm-config", type=Path, help="the LM's lm_kwargs JSON")
    m.add_argument("--mimi", type=Path, help="Mimi safetensors")
    m.add_argument("--tokenizer", type=Path, help="SentencePiece .model")
    m.add_argument(
        "--random-weights", action="store_true", help="the preset's architecture with random weights"
    )
    m.add_argument("--span-close-id", type=int, choices=(12, SPAN_CLOSE_ID), default=None,
                   help="12 for checkpoints trained before 2026-09-08")  # fmt: skip
    m.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    pr = p.add_argument_group("prompt")
    pr.add_argument("--voice", help="voice preset name (voices/NAME.pt) or a .pt / .wav file")
    pr.add_argument("--text-prompt", help="persona text (wrapped in <system> tags)")
    pr.add_argument("--user-name", help='adds "The user\'s name is …" to the prompt')
    pr.add_argument("--user-city", help='adds "The user is in …" to the prompt')
    pr.add_argument("--no-prompt", action="store_true", help="no persona prefix at all")
    s = p.add_argument_group("sampling")
    s.add_argument("--temperature", type=float, default=0.8, help="audio temperature (0 = greedy)")
    s.add_argument("--temperature-text", type=float, default=0.7, help="text temperature (0 = greedy)")
    s.add_argument("--top-k", type=int, default=250)
    s.add_argument("--top-k-text", type=int, default=25)
    s.add_argument("--seed", type=int, default=42424242)
    o = p.add_argument_group("spans and output")
    o.add_argument("--inject", action="append", type=_inject_spec, default=[], metavar="FRAME:TEXT",
                   help="inject TEXT as a Context Span before input frame FRAME (repeatable)")  # fmt: skip
    o.add_argument("--trace", action="store_true", help="per-frame text token and agent codes in the JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except DuetaspanError as exc:
        print(f"duetaspan infer: error: {exc}", file=sys.stderr)
        return 2


def _build_engine(args: argparse.Namespace):
    import torch

    from duetaspan.model.engine import DuplexEngine

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    options: dict[str, Any] = {}
    if args.span_close_id is not None:
        options["span_close_id"] = args.span_close_id
    files = (args.checkpoint, args.mimi, args.tokenizer)
    if any(f is not None for f in (*files, args.lm_config)):
        if args.model is not None:
            raise ConfigError(
                "pass either --model PRESET or --checkpoint/--lm-config/--mimi/--tokenizer, not both"
            )
        if any(f is None for f in files):
            raise ConfigError("--checkpoint, --mimi and --tokenizer go together (and --lm-config unless the "
                              "checkpoint folder has a config.json)")  # fmt: skip
        return DuplexEngine.from_files(
            args.checkpoint,
            args.lm_config,
            args.mimi,
            args.tokenizer,
            device=device,
            seed=args.seed,
            **options,
        )
    return DuplexEngine.load(
        args.model or "duetaspan-7b",
        device=device,
        seed=args.seed,
        model_dir=args.model_dir,
        random_weights=args.random_weights,
        **options,
    )


def _persona(args: argparse.Namespace, engine: Any):
    from duetaspan.model.persona import Persona

    if args.no_prompt:
        if args.voice or args.text_prompt:
            raise ConfigError("--no-prompt cannot be combined with --voice or --text-prompt")
        return None
    preset = engine.preset
    text = (
        args.text_prompt if args.text_prompt is not None else (preset.default_text_prompt if preset else None)
    )
    voice = args.voice if args.voice is not None else (preset.default_voice if preset else None)
    if not text and not voice and not args.user_name and not args.user_city:
        return None
    return Persona(text=text, voice=voice, user_name=args.user_name, user_city=args.user_city)


def _run(args: argparse.Namespace) -> int:
    pcm, rate = read_wav(args.input_wav)
    if pcm.size == 0:
        raise AudioFormatError(f"{args.input_wav}: the wav holds no audio")
    caller = to_model_rate(pcm, rate)
    if len(caller) < FRAME_SIZE:
        raise AudioFormatError(
            f"{args.input_wav}: {len(caller) / SAMPLE_RATE * 1000:.0f} ms of audio is too short; "
            f"at least one {FRAME_MS:.0f} ms frame is needed"
        )
    n_frames = -(-len(caller) // FRAME_SIZE)
    bad = [f for f, _ in args.inject if f >= n_frames]
    if bad:
        raise ConfigError(f"--inject frame {bad[0]} is past the end of the input ({n_frames} frames)")

    from duetaspan.model.slots import SamplingParams

    t_load = time.perf_counter()
    engine = _build_engine(args)
    load_s = time.perf_counter() - t_load
    sampling = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        text_temperature=args.temperature_text,
        text_top_k=args.top_k_text,
    )
    persona = _persona(args, engine)
    slot = engine.open_slot(persona, sampling=sampling, seed=args.seed)
    prompt_frames, prompt_ms = engine.prompt_stats(slot)

    padded = np.zeros(n_frames * FRAME_SIZE, dtype=np.float32)
    padded[: len(caller)] = caller
    frames = padded.reshape(n_frames, FRAME_SIZE)
    schedule: dict[int, list[str]] = {}
    for frame, text in args.inject:
        schedule.setdefault(frame, []).append(text)

    agent = np.zeros_like(padded)
    tokens: list[int] = []
    events: list[dict[str, Any]] = []
    trace: list[dict[str, Any]] = []
    step_ms: list[float] = []
    for i in range(n_frames):
        for text in schedule.get(i, []):
            if not engine.inject(slot, text):
                events.append(
                    {"type": "span_skipped", "frame": i, "reference": text, "reason": "empty reference"}
                )
        r = engine.step({slot: frames[i]})[slot]
        step_ms.append(r.step_ms)
        agent[i * FRAME_SIZE : (i + 1) * FRAME_SIZE] = r.pcm
        for span in r.spans:
            events.append(
                {
                    "type": "span" if span.kind == "reference" else "persona_pin",
                    "frame": i,
                    "n": span.n_frames,
                    "prefill_ms": round(span.prefill_ms, 3),
                    "reference": span.reference,
                    "truncated": span.truncated,
                }
            )
        if r.text_token == RET_ID:
            events.append({"type": "ret", "frame": i, "time": round(i * FRAME_MS / 1000.0, 3)})
        if r.text_token >= 0:
            tokens.append(r.text_token)
        if args.trace:
            trace.append({"i": i, "text_token": r.text_token, "agent_codes": list(r.agent_codes)})

    engine.close_slot(slot)
    n = len(caller)
    write_wav(args.output_wav, np.stack([caller, agent[:n]], axis=1), SAMPLE_RATE)
    steps = np.asarray(step_ms)
    out: dict[str, Any] = {
        "model": engine.preset.name if engine.preset else str(args.checkpoint),
        "sample_rate": SAMPLE_RATE,
        "input_frames": n_frames,
        "transcript": engine.tokenizer.decode(tokens),
        "text_tokens": tokens,
        "events": events,
        "prompt": {
            "frames": prompt_frames,
            "prefill_ms": round(prompt_ms, 3),
            "persona": persona is not None,
        },
        "timing": {
            "load_s": round(load_s, 3),
            "step_ms_p50": round(float(np.percentile(steps, 50)), 3),
            "step_ms_p99": round(float(np.percentile(steps, 99)), 3),
        },
    }
    if args.trace:
        out["frames"] = trace
    args.output_json.write_text(json.dumps(out, indent=1))
    return 0
