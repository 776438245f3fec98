"""What an INT8 build serves on the CPU, in order (``trtpack.stages.cpu_int8_serving``): the
first CPU form gated first, the Q/DQ search only when it fails, then the second form from
the search's kept layers, then the Q/DQ graph; ``--min-int8-share`` on the served model."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from tests.conftest import run_cli
from tests.precision_fixtures import build_options, tiny_npz
from trtpack.options import AutoPrecision, FixedPrecision
from trtpack.precision.cpu.int8 import EVERY_LAYER, SEARCH_LAYERS, search_on_demand
from trtpack.stages.cpu_int8_serving import share_failures

TINY_PROFILES = ["1x4:2x8:4x16", "2x16:4x32:8x64"]


def _build(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    """tiny-bert INT8 with its own stage cache (the session's tiny_build expects to make
    the first export with these profiles)."""
    npz = tiny_npz(tmp_path / "calibration.npz")
    cache_dir = tmp_path / "cache"
    profiles = [a for p in TINY_PROFILES for a in ("--profile", p)]
    out = tmp_path / "out"
    result = run_cli("build", *args, "--random-weights", "--precision", "int8",
                     "--calibration", str(npz), *profiles, "--out", str(out),
                     "--cache-dir", str(cache_dir))
    folder = out if result.exit_code == 0 else tmp_path / "out.failed"
    report = json.loads((folder / "report.json").read_text())
    return result.exit_code, report, result.output


def _stage(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in report["stages"] if s["name"] == name)


def test_cpu_target_gates_the_first_cpu_form_and_runs_no_search_when_it_passes(
        tmp_path: Path) -> None:
    code, report, output = _build(tmp_path, "tiny-bert", "--target", "cpu")
    assert code == 0, output
    precision = _stage(report, "precision")
    assert precision["status"] == "skipped" and "only if" in precision["message"]
    cpu = _stage(report, "cpu_model")
    m = cpu["metrics"]
    assert m["int8_forms_tried"] == [{"form": EVERY_LAYER, "passed": True, "failures": [],
                                      "status": "served"}]
    assert "search" not in m and not (tmp_path / "out" / "artifacts" / "precision").exists()
    # the served model's own gates: the corners and the held-out split
    checks = {r["check"] for r in report["verification"]}
    assert {"cpu-int8-vs-fp32", "cpu-int8-heldout"} <= checks
    assert not checks & {"int8-vs-fp32", "int8-heldout"}  # no Q/DQ model was made
    held = [r["metric_value"] for r in report["verification"] if r["check"] == "cpu-int8-heldout"]
    assert m["heldout_worst"] == min(held)
    assert f"held-out worst {m['heldout_worst']:.4f}" in cpu["message"]
    quantized, total = (int(x) for x in m["int8_weight_layers"].split("/"))
    assert quantized == total > 0 and m["int8_share"] == 1.0


def test_a_failing_first_form_runs_the_search_then_serves_the_second_form(
        tmp_path: Path) -> None:
    """A gate only FP32 arithmetic meets (tiny-bert's INT8 forms score ~0.9999999, its FP32
    forms 1 - 1e-14): the first form fails, the Q/DQ search runs (in the CPU model stage)
    and keeps layers FP32, and the form with those layers FP32 is served."""
    recipe = tmp_path / "strict.yaml"
    recipe.write_text("extends: tiny-bert\nverify:\n  int8: {min_cosine: 0.9999999999}\n")
    code, report, output = _build(tmp_path, str(recipe), "--target", "cpu",
                                  "--min-int8-share", "0")
    assert code == 0, output
    m = _stage(report, "cpu_model")["metrics"]
    tried = m["int8_forms_tried"]
    assert [t["form"] for t in tried] == [EVERY_LAYER, SEARCH_LAYERS]
    assert not tried[0]["passed"] and tried[0]["failures"] and tried[1]["passed"]
    assert [t["status"] for t in tried] == ["superseded", "served"]
    assert m["search"]["fallback"]["mode"] == "auto"  # the search's metrics, reported
    assert m["form"].endswith(SEARCH_LAYERS)
    assert "the Q/DQ search ran" in _stage(report, "cpu_model")["message"]
    assert _stage(report, "precision")["status"] == "skipped"
    # what the search kept in FP32 is what the served form keeps in FP32
    quantized, total = (int(x) for x in m["int8_weight_layers"].split("/"))
    assert total - quantized == len(m["kept_fp32_nodes"]) or m["kept_fp32_layers"]


def test_min_int8_share_is_judged_on_the_served_cpu_model(tmp_path: Path) -> None:
    cpu = build_options("tiny-bert", "int8", tmp_path / "out", TINY_PROFILES)
    assert search_on_demand(cpu)
    assert share_failures(cpu, (3, 4)) == []
    assert share_failures(dataclasses.replace(cpu, min_int8_share=0.8), (3, 4)) == [
        "3/4 weight MatMuls on integer kernels (75%), under --min-int8-share 80%"]
    # --precision auto on the CPU too (issue 46): the GPU's Q/DQ search only on demand
    assert search_on_demand(dataclasses.replace(cpu, precision_choice=AutoPrecision()))
    assert not search_on_demand(dataclasses.replace(cpu, precision_choice=FixedPrecision("fp16")))
