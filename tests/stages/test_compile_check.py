"""The compile check: GPU builds with ``--no-engine`` compiled by TensorRT for RTX on this CPU
(real ``tensorrt_rtx`` 1.7 bindings and libraries, no stand-in). Tiny models at fp32, fp16
and int8 with two profiles compile, with what the builder read back recorded; a graph no
TensorRT parses (a ``com.microsoft`` fused op) is exit 4 naming the node and op, ``--out``
untouched; a profile the builder refuses fails in the builder's own words; a rebuild takes
the check from the stage cache. Nothing is run: these prove parse and build, not numerics."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import COMPILE_CHECK_ON, run_cli
from trtpack.engine.builder import BuilderSettings
from trtpack.engine.tensorrt_rtx import (
    RTX_DIFFERENCES,
    RtxSettings,
    compiled_for,
    refusal_difference,
)
from trtpack.machine.packages import module_installed, recorded_versions, tensorrt_rtx_version
from trtpack.machine.targets import resolve_target

pytestmark = pytest.mark.skipif(not module_installed("tensorrt_rtx"),
                                reason="tensorrt_rtx is not installed (make install)")

TWO_PROFILES = ("-p", "1x8:2x16:4x32", "-p", "1x32:4x64:8x128")
WORDING = ("compiled by TensorRT-RTX 1.7.1 on CPU (not run); the Triton engine is built by "
           "TensorRT on the GPU")


def _check_of(report: dict[str, Any]) -> dict[str, Any]:
    found = [s for s in report["stages"] if s["name"] == "compile_check"]
    assert len(found) == 1, [s["name"] for s in report["stages"]]
    stage: dict[str, Any] = found[0]
    return stage


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_tiny_bert_with_two_profiles_compiles_at_each_precision(
        precision: str, tmp_path: Path, cache_dir: Path) -> None:
    out = tmp_path / "out"
    result = run_cli("build", "tiny-bert", "--random-weights", "--target", "g5",
                     "--no-engine", "--precision", precision, *TWO_PROFILES, "--out", str(out),
                     "--cache-dir", str(cache_dir), "--json", env=COMPILE_CHECK_ON)
    assert result.exit_code == 0, result.output
    stage = _check_of(json.loads(result.stdout))
    assert stage["status"] == "ok", stage
    m = stage["metrics"]
    assert (m["builder"], m["builder_version"]) == ("TensorRT-RTX", tensorrt_rtx_version())
    assert m["parsed"] and m["built"] and m["wording"] == WORDING
    assert (m["compiled_for"], m["target_compute_capability"], m["stand_in"]) == \
        ("8.6", "8.6", False)
    # read from the parsed network: tiny-bert's three token inputs stay int64
    assert m["inputs"] == {name: {"dtype": "INT64", "shape": [-1, -1]}
                           for name in ("input_ids", "attention_mask", "token_type_ids")}
    # read back from the builder's optimization profiles, one per --profile, in order
    assert m["profiles"] == [
        {name: [[1, 8], [2, 16], [4, 32]] for name in m["inputs"]},
        {name: [[1, 32], [4, 64], [8, 128]] for name in m["inputs"]},
    ]
    assert m["engine_bytes"] > 100_000 and len(m["engine_sha256"]) == 64
    assert 0 < m["build_seconds"] <= m["seconds"] and m["peak_memory_mb"] > 0
    assert not (out / "artifacts" / "compile_check" / "model.plan").exists()  # not kept
    record = json.loads((out / "artifacts" / "compile_check" / "compile_check.json").read_text())
    assert record["engine_sha256"] == m["engine_sha256"]
    assert WORDING in stage["message"]
    # report.html and trtpack inspect say the same, worded as what it is
    page = (out / "report.html").read_text()
    assert "Compile check (not run)" in page and WORDING in page
    inspected = run_cli("inspect", str(out))
    assert inspected.exit_code == 0, inspected.output
    assert f"compile check: {WORDING}" in inspected.output
    assert "compile check: input input_ids INT64 [-1, -1]: profiles 1x8:2x16:4x32 " \
        "1x32:4x64:8x128" in inspected.output


def test_a_rebuild_takes_the_check_from_the_stage_cache(tmp_path: Path) -> None:
    """Its own cache: in the session's, shared by the xdist workers, the same key may be
    stored by another test's build at the same moment, whose timings then come back."""
    args = ("build", "tiny-bert", "--random-weights", "--target", "g5", "--no-engine",
            "--precision", "fp16", *TWO_PROFILES, "--cache-dir", str(tmp_path / "cache"))
    first = run_cli(*args, "--json", "--out", str(tmp_path / "a"), env=COMPILE_CHECK_ON)
    second = run_cli(*args, "--out", str(tmp_path / "b"), env=COMPILE_CHECK_ON)  # the terminal
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    one = _check_of(json.loads(first.stdout))
    two = _check_of(json.loads((tmp_path / "b" / "report.json").read_text()))
    assert f"compile check: {WORDING}" in " ".join(second.stdout.split())
    assert "compile check: builder TensorRT-RTX 1.7.1.116, for compute capability 8.6" in \
        " ".join(second.stdout.split())
    assert two["cached"] and two["metrics"] == one["metrics"] and one["metrics"]["built"]


def test_a_refusal_of_the_tables_is_a_warning_saying_what_was_not_checked(
        tmp_path: Path, cache_dir: Path) -> None:
    """TensorRT-RTX compiles no FP32 GEMM for Turing (7.5); TensorRT on a T4 does: an FP32
    build for g4dn is exit 0, its record "not checked: <the table's row>"."""
    result = run_cli("build", "tiny-bert", "--random-weights", "--target", "g4dn",
                     "--no-engine", "--precision", "fp32", *TWO_PROFILES,
                     "--out", str(tmp_path / "out"), "--cache-dir", str(cache_dir), "--json",
                     env=COMPILE_CHECK_ON)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    stage = _check_of(report)
    assert stage["metrics"]["not_checked"].startswith("FP32 GEMM on Turing (7.5)")
    assert stage["metrics"]["compiled_for"] == "7.5"  # set explicitly: not RTX's default
    assert not stage["metrics"]["built"] and stage["message"].startswith("not checked: ")
    assert [w for w in report["warnings"] if "FP32 GEMM is not supported" in w]


def test_the_option_and_the_environment_switch_it_off(tmp_path: Path, cache_dir: Path) -> None:
    args = ("build", "tiny-bert", "--random-weights", "--target", "g5", "--no-engine",
            "--precision", "fp32", *TWO_PROFILES, "--cache-dir", str(cache_dir), "--json")
    flagged = run_cli(*args, "--no-compile-check", "--out", str(tmp_path / "a"),
                      env=COMPILE_CHECK_ON)
    by_env = run_cli(*args, "--out", str(tmp_path / "b"),
                     env={"TRTPACK_NO_COMPILE_CHECK": "1"})
    for result in (flagged, by_env):
        assert result.exit_code == 0, result.output
        stage = _check_of(json.loads(result.stdout))
        assert (stage["status"], stage["message"]) == ("skipped", "--no-compile-check")


def _microsoft_op_onnx(path: Path) -> Path:
    """MatMul then ONNX Runtime's fused ``com.microsoft.FastGelu`` (ONNX Runtime runs it on
    the CPU; TensorRT's ONNX parser has no importer for it and looks for a plugin)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32) / 4,
                                       "w"),
               numpy_helper.from_array(rng.standard_normal(16).astype(np.float32) / 8, "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
             helper.make_node("FastGelu", ["h", "b"], ["y"], domain="com.microsoft",
                              name="fused_gelu")]
    graph = helper.make_graph(
        nodes, "microsoft_op",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])], weights)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.microsoft", 1)]),
              str(path))
    return path


def test_an_op_no_tensorrt_parses_is_exit_4_naming_node_and_op_out_untouched(
        tmp_path: Path) -> None:
    onnx = _microsoft_op_onnx(tmp_path / "fused.onnx")
    out = tmp_path / "out"
    out.mkdir()
    (out / "earlier.txt").write_text("an earlier build's file\n")
    result = run_cli("build", str(onnx), "--target", "g5", "--no-engine", "-p",
                     "1x16:2x16:4x16", "--out", str(out), "--force",
                     "--cache-dir", str(tmp_path / "cache"), env=COMPILE_CHECK_ON)
    assert result.exit_code == 4, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    assert "node 'fused_gelu' (op FastGelu)" in errors[0]
    assert "Plugin not found" in errors[0]  # the parser's own words
    assert "Traceback" not in result.output
    assert sorted(p.name for p in out.iterdir()) == ["earlier.txt"]


COMPILE_IN_RTX = textwrap.dedent("""
    import json, logging, os, sys
    os.environ["POLYGRAPHY_USE_TENSORRT_RTX"] = "1"  # before polygraphy is imported
    from pathlib import Path
    from trtpack.engine.builder import BuilderSettings
    from trtpack.engine.tensorrt_rtx import RtxSettings
    from trtpack.runtimes.tensorrt_compile import CompileRefused, compile_engine
    profile = {"image": tuple(tuple(c) for c in json.loads(sys.argv[2]))}
    try:
        done = compile_engine(Path(sys.argv[1]), [profile],
                              RtxSettings(BuilderSettings((1, 7))), "SM86",
                              logging.getLogger("test"))
        print(json.dumps({"bytes": done.engine_bytes}))
    except CompileRefused as refused:
        print(json.dumps({"refused": refused.line()}))
""")


def _compile_conv(tmp_path: Path, corners: list[list[int]]) -> dict[str, Any]:
    from trtpack.testing.models import conv_onnx

    onnx = conv_onnx(tmp_path / "conv.onnx")
    done = subprocess.run([sys.executable, "-c", COMPILE_IN_RTX, str(onnx), json.dumps(corners)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_profile_the_builder_refuses_fails_in_the_builders_words(tmp_path: Path) -> None:
    """The conv model takes 3 channels; a profile of 4 is TensorRT's API usage error."""
    refused = _compile_conv(tmp_path, [[1, 4, 8, 8], [2, 4, 16, 16], [4, 4, 32, 32]])
    assert refused["refused"].startswith("build refused: IBuilder::buildSerializedNetwork: "
                                         "Error Code 4: API Usage Error (Dimension mismatch "
                                         "for tensor image and profile 0"), refused
    # and the same model with a profile it fits compiles (the refusal is the profile's)
    assert _compile_conv(tmp_path, [[1, 3, 8, 8], [2, 3, 16, 16], [4, 3, 32, 32]])["bytes"] > 0


# ------------------------------------------------------------------ the TensorRT-RTX-only table


def test_compute_capability_per_target_and_stand_ins_are_said() -> None:
    assert compiled_for(resolve_target("g4dn")).enum_member == "SM75"
    assert compiled_for(resolve_target("g6")).enum_member == "SM89"
    p5 = compiled_for(resolve_target("p5"))
    assert (p5.target_sm, p5.compiled_sm, p5.stand_in) == ("9.0", "8.0", True)
    assert "not the target's architecture" in p5.describe()
    assert not compiled_for(resolve_target("p4d")).stand_in


def test_settings_tensorrt_rtx_lacks_are_left_out_and_named() -> None:
    asked = BuilderSettings((1, 7), hardware_compatibility="ampere+", version_compatible=True,
                            tiling_level="fast")
    rtx = RtxSettings(asked)
    assert "hardware_compatibility_level" not in rtx.config_kwargs()
    assert "version_compatible" not in rtx.config_kwargs()
    assert rtx.config_kwargs()["tiling_optimization_level"] == "FAST"  # RTX has it
    assert rtx.left_out() == ["hardware compatibility level", "version compatibility"]
    assert all(d.source for d in RTX_DIFFERENCES)


def test_a_refusal_the_table_explains_is_matched_and_another_is_not() -> None:
    lean = ("IBuilder::buildSerializedNetwork: Error Code 6: API Usage Error (Unable to load "
            "library: libnvinfer_lean.so.1)")
    row = refusal_difference(lean)
    assert row is not None and row.setting == "version compatibility"
    assert refusal_difference("Dimension mismatch for tensor image and profile 0") is None


def test_only_the_checks_cache_key_holds_the_tensorrt_rtx_version() -> None:
    from trtpack.api import resolve_options
    from trtpack.options import BuildRequest
    from trtpack.stages import compile_check

    assert not [name for name in recorded_versions() if "rtx" in name]
    plan, _ = resolve_options(BuildRequest("tiny-bert", target="g5", build_engine=False,
                                           random_weights=True))
    assert compile_check.fingerprint(plan)["tensorrt_rtx"] == tensorrt_rtx_version()
