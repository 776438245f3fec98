"""The report names what a build serves: a ``--precision auto`` build is built as INT8 beside
the FP32 model, and its report is titled with the candidate the CPU model stage chose."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtpack.report import BuildReport, StageResult
from trtpack.report_page.html import render_report_html


def auto_report(winner: str | None) -> BuildReport:
    """An auto build's report as the runner has it before naming what is served (the
    precision stages built int8; the CPU model stage's metrics hold the choice)."""
    metrics = {} if winner is None else {"auto": {"winner": winner, "reason": "timed"}}
    return BuildReport(model="tiny-bert", precision="int8", target="cpu", profiles=[],
                       out_dir="/nonexistent",
                       stages=[StageResult("cpu_model", "ok", metrics=metrics)])


@pytest.mark.parametrize("winner", ["fp32", "int8"])
def test_an_auto_build_is_titled_with_the_precision_it_serves(winner: str) -> None:
    report = auto_report(winner)
    report.name_served_precision()
    assert report.precision == winner
    page = render_report_html(report, Path("/nonexistent"))
    assert f"<title>trtpack · tiny-bert {winner}</title>" in page


def test_a_build_without_a_choice_keeps_its_precision() -> None:
    report = auto_report(None)
    report.name_served_precision()
    assert report.precision == "int8"
