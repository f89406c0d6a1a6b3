"""The package installs under the design's layout and the command line answers."""

from __future__ import annotations

import subprocess
import sys

import duetaspan
from duetaspan import cli
from duetaspan.model import convention
from tests import support


def test_layout_maps_to_one_import_package():
    import duetaspan.adapters
    import duetaspan.tools

    assert duetaspan.__file__.replace("\\", "/").endswith("sdk/__init__.py")
    assert duetaspan.tools.__file__.replace("\\", "/").endswith("tools/__init__.py")
    assert duetaspan.adapters.__file__.replace("\\", "/").endswith("adapters/__init__.py")


def test_cli_version_and_help(capsys):
    rc = subprocess.run([sys.executable, "-m", "duetaspan", "--version"], capture_output=True, text=True)
    assert rc.returncode == 0 and rc.stdout.strip() == f"duetaspan {duetaspan.__version__}"
    rc = subprocess.run(["duetaspan", "--help"], capture_output=True, text=True)
    assert rc.returncode == 0 and "usage: duetaspan" in rc.stdout
    assert cli.main([]) == 0


def test_convention_constants():
    assert len(convention.DELAYS) == convention.N_STREAMS == 17
    assert (convention.TEXT_PAD_ID, convention.RET_ID) == (3, 4)
    assert (convention.SPAN_OPEN_ID, convention.SPAN_CLOSE_ID) == (12, 13)
    assert convention.FRAME_SIZE == convention.SAMPLE_RATE / convention.FRAME_RATE


def test_shared_fixtures_load():
    pcm, sr = support.load_wav("greeting")
    assert sr == 24_000 and pcm.dtype.name == "float32" and len(pcm) > sr
    assert len(support.load_ulaw("greeting")) > 8000
    msgs = support.load_twilio_stream("greeting")
    assert msgs[0]["event"] == "connected" and msgs[1]["event"] == "start"
    assert msgs[-1]["event"] == "stop"
    assert "greeting" in support.fixture_names()


def test_ctrl_c_stops_a_command_without_a_traceback(capsys):
    import argparse

    def interrupted(args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    original = cli.build_parser

    def parser_with_a_command(command: str | None = None) -> argparse.ArgumentParser:
        parser = original()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.add_parser("sleepy").set_defaults(func=interrupted)
        return parser

    cli.build_parser = parser_with_a_command
    try:
        assert cli.main(["sleepy"]) == 130
    finally:
        cli.build_parser = original
    assert "stopped" in capsys.readouterr().err


def test_a_command_line_imports_only_its_own_commands_module():
    """`duetaspan call ...` (a client that posts to a server) loads neither the model nor the detector: only the
    module of the sub-command it names; `--help` alone still lists every command."""
    code = (
        "import sys; from duetaspan import cli; cli.build_parser(cli.command_of(sys.argv[1:]))."
        "parse_known_args(sys.argv[1:]); print(' '.join(sorted(sys.modules)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code, "call", "sip:7002@127.0.0.1"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "duetaspan.adapters.twilio.call_cli" in loaded
    others = [module for module, names in cli.COMMANDS if "call" not in names]
    assert [m for m in others if m in loaded] == [] and "torch" not in loaded and "scipy" not in loaded
    assert cli.command_of(["-v", "serve", "--sip"]) == "serve" and cli.command_of(["--version"]) is None
    everything = subprocess.run(
        [sys.executable, "-m", "duetaspan", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert all(name in everything for _, names in cli.COMMANDS for name in names)
