"""`duetaspan.logs` as the command line uses it: `main()` run in-process leaves no bridge behind."""

from __future__ import annotations

import logging

from loguru import logger as loguru_logger

from duetaspan.cli import main


def test_cli_main_in_process_takes_its_log_bridge_out_again(capsys):
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    for _ in range(2):
        assert main([]) == 0  # prints the help; bridges loguru into logging while it runs
    capsys.readouterr()
    assert root.handlers == handlers and root.level == level

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep()
    root.addHandler(keep)
    try:
        loguru_logger.info("one loguru line after two in-process runs")
    finally:
        root.removeHandler(keep)
    # a bridge left installed by either run would forward this line into `logging`
    assert [r for r in records if "in-process runs" in r.getMessage()] == []
