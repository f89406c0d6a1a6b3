"""The pytest plugin and the package's import surface: importing them loads neither torch nor Pipecat, pytest
finds the plugin through its `pytest11` entry point (in a folder outside the repository, with no conftest),
and a user's module that imports everything from `duetaspan.testing` gets only its own tests collected."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

HEAVY = ("torch", "pipecat", "duetaspan.agent", "duetaspan.model")


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}


def test_importing_the_plugin_and_the_package_is_cheap():
    code = (
        "import json, sys\n"
        "import duetaspan.testing.plugin, duetaspan.testing\n"
        "duetaspan.testing.tool_call, duetaspan.testing.ScriptedLLM, duetaspan.testing.scripted_call\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m in {HEAVY!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=_clean_env(), check=True)  # fmt: skip
    assert json.loads(out.stdout) == [], out.stdout


USER_MODULE = """
from duetaspan.testing import *  # noqa: F403 - everything a user might import
from duetaspan.testing import Outcome, ScriptedASR, ScriptedCall, ScriptedLLM, scripted_call, tool_call


async def helper_not_a_test():
    pass


def test_mine(request):
    plugin = request.config.pluginmanager.get_plugin("duetaspan.testing.plugin")
    assert plugin is not None and plugin.__name__ == "duetaspan.testing.plugin"
"""


def test_pytest_loads_the_plugin_by_entry_point_and_collects_only_the_users_tests(tmp_path):
    (tmp_path / "test_user.py").write_text(USER_MODULE)
    run = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-W",
        "error::pytest.PytestCollectionWarning",
    ]
    collected = subprocess.run([*run, "--collect-only", "-q"], cwd=tmp_path, capture_output=True, text=True,
                               timeout=300, env=_clean_env())  # fmt: skip
    assert collected.returncode == 0, collected.stdout + collected.stderr
    tests = [line for line in collected.stdout.splitlines() if "::" in line]
    assert tests == ["test_user.py::test_mine"], collected.stdout
    fixtures = subprocess.run([*run, "--fixtures", "-q"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, env=_clean_env())  # fmt: skip
    for name in ("tiny_engine", "scripted_llm", "scripted_asr"):
        assert re.search(rf"^{name}( \[session scope\])? -- .*plugin.py", fixtures.stdout, re.M), (
            fixtures.stdout
        )
    assert "fixtures defined from duetaspan.testing.plugin" in fixtures.stdout
    ran = subprocess.run([*run, "-q"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env=_clean_env())  # fmt: skip
    assert ran.returncode == 0 and "1 passed" in ran.stdout, ran.stdout + ran.stderr
