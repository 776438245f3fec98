"""A failed accuracy check as the terminal shows it (issue 34): the value with the digits that
show the failure and the threshold beside it, and the stage whose checks failed marked ✗,
not ✓."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import trtpack
from trtpack.report import VerificationRow, shown_metric


def test_shown_metric_has_the_digits_that_show_the_side_of_the_threshold() -> None:
    assert shown_metric(0.99999987, 0.9999999) == "0.99999987"
    assert shown_metric(0.9036512, 0.99) == "0.9037"  # four decimals already show it
    assert shown_metric(0.99991, 0.9999) == "0.9999"  # a pass may round onto the threshold
    assert shown_metric(0.999999999999, None) == "1.0000"  # no threshold: four decimals
    row = VerificationRow("int8-vs-fp32", 0, "max", "x", "out", 0.1, 0.1, "cosine",
                          0.99999987, False, threshold=0.9999999)
    assert row.metric_text() == "cosine 0.99999987 < 0.9999999"


@pytest.mark.parametrize("gate", ["0.99999999"])
def test_a_failed_gate_shows_its_digits_and_the_stage_is_not_ticked(
        tmp_path: Path, cache_dir: Path, gate: str) -> None:
    """FP16 of tiny-bert against FP32 (cosine ~0.9999999x, which printed as 1.000000) under
    a gate it cannot meet, without the fallback: exit 1. FP16 as a GPU build serves it
    (``--target cpu`` serves FP32 and skips the conversion). The session cache: the precision
    stage, whose gate fails, runs; the stages before it are any tiny-bert build's."""
    out = tmp_path / "out"
    result = trtpack("build", "tiny-bert", "--target", "g5", "--no-engine", "--precision",
                     "fp16",
                     "--fallback", "off", "--set", f"verify.fp16.min_cosine={gate}",
                     "--out", str(out), "--cache-dir", str(cache_dir),
                     env={"COLUMNS": "200"})
    assert result.returncode == 1, result.stderr[-3000:]
    stage_lines = [line for line in result.stderr.splitlines() if " precision " in line]
    assert stage_lines and stage_lines[0].startswith("✗"), result.stderr
    assert "verification checks failed" in stage_lines[0]
    fails = [line for line in result.stderr.splitlines() if line.startswith("FAIL ")]
    assert fails, result.stderr
    for line in fails:
        m = re.search(r"worst sample \d+ cosine (\S+) < (\S+)", line)
        assert m is not None, line
        assert m.group(2) == gate and float(m.group(1)) < float(gate), line
        assert "1.000000" not in line, line
    report = json.loads((tmp_path / "out.failed" / "report.json").read_text())
    assert {s["name"]: s["status"] for s in report["stages"]}["precision"] == "failed"
    failed_rows = [r for r in report["verification"] if not r["passed"]]
    assert failed_rows and all(r["threshold"] == float(gate) for r in failed_rows)
