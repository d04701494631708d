"""conf/logging.yml is the file Kedro 1.7 loads (issue 11, item 10): info.log is written, one unwrapped line per
record."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import logging
from kedro.framework.project import LOGGING  # Kedro configures logging when this module is imported
logging.getLogger("prorag.logging_test").info("a long record %s end", "x" * 300)
"""


def test_kedro_loads_the_project_logging_config_and_info_log_does_not_wrap(project_copy: Path) -> None:
    assert not (project_copy / "conf" / "base" / "logging.yml").exists()  # Kedro would never read it there
    environment = {key: value for key, value in os.environ.items() if key != "KEDRO_LOGGING_CONFIG"}
    completed = subprocess.run([sys.executable, "-c", SCRIPT], cwd=project_copy, env=environment,
                               capture_output=True, text=True, timeout=60, check=True)
    log = project_copy / "info.log"
    assert log.is_file(), completed.stderr
    lines = log.read_text(encoding="utf-8").splitlines()
    (record,) = [line for line in lines if "prorag.logging_test" in line]
    assert record.endswith(f"a long record {'x' * 300} end")  # the whole record on one line
    assert "Using 'conf/logging.yml' as logging configuration" in log.read_text(encoding="utf-8")
