"""The documentation is exercised: the generated configuration reference is current, the README's phone
agent is the tested file, every shell command of the README, docs/ and the examples' READMEs sits in a ```bash
block (no untagged blocks, no `$ ` prompts), and each is either run here (the cheap ones: --help, tools
list/call, infer on tiny-random, the docs generator) or mapped to the test or CI step that exercises it (serve,
call, the test suite itself)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import AUDIO_FIXTURES, REPO_ROOT

DOCS = sorted(
    [
        REPO_ROOT / "README.md",
        *(REPO_ROOT / "docs").glob("*.md"),
        *(REPO_ROOT / "examples").glob("*/README.md"),
    ]
)
BLOCK = re.compile(r"^(?P<indent>[ \t]*)```bash[ \t]*\n(?P<body>.*?)^(?P=indent)```", re.S | re.M)

RUN = "run"
# (pattern on the command, how it is covered). A test reference "path::name" must exist; RUN runs it below.
COVERAGE: list[tuple[str, str]] = [
    (r"^python3? -m venv \.venv && \. \.venv/bin/activate && pip install -e \. && duetaspan serve --webrtc "
     r"--model tiny-random --allow-force-ret$",
     "tests/adapters/webrtc/test_browser.py::test_page_in_chromium_connects_streams_both_ways_and_shows_a_forced_span"),
    (r"^bash scripts/test\.sh$", ".ci/run"),
    (r"^python3? -m venv \.venv && \. \.venv/bin/activate$", "scripts/test.sh"),
    (r"^pip install -e \.$", "scripts/test.sh"),
    (r"^pip install torch --index-url ", "external: PyTorch's own CUDA wheels"),
    (r"^pip install mcp-server-time$", "scripts/test.sh"),
    (r"^pip install 'duetaspan\[sip-codecs\]'", "scripts/test.sh (the SIP codec tests skip without it)"),
    (r"^export [A-Z_]+=", "environment only"),
    (r"^(ngrok|cloudflared|ssh|ray) ", "external tool"),  # `ray start`: Ray's own cluster command
    (r"^python -m pytest -q examples/(restaurant|concierge|bank|reminder|browser_demo|pipecat_twilio)$", "examples"),
    (r"^pip install \"pipecat-ai\[runner\]", "external: Pipecat's runner extra"),
    (r"^python examples/pipecat_twilio/bot\.py -t twilio -x ",
     "examples/pipecat_twilio/test_pipecat_twilio.py::test_pipecat_development_runner_starts_the_bot"),
    (r"^duetaspan --help$", RUN),
    (r"^duetaspan tools (list|call) ", RUN),
    (r"^cd examples/\w+ && duetaspan tools list --config agent\.toml$", RUN),
    (r"^duetaspan infer --model tiny-random ", RUN),
    (r"^duetaspan view \S+\.json( |$)",
     "tests/view/test_viewer.py::test_view_command_renders_a_recorded_call_into_one_offline_page"),
    (r"^python scripts/gen_config_docs\.py( --check)?$", RUN),
    (r"^duetaspan tools serve-mcp --http ",
     "tests/tools/test_cli.py::test_serve_mcp_http_driven_by_mcp_client"),
    (r"^duetaspan tools serve-mcp ", "tests/tools/test_cli.py::test_serve_mcp_stdio_driven_by_mcp_client"),
    (r"^duetaspan serve (--twilio )?--webrtc --ray ",
     "tests/adapters/ray/test_webrtc.py::test_page_calls_are_answered_by_a_replica_and_hold_its_slots"),
    (r"^duetaspan serve --twilio --ray ",
     "tests/adapters/ray/test_cli.py::test_serve_ray_cli_deploys_answers_and_stops_on_ctrl_c"),
    (r"^duetaspan serve --twilio --config \S+$",
     "tests/test_serve_cli.py::test_serve_twilio_cli_takes_public_url_and_port_from_the_config"),
    (r"^duetaspan serve --twilio .*--engine-process",
     "tests/pipeline/test_engine_process.py::test_agent_engine_process_option_admits_and_refuses_calls"),
    (r"^duetaspan serve --twilio ", "tests/test_serve_cli.py::test_serve_twilio_cli_answers_a_recorded_call"),
    (r"^python -m pytest -q examples/sip_pbx$", "examples"),
    (r"^duetaspan campaign (start|status|export) ",
     "tests/outbound/test_campaign_serve.py::test_campaign_survives_kill_9_and_the_cli_contract"),
    (r"^duetaspan campaign (pause|resume|cancel|dnc) ",
     "tests/outbound/test_campaign_serve.py::test_campaign_survives_kill_9_and_the_cli_contract"),
    (r"^pip install 'duetaspan\[postgres\]'$", "scripts/test.sh (the store's PostgreSQL tests skip without it)"),
    (r"^duetaspan serve --sip --config agent\.toml$",
     "tests/outbound/test_campaign_serve.py::test_campaign_survives_kill_9_and_the_cli_contract"),
    (r"^duetaspan serve --sip --config examples/sip_pbx/agent\.toml$",
     "examples/sip_pbx/test_sip_pbx.py::test_front_desk_transfers_to_reception_by_refer"),
    (r"^duetaspan serve --sip ", "tests/adapters/sip/test_serve_sip.py::test_serve_sip_answers_sipstone_uac_calls"),
    (r"^duetaspan serve --webrtc --config examples/browser_demo/agent\.toml",
     "examples/browser_demo/test_browser_demo.py::test_browser_demo_page_call_lands_a_span"),
    (r"^duetaspan serve --webrtc --model tiny-random --allow-force-ret$",
     "tests/adapters/webrtc/test_browser.py::test_page_in_chromium_connects_streams_both_ways_and_shows_a_forced_span"),
    (r"^curl -H \"Authorization: Bearer \$DUETASPAN_METRICS_TOKEN\" http://\S+/metrics$",
     "tests/observability/test_metrics_serve.py::test_a_twilio_call_against_the_real_server_shows_up_in_metrics"),
    (r"^curl -X POST -H \"Authorization: Bearer \$DUETASPAN_ADMIN_TOKEN\" http://\S+/admin/drain$",
     "tests/reliability/test_roles.py::test_the_page_token_places_calls_only_and_the_admin_token_drains"),
    (r"^pip install 'duetaspan\[tracing\]'$",
     "tests/observability/test_otlp_export.py::test_spans_are_exported_over_otlp_http_to_the_configured_endpoint"),
    (r"^duetaspan call sips?:\S+ --server http://\S+$",
     "tests/adapters/sip/test_dial_cli.py::test_call_cli_dials_through_serve_sip_answered_busy_and_refused"),
    (r"^duetaspan call \+\d+ --config \S+$",
     "tests/test_serve_cli.py::test_call_cli_takes_number_and_url_from_the_config"),
    (r"^duetaspan call \+\d+ --from \+\d+ --public-url \S+( --config examples/reminder/agent\.toml)?$",
     "tests/test_serve_cli.py::test_call_cli_places_the_call_through_rest"),
    (r"^benchmarks/gpu_suite\.sh ", "tests/model/test_batching_suite.py::test_gpu_suite_smoke_on_cpu"),
    (r"^duetaspan eval benchmark_data_v2\.json --format fdb-v3 --text .*--export-fdb ",
     "tests/eval/test_fdb_export.py::test_text_eval_of_the_published_format_exports_the_scorers_layout_and_numbers"),
    (r"^duetaspan eval benchmark_data_v2\.json --format fdb-v3 --config \S+ --model duetaspan-7b --audio-dir .*--export-fdb ",
     "tests/eval/test_fdb_audio.py::test_fdb_v3_audio_eval_runs_recordings_and_tts_and_exports_the_audio_fields"),
    (r"^python3? \S*evaluate_(tool_calls|pass_rate)\.py ",
     "external: the benchmark's own scorers (tests/eval/test_fdb_export.py checks their rules by hand)"),
    (r"^duetaspan eval benchmark_data_v2\.json --format fdb-v3 --text ",
     "tests/eval/test_cli_text.py::test_fdb_v3_text_eval_uses_the_benchmarks_tools_and_scoring"),
    # the GPU run (duetaspan-7b, the benchmark's audio) is the audio mode the tiny-random test drives on CPU
    (r"^duetaspan eval benchmark_data_v2\.json --format fdb-v3 --config \S+ --model duetaspan-7b --audio-dir ",
     "tests/eval/test_audio.py::test_audio_eval_on_tiny_random_plays_calls_into_the_full_agent"),
    (r"^duetaspan eval \S+ --text --config \S+ ",
     "tests/eval/test_cli_text.py::test_text_eval_scores_hand_made_scenarios_exactly"),
    (r"^duetaspan eval \S+ --config \S+ --tts-command ",
     "tests/eval/test_audio.py::test_audio_eval_on_tiny_random_plays_calls_into_the_full_agent"),
    (r"^duetaspan check ", "tests/model/test_check.py::test_check_cli_on_cpu_tiny_random"),
    (r"^python -m pytest -q -m cuda_logic$", "scripts/test.sh"),
    # the smoke test runs benchmarks/capacity.py (through gpu_suite.sh) on CPU with shortened counts; the CUDA
    # variant is the same script on a GPU
    (r"^python benchmarks/capacity\.py( |$)", "tests/model/test_batching_suite.py::test_gpu_suite_smoke_on_cpu"),
    # docs/testing.md: its tests run from a wheel of the repository in a clean venv
    (r"^pip install 'duetaspan\[testing\]'$",
     "tests/testing/test_wheel.py::test_a_users_test_passes_against_the_built_wheel"),
    (r"^python -m duetaspan\.testing\.(llm|asr) --port \d+ --script \S+$",
     "tests/testing/test_servers.py::test_command_line_serves_a_script_file"),
    (r"^DUETASPAN_TEST_ROUTER=real python -m pytest -q$",
     "tests/testing/test_judge.py::test_real_mode_uses_the_agents_router_and_the_judge_decides"),
    # the real judge is a model at --base-url; CI runs the same command against a scripted judge server
    (r"^python benchmarks/side_effect_policy\.py --mode (llm|keywords\+llm) --base-url ",
     "tests/router/test_side_effect_benchmark.py::test_llm_mode_against_a_scripted_judge"),
    (r"^python benchmarks/side_effect_policy\.py( --show| --check| --json)*$",
     "tests/router/test_side_effect_benchmark.py::test_keyword_mode_meets_the_goal"),
    # docs/evals.md's offline recipe: its three commands run as written (port aside)
    (r"^python -m duetaspan\.testing\.llm --port 8004 --script router_script\.json &$",
     "tests/eval/test_docs_sample.py::test_the_offline_recipe_runs_as_written"),
    (r"^printf '\[router\]\\napi_key_env = \"\"\\n' > offline\.toml$",
     "tests/eval/test_docs_sample.py::test_the_offline_recipe_runs_as_written"),
    # docs/evals.md: the published FDB-v3 file offline; the benchmark runs the same server and eval commands
    (r"^python benchmarks/fdb_v3\.py benchmark_data_v2\.json( --one-reply| --json| --keep \S+)*$",
     "tests/eval/test_fdb_benchmark.py::test_the_benchmark_prints_the_scores_the_export_and_the_guard_on_the_action_calls"),
    (r"^python -m duetaspan\.testing\.llm --port 8004 --script fdb-offline/router_script\.json &$",
     "tests/eval/test_fdb_benchmark.py::test_the_benchmark_prints_the_scores_the_export_and_the_guard_on_the_action_calls"),
    # gpu_suite.sh's smoke test runs benchmarks/burst.py on CPU (1 live + 1 opening call, old and new modes)
    (r"^python benchmarks/burst\.py( |$)", "tests/model/test_batching_suite.py::test_gpu_suite_smoke_on_cpu"),
    # docs/outbound.md: the detect command on the committed fixtures, and the answer-detection benchmark
    (r"^duetaspan detect tests/fixtures/answers/\S+\.wav( tests/fixtures/answers/\S+\.wav)* --json$",
     "tests/outbound/test_detector.py::test_detect_command_json_contract_at_8_16_and_24_khz"),
    (r"^duetaspan call \+15551234567 --server http://127\.0\.0\.1:8080 --detect$",
     "tests/outbound/test_call_detect_cli.py::test_call_detect_prints_who_answered"),
    (r"^python benchmarks/answer_detection\.py( --batch (tuning|heldout([2-9]|1[012])?))?$",
     "tests/outbound/test_answer_benchmark.py::test_a_small_batch_is_reproducible_and_scored"),
    # docs/webhooks.md, docs/privacy.md: the outbox and retention commands, run as written against a store
    (r"^duetaspan (webhooks (list|replay)|records (purge|delete)) --config agent\.toml ",
     "tests/webhooks/test_retention.py::test_the_commands"),
    (r"^python benchmarks/redaction\.py$", "tests/webhooks/test_redact.py::test_the_benchmark_runs_and_meets_its_goal"),
]  # fmt: skip


@dataclass(frozen=True)
class Command:
    text: str
    source: str


def documented_commands() -> list[Command]:
    """Every command line of every ```bash block (continuations joined, comments and blanks dropped; a comment
    after a command starts after two spaces or more)."""
    found: list[Command] = []
    for path in DOCS:
        for match in BLOCK.finditer(path.read_text(encoding="utf-8")):
            body = re.sub(r"\\\n\s*", " ", match["body"])
            for line in body.splitlines():
                line = re.sub(r"\s{2,}#.*$", "", line).strip()  # a trailing comment is not the command
                if line and not line.startswith("#"):
                    found.append(Command(line, str(path.relative_to(REPO_ROOT))))
    return found


def coverage(command: str) -> str | None:
    for pattern, how in COVERAGE:
        if re.search(pattern, command):
            return how
    return None


def test_the_readmes_documentation_list_links_every_page_once():
    section = README_DOCS.search((REPO_ROOT / "README.md").read_text(encoding="utf-8"))
    assert section, "README.md has no '## Documentation' section"
    links = re.findall(r"\]\(([^)#]+)\)", section[1])
    assert len(links) == len(set(links)), f"pages listed twice: {sorted({x for x in links if links.count(x) > 1})}"
    pages = {f"docs/{p.name}" for p in (REPO_ROOT / "docs").glob("*.md")}
    assert pages - set(links) == set(), "docs pages missing from the README's documentation list"


README_DOCS = re.compile(r"^## Documentation\n(.*?)^## ", re.S | re.M)


def test_every_documented_command_is_covered():
    commands = documented_commands()
    assert len(commands) > 20, "the extractor found too few commands"
    uncovered = [f"{c.source}: {c.text}" for c in commands if coverage(c.text) is None]
    assert not uncovered, "commands in the docs that no test covers:\n" + "\n".join(uncovered)
    for c in commands:
        how = coverage(c.text)
        assert how is not None
        if "::" in how:  # the mapped test exists
            path, name = how.split("::")
            assert re.search(rf"^(async )?def {name}\(", (REPO_ROOT / path).read_text(), re.M), how
        elif how in (".ci/run", "scripts/test.sh"):
            assert (REPO_ROOT / how).is_file()
        elif how == "examples":
            name = c.text.rsplit("/", 1)[1]
            assert list((REPO_ROOT / "examples" / name).glob("test_*.py")), c.text


FENCE = re.compile(r"^[ \t]*```(?P<lang>\S*)", re.M)
# a line in a block that reads like a shell command: a prompt, or one of the commands the docs use
SHELL_LINE = re.compile(
    r"^\s*(\$ |(duetaspan|python3?|pip|bash|export|ray|ngrok|cloudflared|curl|cd|benchmarks/)\b)", re.M
)


def fenced_blocks(path: Path) -> list[tuple[int, str, str]]:
    """(line number, language tag, body) of every fenced block."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match:
            start, lang, body = i + 1, match["lang"], []
            i += 1
            while i < len(lines) and not FENCE.match(lines[i]):
                body.append(lines[i])
                i += 1
            blocks.append((start, lang, "\n".join(body)))
        i += 1
    return blocks


def test_shell_commands_are_only_in_bash_blocks_without_prompts():
    """Commands hidden in untagged or `text` blocks, or behind `$ ` prompts, would escape the checks above."""
    problems = []
    for path in DOCS:
        for line, lang, body in fenced_blocks(path):
            where = f"{path.relative_to(REPO_ROOT)}:{line}"
            if not lang:
                problems.append(f"{where}: untagged block (```bash for commands, ```text for diagrams)")
            elif lang == "bash" and re.search(r"^\s*\$ ", body, re.M):
                problems.append(f"{where}: `$ ` prompt in a bash block (write the bare command)")
            elif lang not in ("bash", "python", "toml", "json", "yaml") and SHELL_LINE.search(body):
                problems.append(f"{where}: a shell command in a ```{lang} block")
    assert not problems, "\n".join(problems)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Path:
    """A working directory that looks like the repository root (examples/, scripts/, docs/ linked) and holds
    a caller recording, so documented commands run as written without writing into the checkout."""
    root = tmp_path_factory.mktemp("docs-sandbox")
    for name in ("examples", "scripts", "docs"):
        (root / name).symlink_to(REPO_ROOT / name)
    shutil.copy(AUDIO_FIXTURES / "time_tokyo.wav", root / "caller.wav")
    return root


def _env(sandbox: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TWILIO_", "OPENAI_", "HF_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(REPO_ROOT)
    for var, name in (("RESTAURANT_DB", "r.sqlite3"), ("BANK_DB", "b.sqlite3"), ("REMINDER_DB", "m.sqlite3")):
        env[var] = str(sandbox / name)
    return env


def _runnable() -> list[str]:
    return sorted({c.text for c in documented_commands() if coverage(c.text) == RUN})


@pytest.mark.parametrize("command", _runnable())
def test_cheap_documented_commands_run(command, sandbox):
    argv = shlex.split(command)
    cwd = sandbox
    if argv[0] == "cd":  # "cd DIR && CMD"
        cwd, argv = sandbox / argv[1], argv[3:]
    if argv[0] == "python":
        argv[0] = sys.executable
    if argv[0] == "duetaspan":
        argv = [sys.executable, "-m", "duetaspan", *argv[1:]]
    if argv[1:2] == ["scripts/gen_config_docs.py"] and "--check" not in argv:
        argv.append("--check")  # never rewrite the checkout from a test
    result = subprocess.run(argv, cwd=cwd, env=_env(sandbox), capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    if "infer" in argv:
        assert (sandbox / "out.wav").stat().st_size > 44 and (sandbox / "out.json").exists()
    if "tools" in argv and "call" in argv:
        assert '"ok": true' in result.stdout


def test_configuration_reference_is_generated_from_the_models():
    result = subprocess.run(
        [sys.executable, "scripts/gen_config_docs.py", "--check"],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr + "\nrun: python scripts/gen_config_docs.py"
    text = (REPO_ROOT / "docs" / "configuration.md").read_text()
    from duetaspan.config import AgentConfig

    for section in AgentConfig.model_fields:
        if section != "base_dir":
            assert f"[{section}]" in text or f"[[{section}]]" in text, section
    assert "| `deadline_s` | float | `2.5` |" in text


def test_readme_phone_agent_is_the_tested_file():
    readme = (REPO_ROOT / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", readme, re.S)
    assert block and block[1] == (REPO_ROOT / "examples" / "phone_agent.py").read_text()
    assert readme.lstrip().startswith("# duetaspan")
    first_blocks = BLOCK.findall(readme)[:2]
    assert [b[1].strip() for b in first_blocks][1] == "bash scripts/test.sh"
    assert "duetaspan serve --webrtc --model tiny-random" in first_blocks[0][1]
