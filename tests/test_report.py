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
    report.name_served_precision(cpu_model_served=True)
    assert report.precision == winner
    page = render_report_html(report, Path("/nonexistent"))
    assert f"<title>trtpack · tiny-bert {winner}</title>" in page


def test_a_build_without_a_choice_keeps_its_precision() -> None:
    report = auto_report(None)
    report.name_served_precision(cpu_model_served=True)
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


def test_a_malformed_report_names_its_field(tmp_path: Path) -> None:
    """report.json is read through typed records: a field of another JSON type, at any depth
    (a stage, a verification row, a benchmark row, a served row), is one ``ValueError`` that
    names it, and a build folder holding such a report is the user's error (exit 2) saying so;
    unknown fields (a newer trtpack's) are ignored."""
    import json

    from trtpack.errors import UserInputError
    from trtpack.pipeline.build_folder import load_build_report

    good = BuildReport("tiny-bert", "fp32", "cpu", ["1x8"], "out",
                       stages=[StageResult("export", "ok", metrics={"weights": "random"})])
    good.benchmark = {"seconds_per_row": 1.0, "threads": 2, "device": "cpu",
                      "machine": {"cpu": "x"}, "rows": [
                          {"runtime": "served", "engine": "ort", "profile": 0, "corner": "opt",
                           "shapes": "x=1x8", "batch": 1, "p50_ms": 1.5}],
                      "served": {"url": "localhost:8000", "rows": []}}
    data = json.loads(good.to_json())
    assert BuildReport.from_dict({**data, "added_later": 1}) == good
    assert good.benchmark_result() is not None and good.benchmark_result().rows[0].p50_ms == 1.5
    for path, value, named in [
            (("stages", 0, "seconds"), "fast", "stages[0]: field 'seconds' is a string"),
            (("stages", 0, "status"), "done", "stages[0]: field 'status' is a string"),
            (("benchmark", "rows", 0, "p50_ms"), "1.5", "benchmark.rows[0]: field 'p50_ms'"),
            (("benchmark", "served"), {"rows": []}, "benchmark.served: field 'url' is missing"),
            (("verification",), [{"check": "x"}], "verification[0]: field 'profile' is missing")]:
        broken = json.loads(good.to_json())
        *parents, last = path
        holder = broken
        for key in parents:
            holder = holder[key]
        holder[last] = value
        with pytest.raises(ValueError, match=named.replace("[", r"\[").replace("]", r"\]")):
            BuildReport.from_dict(broken)
        (tmp_path / "report.json").write_text(json.dumps(broken))
        with pytest.raises(UserInputError, match="is not a trtpack report"):
            load_build_report(tmp_path)


def test_worst_samples_name_the_worst_corner_and_the_weighted_mean() -> None:
    """One line per check and output judged per sample: the worst sample over the corners,
    the mean weighted by each corner's samples; rows without per-sample values are left out."""
    from trtpack.cli.console import worst_samples
    from trtpack.report import VerificationRow

    def row(corner: str, worst: float, mean: float | None, samples: int, text: str
            ) -> VerificationRow:
        return VerificationRow("onnx-vs-torch", 0, corner, "x=1x8", "out", 0.0, 0.0, "cosine",
                               worst, True, metric_mean=mean, samples=samples,
                               worst_text=text, threshold=0.99)

    report = BuildReport("m", "fp32", "cpu", ["1x8"], "out", verification=[
        row("min", 0.999, 0.9995, 1, "short"), row("max", 0.995, 0.998, 3, "the long one"),
        row("opt", 0.5, None, 2, "not per sample")])
    assert worst_samples(report) == [
        'onnx-vs-torch out: 4 samples over 2 corners, worst 0.9950, mean 0.9984. worst '
        'sample: "the long one"']


@pytest.mark.parametrize("cpu_model_served", [True, False])
def test_a_declined_int8_candidate_names_fp32_only_where_the_cpu_model_is_served(
        cpu_model_served: bool) -> None:
    """On a CPU target the CPU model is what is served, so its declined INT8 candidate makes
    the build FP32; on a GPU target (``--fallback-cpu``) the engine keeps the build's INT8."""
    report = BuildReport(model="resnet", precision="int8", target="cpu", profiles=[],
                         out_dir="/nonexistent",
                         stages=[StageResult("cpu_model", "ok",
                                             metrics={"int8_fp32_reason": "gate failed"})])
    report.name_served_precision(cpu_model_served=cpu_model_served)
    assert report.precision == ("fp32" if cpu_model_served else "int8")
