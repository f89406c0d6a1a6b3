"""`duetaspan eval`: measure an agent on scenario files or Full-Duplex-Bench v3 (see docs/evals.md).

Relied-on contract (issue #17; keep these flags and fields exactly):

    duetaspan eval FILE [--format fdb-v3] [--text] [--config agent.toml] [--model PRESET]
                   [--router-base-url URL] [--router-model NAME] [--report report.json] [--html report.html]
                   [--jobs N] [--export-fdb DIR [--provider NAME]]

`report.json` has `pass_at_1` (0..1) at the top level and `scenarios: [{"id", "passed", ...}]` with each
scenario's expected and actual calls. `--export-fdb DIR` (issue #22) writes exactly
`DIR/<example_id>_<24 hex>/result_<provider>.json` (provider default `duetaspan`) for FDB-v3's own scorers.
Exit status 0 when the run completed, whatever the scores; non-zero on errors (unreadable file, bad
configuration, or every scenario failed with an error: then the first error and its fix are printed instead
of a table of zeros). An LLM that fails or times out fails its scenario only.

Example:
    duetaspan eval scenarios.yaml --text --config agent.toml --report report.json
    duetaspan eval benchmark_data_v2.json --format fdb-v3 --text --router-base-url http://127.0.0.1:8000/v1 \\
        --router-model qwen3-8b --report fdb.json --html fdb.html --jobs 8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from duetaspan.errors import ConfigError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "eval",
        help="score an agent's tool calls on scenario files or Full-Duplex-Bench v3",
        description="Run scenarios through the agent (--text: its router only; default: the full agent on "
        "audio) and score tool selection, arguments and pass@1. See docs/evals.md.",
    )
    p.add_argument("file", type=Path, help="scenario file (.yaml/.json) or FDB-v3 benchmark_data_v2.json")
    p.add_argument("--format", choices=("duetaspan", "fdb-v3"), default="duetaspan", help="the file's format")
    p.add_argument("--text", action="store_true", help="text mode: the router only, no audio or duplex model")
    p.add_argument("--config", type=Path, help="agent.toml (router, tools, persona, ASR, ...)")
    p.add_argument("--model", help="model preset for audio mode (e.g. duetaspan-7b, tiny-random)")
    p.add_argument("--router-base-url", help="the router LLM's OpenAI-compatible URL (overrides the config)")
    p.add_argument("--router-model", help="the router LLM's model name (overrides the config)")
    p.add_argument("--report", type=Path, help="write report.json here")
    p.add_argument("--html", type=Path, help="write an HTML report here")
    p.add_argument("--jobs", type=int, default=1, help="scenarios run at once (audio: engine slots)")
    p.add_argument(
        "--export-fdb",
        type=Path,
        metavar="DIR",
        help="also write DIR/<example_id>_<24 hex>/result_<provider>.json, the layout FDB-v3's scorers read",
    )
    p.add_argument(
        "--provider",
        default="duetaspan",
        help="the provider name in result_<provider>.json (the scorers' --provider; default duetaspan)",
    )
    p.add_argument("--judge-base-url", help="optional LLM judge for arguments (OpenAI-compatible URL)")
    p.add_argument("--judge-model", default="gpt-4o", help="the judge's model name (default gpt-4o)")
    p.add_argument("--max-chain", type=int, default=4, help="text mode: most tool calls per caller turn")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before a scenario is given up")
    audio = p.add_argument_group("audio mode")
    audio.add_argument(
        "--tts-command",
        help="renders turns without audio: a command with {text} and {out} (a wav path) placeholders",
    )
    audio.add_argument("--audio-dir", type=Path, help="FDB-v3 audio (<dir>/<id>_<speaker>/input.wav)")
    audio.add_argument("--gap", type=float, default=2.0, help="seconds of silence after each caller turn")
    audio.add_argument("--tail", type=float, default=3.0, help="seconds of silence after the last turn")
    audio.add_argument(
        "--force-ret",
        action="store_true",
        help="the harness forces <ret> after each routed turn and the model never asks itself "
        "(for models that do not ask, e.g. tiny-random)",
    )
    audio.add_argument("--device", help="cuda, cpu or auto (default from the config)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _config(args: argparse.Namespace) -> Any:
    from duetaspan.config import AgentConfig

    if args.config is not None:
        if not args.config.is_file():
            raise ConfigError(f"--config {args.config}: no such file")
        config = AgentConfig.load(args.config)
    else:
        config = AgentConfig()
    if args.router_base_url:
        config.router.base_url = args.router_base_url
    if args.router_model:
        config.router.model = args.router_model
    if args.model:
        config.model.preset = args.model
    if args.device:
        config.model.device = args.device
    return config


def _suite(args: argparse.Namespace) -> Any:
    if not args.file.is_file():
        raise ConfigError(f"{args.file}: no such scenario file")
    if args.format == "fdb-v3":
        from duetaspan.eval.fdb_v3 import load_fdb_v3

        if args.audio_dir is not None and not args.audio_dir.is_dir():
            raise ConfigError(f"--audio-dir {args.audio_dir}: no such folder")
        suite = load_fdb_v3(args.file, audio_dir=args.audio_dir)
        if args.audio_dir is not None and not args.text and not args.tts_command:
            # the released audio covers part of the scenarios: run those that have a recording
            suite.scenarios = [s for s in suite.scenarios if s.audio is not None]
            if not suite.scenarios:
                raise ConfigError(f"--audio-dir {args.audio_dir}: no <id>_<speaker>/input.wav recordings")
        return suite
    from duetaspan.eval.scenario import load_suite

    return load_suite(args.file)


async def run(args: argparse.Namespace) -> int:
    """Load the suite and the agent's configuration, run every scenario, write the reports."""
    from duetaspan.eval.report import summary_table, write_html, write_json
    from duetaspan.eval.run import llm_judge, run_suite

    if args.jobs < 1:
        raise ConfigError("--jobs must be at least 1")
    if args.export_fdb is not None:
        from duetaspan.eval.fdb_export import check_provider

        check_provider(args.provider)
        if args.export_fdb.exists() and not args.export_fdb.is_dir():
            raise ConfigError(f"--export-fdb {args.export_fdb}: exists and is not a folder")
    suite = _suite(args)
    config = _config(args)
    judge_client = None
    if args.judge_base_url:
        from duetaspan.adapters.llm import ChatClient

        judge_client = ChatClient(args.judge_base_url, args.judge_model, timeout_s=30.0)
    settings = {
        "router": {
            "base_url": config.router.base_url,
            "model": config.router.model,
            "mode": config.router.mode,
        },
        "jobs": args.jobs,
    }
    if args.text:
        from duetaspan.eval.text import TextRunner

        runner: Any = TextRunner(config, suite, max_chain=args.max_chain, timeout_s=args.timeout)
    else:
        from duetaspan.eval.audio import AudioRunner

        runner = AudioRunner(
            config,
            suite,
            jobs=args.jobs,
            tts_command=args.tts_command,
            gap_s=args.gap,
            tail_s=args.tail,
            force_ret=args.force_ret,
            max_chain=args.max_chain,
            timeout_s=args.timeout,
        )
        runner.check_audio()  # missing recordings are a usage error, found before the model loads
        settings |= {"model": config.model.preset, "force_ret": args.force_ret}
    try:
        async with runner:
            report = await run_suite(
                runner,
                suite,
                jobs=args.jobs,
                mode="text" if args.text else "audio",
                judge=llm_judge(judge_client) if judge_client is not None else None,
                progress=False if args.no_progress else None,
                settings=settings,
            )
    finally:
        if judge_client is not None:
            await judge_client.aclose()
    if args.report:
        write_json(report, args.report)
    if args.html:
        write_html(report, args.html)
    if args.export_fdb is not None:
        from duetaspan.eval.fdb_export import write_export

        files = write_export(suite, report, args.export_fdb, provider=args.provider)
        print(f"FDB-v3 results: {len(files)} result_{args.provider}.json under {args.export_fdb} (score them with "
              f"the benchmark's evaluate_tool_calls.py / evaluate_pass_rate.py --provider {args.provider})")  # fmt: skip
    from duetaspan.eval.advice import explain_errors

    advice = explain_errors(report, config.router, args.report)
    if report["errors"] and report["errors"] == report["n"]:  # nothing was measured: no table of zeros
        print("\n".join(advice), file=sys.stderr)
        return 1
    print(summary_table(report))
    if advice:
        print("\n".join(advice), file=sys.stderr)
    return 0
