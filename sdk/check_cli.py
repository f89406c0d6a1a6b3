"""`duetaspan check`: the model's self-test (`duetaspan.model.check`) and, with `--config agent.toml` (or
`--no-model`), before it the agent's own parts: which ASR is configured and whether it loads, which router
model and whether it can be reached (its key variable set, or a server that needs none), and the side-effect
policy that follows from that. `--no-model` skips the duplex model (no GPU needed).

A command line is a composition root, so this is where the ASR adapter is built and tried; the model's part
never imports adapters. The exit status is 1 when the configured ASR does not load.

Example:
    $ duetaspan check --config agent.toml --no-model
    agent: agent.toml
      asr           whisper, local folder /models/tiny.en: loaded in 0.4 s, 1 s of silence in 0.1 s
      router        gpt-4.1-mini at https://api.openai.com/v1: key OPENAI_API_KEY is not set
      side effects  keywords (unset: keywords+llm only when the router can reach its model)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from duetaspan.config import AgentConfig
from duetaspan.errors import ConfigError


@dataclass
class AgentCheck:
    """What the agent part of `duetaspan check` found (also in `--json` under `agent`)."""

    source: str
    asr_kind: str
    asr: str
    asr_loaded: bool | None = None  # None: a remote ASR, not tried here
    asr_load_s: float | None = None
    asr_detail: str = ""
    router: str = ""
    router_reachable: bool = False
    router_detail: str = ""
    side_effects: str = ""
    problems: list[str] = field(default_factory=list)


def _asr_line(config: AgentConfig) -> str:
    asr = config.asr
    if asr.kind == "whisper":
        from duetaspan.adapters.asr.whisper import DEFAULT_MODEL, SIZES

        model = asr.model or DEFAULT_MODEL
        if Path(model).is_dir():
            return f"whisper, local folder {model}"
        default = "" if asr.model else ", the default"
        return (
            f"whisper {model} (a size: downloaded on first use{default})"
            if model in SIZES
            else f"whisper {model}"
        )
    if asr.kind == "openai":
        return f"openai {asr.model or 'whisper-1'} at {asr.url or config.router.base_url + ' (the router)'}"
    if asr.kind == "transcribe":
        return f"transcribe at {asr.url}"
    return "none (no question capture)"


def check_agent(config: AgentConfig, source: str) -> AgentCheck:
    """Build the configured ASR and try it (in-process whisper: load it and transcribe a second of silence)."""
    from duetaspan.adapters.asr import asr_from_config
    from duetaspan.agent.wiring import router_asr_config

    report = AgentCheck(source=source, asr_kind=config.asr.kind, asr=_asr_line(config))
    try:
        client = asr_from_config(router_asr_config(config))
    except ConfigError as exc:
        report.asr_loaded = False
        report.asr_detail = str(exc)
        report.problems.append(f"asr: {exc}")
        client = None
    if client is not None and config.asr.kind == "whisper":
        start = time.perf_counter()
        try:
            client.load()  # type: ignore[attr-defined]
            report.asr_load_s = time.perf_counter() - start
            start = time.perf_counter()
            asyncio.run(client.transcribe(np.zeros(16_000, dtype=np.float32), 16_000))
            report.asr_loaded = True
            report.asr_detail = (
                f"loaded in {report.asr_load_s:.1f} s, 1 s of silence in {time.perf_counter() - start:.1f} s"
            )
        except Exception as exc:  # ConfigError names the fix; anything else is the library's own
            report.asr_loaded = False
            report.asr_detail = str(exc)
            report.problems.append(f"asr: {exc}")
    elif client is not None and config.asr.kind != "none":
        report.asr_detail = "remote: not tried here"
    router = config.router
    report.router = f"{router.model} at {router.base_url}"
    report.router_reachable, report.router_detail = router.reachable()
    mode = router.side_effect_mode()
    unset = router.side_effects.mode is None
    report.side_effects = mode + (
        " (unset: keywords+llm because the router can reach its model)"
        if unset and mode == "keywords+llm"
        else " (unset: keywords+llm only when the router can reach its model)"
        if unset
        else " (set in [router.side_effects])"
    )
    return report


def render_agent(r: AgentCheck) -> str:
    asr_state = (
        "" if not r.asr_detail else (": " if r.asr_loaded is not False else ": FAILED: ") + r.asr_detail
    )
    return "\n".join(
        [
            f"agent: {r.source}",
            f"  asr           {r.asr}{asr_state}",
            f"  router        {r.router}: {r.router_detail}",
            f"  side effects  {r.side_effects}",
        ]
    )


def register(subparsers: Any) -> None:
    from duetaspan.model.check import register as register_model

    p = register_model(subparsers)
    p.add_argument("--config", type=Path, default=None, help="agent.toml: check its ASR and router too")
    p.add_argument("--no-model", action="store_true", help="only the agent's parts (ASR, router): no model")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The agent's parts (with `--config` or `--no-model`), then the model's self-test (unless `--no-model`)."""
    from duetaspan.model.check import run as run_model

    agent: AgentCheck | None = None
    if args.config is not None or args.no_model:
        config = AgentConfig.load(args.config) if args.config else AgentConfig()
        agent = check_agent(config, str(args.config) if args.config else "(defaults)")
        print(render_agent(agent))
    status = 1 if agent is not None and agent.problems else 0
    if args.no_model:
        if args.json is not None and agent is not None:
            args.json.write_text(json.dumps({"agent": asdict(agent), "ok": not agent.problems}, indent=1))
        return status
    model_status = run_model(args)
    if args.json is not None and agent is not None:  # the model's figures, with the agent's beside them
        data = json.loads(args.json.read_text())
        data["agent"] = asdict(agent)
        data["ok"] = bool(data.get("ok")) and not agent.problems
        args.json.write_text(json.dumps(data, indent=1))
    return max(status, model_status)


__all__ = ["AgentCheck", "check_agent", "register", "render_agent", "run"]
