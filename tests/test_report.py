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


@pytest.mark.parametrize("key", ["int8_weight_layers", "int8_weight_matmuls"])
def test_the_cpu_int8_weight_layer_count_reads_from_new_and_older_reports(key: str) -> None:
    """report.json calls the served CPU model's count of Conv/MatMul/Gemm on integer
    kernels ``int8_weight_layers``; reports written before named it ``int8_weight_matmuls``
    (a conv model's Conv were in it too): the report page reads both."""
    from trtpack.report import int8_weight_layers
    from trtpack.report_page.sections import cpu_model_section

    metrics = {"form": "int8, static", "int8_form": "static", key: "60/62",
               "integer_kernels": {"QLinearConv": 60}}
    assert int8_weight_layers(metrics) == "60/62"
    report = BuildReport(model="m", precision="int8", target="cpu", profiles=[],
                         out_dir="/nonexistent",
                         stages=[StageResult("cpu_model", "ok", metrics=metrics)])
    assert "60/62 weight layers (Conv/MatMul/Gemm) INT8" in cpu_model_section(report)
    assert int8_weight_layers({"form": "fp32"}) is None
