"""The whole suite stops before it starts, with one line, where pytest's temporary folder has
less free space than its builds need (tests/conftest.py ``pytest_sessionstart``), rather than
failing late in unrelated tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, disk_shortfall


def test_the_shortfall_line_names_the_folder_and_the_setting(tmp_path: Path) -> None:
    assert disk_shortfall(str(tmp_path), 0.001) is None
    line = disk_shortfall(str(tmp_path), 1e9)
    assert line is not None and line.startswith("only ") and str(tmp_path) in line \
        and "SUITE_DISK_GB" in line


def test_a_whole_suite_run_without_the_disk_it_needs_stops_before_any_test() -> None:
    """Collect-only, so that a guard that failed to stop it costs seconds, not the suite."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--co", "tests"],
        capture_output=True, text=True, cwd=ROOT, timeout=300, check=False,
        env={**os.environ, "TRTPACK_TEST_DISK_GB": "1e9"})
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "the whole suite needs about 1e+09 GB" in done.stdout + done.stderr
    assert "test_" not in done.stdout.replace("tests/conftest.py", "")
