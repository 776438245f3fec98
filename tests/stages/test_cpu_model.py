"""The CPU model (``trtpack.stages.cpu_model``): a fused FP32 graph for ``--target cpu`` and
``--fallback-cpu``, INT8 on ONNX Runtime's integer kernels; the GPU path keeps the plain
(TensorRT-shaped) graph."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import run_cli

# ops only the CPU-shaped graph has: the fused attention, and the residual Sum of each
# SkipLayerNormalization the fusion matched (written back as Sum + LayerNormalization)
FUSED = {"Attention", "Sum"}


def _op_types(path: Path) -> set[str]:
    import onnx

    return {n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node}


def _padded_feeds(batch: int, seq: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, 1000, (batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), np.int64)
    for row in range(batch):  # real padding: rows of different lengths
        mask[row, rng.integers(1, seq + 1):] = 0
    mask[0] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def _run(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    from trtpack.runtimes.onnxruntime import cpu_session

    return np.asarray(cpu_session(path).run(None, feeds)[0])


def _tiny_cpu_build(out: Path, cache_dir: Path, precision: str
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
    """tiny-bert built for the CPU at ``precision``: its report and its cpu_model stage."""
    result = run_cli("build", "tiny-bert", "--random-weights", "--target", "cpu",
                     "--precision", precision, "--profile", "1x4:2x8:4x16", "--out", str(out),
                     "--cache-dir", str(cache_dir), "--json")
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.stdout)
    return report, next(s for s in report["stages"] if s["name"] == "cpu_model")


def test_cpu_target_serves_the_fused_graph_and_reports_the_fusions(tiny_build: Path) -> None:
    report = json.loads((tiny_build / "report.json").read_text())
    stage = next(s for s in report["stages"] if s["name"] == "cpu_model")
    assert stage["status"] == "ok"
    fused = stage["metrics"]["fused_operators"]
    # tiny-bert: 2 layers -> 2 Attention, 4 SkipLayerNormalization, 2 Gelu (its random
    # biases are zeros, which the simplifier removes: Gelu, not BiasGelu)
    assert (fused["Attention"], fused["SkipLayerNormalization"]) == (2, 4)
    assert fused["Gelu"] + fused["BiasGelu"] == 2
    served = tiny_build / "model_repository" / "tiny-bert" / "1" / "model.onnx"
    assert _op_types(served) >= FUSED
    assert "Softmax" not in _op_types(served)  # the attention is one operator now
    # ONNX Runtime's SkipLayerNormalization kernel is the slower form on the CPU
    assert stage["metrics"]["skip_layer_norms_split"] == 4
    assert "SkipLayerNormalization" not in _op_types(served)
    rows = [r for r in report["verification"] if r["check"] == "cpu-fp32-vs-fp32"]
    assert rows and all(r["passed"] for r in rows)


def test_fused_attention_matches_the_plain_graph_on_padded_batches(
        tiny_build: Path, tmp_path: Path) -> None:
    """The Attention fusion takes the 0/1 attention mask instead of the exporter's additive
    mask: padded rows must give the plain graph's outputs on the real tokens."""
    plain = tiny_build / "artifacts" / "simplify" / "model.onnx"
    fused = tiny_build / "artifacts" / "cpu_model" / "fp32" / "model.onnx"
    for batch, seq, seed in ((1, 4, 0), (3, 16, 1), (8, 64, 2)):
        feeds = _padded_feeds(batch, seq, seed)
        want, got = _run(plain, feeds), _run(fused, feeds)
        valid = feeds["attention_mask"][..., None].astype(bool)
        assert np.abs(np.where(valid, got - want, 0)).max() < 1e-4
    # with trtpack's mask value, not ONNX Runtime's default (-10000, whose exp() is a
    # denormal that slows the softmax of a padded batch)
    import onnx

    from trtpack.precision.cpu.fusion import MASK_FILTER_VALUE

    attentions = [n for n in onnx.load(str(fused), load_external_data=False).graph.node
                  if n.op_type == "Attention"]
    assert attentions and all(
        onnx.helper.get_attribute_value(a) == MASK_FILTER_VALUE
        for n in attentions for a in n.attribute if a.name == "mask_filter_value")
    assert all(any(a.name == "mask_filter_value" for a in n.attribute) for n in attentions)


def test_a_graph_without_the_patterns_is_left_as_it_is(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from trtpack.precision.cpu.fusion import cpu_graph

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.normal(size=(8, 8)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
         helper.make_node("Relu", ["m"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 8])], [weight])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    result = cpu_graph(path, config_model_type="bert", num_heads=2, hidden_size=8,
                       mask_input=None)
    assert not any(result.fused.values())  # every count present, all zero: a visible non-match
    assert "Attention" in result.fused
    assert [n.op_type for n in result.model.graph.node] == ["MatMul", "Relu"]
    unknown = cpu_graph(path, config_model_type="resnet", num_heads=None, hidden_size=None,
                        mask_input=None)
    assert unknown.model_type is None and unknown.fused == {}


def test_gpu_path_keeps_the_plain_graph_and_only_the_cpu_model_is_fused(
        tmp_path: Path, cache_dir: Path) -> None:
    """The two forms differ only for CPU: a GPU target's model (what TensorRT builds) is the
    plain graph; its --fallback-cpu model is the fused one; without --fallback-cpu there is no
    CPU model stage at all."""
    common = ["tiny-bert", "--random-weights", "--target", "g5", "--no-engine",
              "--profile", "1x4:2x8:4x16", "--cache-dir", str(cache_dir), "--json"]
    with_cpu = tmp_path / "with-cpu"
    result = run_cli("build", *common, "--fallback-cpu", "--out", str(with_cpu))
    assert result.exit_code == 0, result.output
    repo = with_cpu / "model_repository"
    gpu_ops = _op_types(repo / "tiny-bert" / "1" / "model.onnx")
    assert not gpu_ops & FUSED and "Softmax" in gpu_ops
    assert _op_types(repo / "tiny-bert_cpu" / "1" / "model.onnx") >= FUSED
    without = tmp_path / "without"
    result = run_cli("build", *common, "--no-fallback-cpu", "--out", str(without))
    assert result.exit_code == 0, result.output
    stages = [s["name"] for s in json.loads(result.stdout)["stages"]]
    assert "cpu_model" not in stages
    assert not _op_types(without / "model_repository" / "tiny-bert" / "1" / "model.onnx") \
        & FUSED


def _qdq_graph(tmp_path: Path) -> Path:
    """Two MatMuls, one with a DequantizeLinear weight (INT8), one with a plain constant
    weight (kept in FP32 by the search)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(-9, 9, (4, 4)).astype(np.int8), "wq"),
             numpy_helper.from_array(np.array(0.1, np.float32), "scale"),
             numpy_helper.from_array(rng.normal(size=(4, 4)).astype(np.float32), "w2")]
    nodes = [helper.make_node("DequantizeLinear", ["wq", "scale"], ["w1"], name="dq"),
             helper.make_node("MatMul", ["x", "w1"], ["h"], name="quantized_mm"),
             helper.make_node("MatMul", ["h", "w2"], ["y"], name="kept_mm")]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              inits)
    path = tmp_path / "qdq.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)]), str(path))
    return path


def test_the_kept_fp32_layers_are_read_off_the_searched_qdq_model(tmp_path: Path) -> None:
    import onnx

    from trtpack.precision.cpu.int8 import excluded_in_cpu_graph, fp32_weight_matmuls

    kept = fp32_weight_matmuls(_qdq_graph(tmp_path))
    assert kept == ["kept_mm"]
    cpu = onnx.load(str(_qdq_graph(tmp_path)))
    cpu.graph.node.append(onnx.helper.make_node("Attention", ["x"], ["a"], name="att0"))
    cpu.graph.node.append(onnx.helper.make_node("Attention", ["x"], ["b"], name="att1"))
    sources = {"att0": ["q0", "kept_mm", "v0"], "att1": ["q1", "k1", "v1"]}
    assert excluded_in_cpu_graph(kept, cpu, sources) == ["kept_mm", "att0"]


@pytest.mark.slow
def test_int8_cpu_build_runs_on_integer_kernels_and_keeps_its_gates(
        tmp_path: Path, cache_dir: Path) -> None:
    """tiny-bert INT8 for the CPU (ModelOpt, then ONNX Runtime's dynamic quantization of the
    fused graph): the served model is the integer-kernel form, gated like the Q/DQ model."""
    out = tmp_path / "out"
    report, stage = _tiny_cpu_build(out, cache_dir, "int8")
    metrics = stage["metrics"]
    rows = [r for r in report["verification"] if r["check"].startswith("cpu-int8")]
    assert rows and {r["check"] for r in rows} >= {"cpu-int8-vs-fp32"}
    served = out / "model_repository" / "tiny-bert" / "1" / "model.onnx"
    ops = _op_types(served)
    tried = metrics["int8_forms_tried"]
    assert tried[0]["form"] == "every weight MatMul int8, outlier channels fp32"
    # a later form is tried only when the one before failed its gates
    assert all(not t["passed"] for t in tried[:-1])
    # a form a later one replaced is superseded, not failed; the last says what it was
    assert all(t["status"] == "superseded" for t in tried[:-1])
    assert tried[-1]["status"] == ("served" if tried[-1]["passed"] else "failed")
    if metrics["int8_passed"]:
        assert metrics["form"].startswith("int8, onnxruntime dynamic int8")
        assert metrics["form"].endswith(tried[-1]["form"]) and tried[-1]["passed"]
        assert ops & {"MatMulInteger", "QAttention", "DynamicQuantizeLinear"}
        assert sum(metrics["integer_kernels"].values()) > 0
        assert all(r["passed"] for r in rows)
    else:  # the Q/DQ model is served, and a warning says why
        assert "DequantizeLinear" in ops
        assert any("CPU INT8 form" in w for w in stage["warnings"])
    quantized, total = (int(x) for x in metrics["int8_weight_layers"].split("/"))
    assert 0 < quantized <= total and metrics["int8_share"] == round(quantized / total, 4)


def _stub_measure(latencies_ms: dict[str, list[float]]):  # type: ignore[no-untyped-def]
    """A STUBBED timer (labelled: real timings on a shared machine would make the test's
    outcome depend on the load): each call returns the next round's latency per candidate,
    without running anything."""
    from trtpack.timing import Timing

    rounds = {name: iter(values) for name, values in latencies_ms.items()}

    def measure(calls, seconds, warm=True):  # type: ignore[no-untyped-def]
        return {name: Timing([next(rounds[name]) / 1000] * 3, seconds) for name in calls}

    return measure


class _Session:
    def get_inputs(self) -> list[object]:
        return []

    def run(self, names: object, feed: object) -> None:
        raise AssertionError("the stubbed timer never runs a model")


def _candidates(tiny_build: Path, int8_passed: bool = True) -> list:  # type: ignore[type-arg]
    from trtpack.precision.cpu.auto_choice import Candidate

    path = tiny_build / "artifacts" / "cpu_model" / "fp32" / "model.onnx"
    return [Candidate("fp32", path, True, 1.0), Candidate("int8", path, int8_passed, 0.995)]


def _timed(tiny_build: Path, fp32_ms: list[float], int8_ms: list[float],
           int8_passed: bool = True) -> object:
    from trtpack.cases import load_cases
    from trtpack.precision.cpu.auto_choice import choose, time_candidates

    cases = load_cases(tiny_build / "artifacts" / "verify" / "fp32_outputs.npz")[:1]
    candidates = _candidates(tiny_build, int8_passed)
    time_candidates(candidates, cases, {"fp32": _Session(), "int8": _Session()},
                    rounds=len(fp32_ms), measure=_stub_measure({"fp32": fp32_ms,
                                                                "int8": int8_ms}))
    return choose(candidates)


def test_auto_keeps_int8_when_it_is_faster_beyond_the_noise(tiny_build: Path) -> None:
    choice = _timed(tiny_build, [10.0, 10.2, 9.9, 10.1, 10.0], [6.0, 6.1, 5.9, 6.0, 6.2])
    assert choice.winner == "int8"  # type: ignore[attr-defined]
    assert "int8 is 1.67x as fast as fp32" in choice.reason  # type: ignore[attr-defined]
    assert "faster in every round" in choice.reason  # type: ignore[attr-defined]
    fp32 = choice.candidates[0]  # type: ignore[attr-defined]
    assert list(fp32.p50_ms.values()) == [10.0]
    assert list(fp32.spread.values()) == [pytest.approx(0.03)]


def test_auto_keeps_the_more_accurate_fp32_within_the_noise(tiny_build: Path) -> None:
    # int8 faster by median, but slower in the third round and even in the fourth (paired
    # by round, as the candidates take turns): not a measured difference
    choice = _timed(tiny_build, [10.0, 12.0, 10.0, 9.0, 11.0], [9.6, 9.6, 11.5, 9.0, 9.7])
    assert choice.winner == "fp32"  # type: ignore[attr-defined]
    assert "within the noise" in choice.reason  # type: ignore[attr-defined]


def test_auto_pairs_rounds_so_shared_load_does_not_hide_a_real_gain(tiny_build: Path) -> None:
    # both slowed alike by load in rounds 2 and 4 (a 2x spread of each), int8 always 20% faster
    fp32 = [10.0, 20.0, 10.0, 20.0, 10.0]
    choice = _timed(tiny_build, fp32, [v / 1.25 for v in fp32])
    assert choice.winner == "int8"  # type: ignore[attr-defined]
    assert "1.25x" in choice.reason  # type: ignore[attr-defined]


def test_each_corner_is_warmed_once_and_a_repeated_corner_timed_once(
        tiny_build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The candidates are warmed up before a corner's first round only; a corner whose
    inputs are an earlier corner's (a profile 1:1:4) takes its figures; the budget a corner
    is $TRTPACK_CPU_TIMING_SECONDS (bad input when it is not a positive number)."""
    from trtpack.cases import Case, load_cases
    from trtpack.errors import UserInputError
    from trtpack.precision.cpu.auto_choice import SECONDS_ENV, time_candidates

    first, other = load_cases(tiny_build / "artifacts" / "verify" / "fp32_outputs.npz")[:2]
    again = Case(first.profile, "again", {k: v.copy() for k, v in first.inputs.items()})
    calls: list[tuple[float, bool]] = []
    latencies = iter([10.0, 11.0, 12.0, 20.0, 21.0, 22.0])

    def measure(timed, seconds, warm=True):  # type: ignore[no-untyped-def]
        from trtpack.timing import Timing

        calls.append((seconds, warm))
        value = next(latencies) / 1000
        return {name: Timing([value] * 3, seconds) for name in timed}

    monkeypatch.setenv(SECONDS_ENV, "0.6")
    candidates = _candidates(tiny_build)
    time_candidates(candidates, [first, other, again], {"fp32": _Session(), "int8": _Session()},
                    rounds=3, measure=measure)
    assert calls == [(pytest.approx(0.2), True), (pytest.approx(0.2), False),
                     (pytest.approx(0.2), False)] * 2  # two corners timed, not three
    for c in candidates:
        assert c.p50_ms == {first.label: 11.0, other.label: 21.0, again.label: 11.0}
        assert c.rounds_ms[again.label] == c.rounds_ms[first.label] == [10.0, 11.0, 12.0]
    monkeypatch.setenv(SECONDS_ENV, "0")
    with pytest.raises(UserInputError, match=f"{SECONDS_ENV}='0': expected a positive"):
        time_candidates(candidates, [first], {"fp32": _Session(), "int8": _Session()},
                        measure=measure)


def test_auto_never_keeps_a_candidate_that_failed_its_gates(tiny_build: Path) -> None:
    choice = _timed(tiny_build, [10.0] * 5, [2.0] * 5, int8_passed=False)
    assert choice.winner == "fp32"  # type: ignore[attr-defined]
    assert "int8 failed its per-sample gates" in choice.reason  # type: ignore[attr-defined]


def test_auto_on_a_gpu_target_is_refused_on_every_machine(tmp_path: Path) -> None:
    """Item J of issue 32: ``--precision auto`` was stored as int8 plus a flag; on a GPU
    machine with TensorRT it would have built an untimed INT8 engine titled "int8". Exit 2
    with one true sentence, whether or not TensorRT is installed."""
    result = run_cli("build", "tiny-bert", "--random-weights", "--target", "g5", "--no-engine",
                     "--precision", "auto", "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert "--precision auto chooses between fp32 and int8 on ONNX Runtime for --target cpu " \
        "only; for --target g5 choose --precision fp32, fp16 or int8" in result.stderr
    assert not (tmp_path / "out").exists()


def test_auto_with_target_auto_resolved_to_a_gpu_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--target auto`` resolves after the precision is read: on a GPU machine with
    TensorRT it becomes the local family. STAND-IN: there is no GPU here, so the resolution
    is replaced by one that answers g5, as ``local_targets`` would there."""
    import trtpack.api.plan as api
    from trtpack.machine.targets import resolve_target

    monkeypatch.setattr(api, "resolve_target_for_build",
                        lambda *args, **kwargs: (resolve_target("g5"), []))
    result = run_cli("build", "tiny-bert", "--random-weights", "--target", "auto",
                     "--no-engine", "--precision", "auto", "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert "for --target g5 choose --precision fp32, fp16 or int8" in result.stderr


@pytest.mark.slow
def test_auto_on_cpu_builds_both_times_both_and_serves_the_winner(
        tmp_path: Path, cache_dir: Path) -> None:
    """Real timings (whichever wins on this machine): the report holds both candidates'
    p50 at every corner, the reason, and the served model is the winner's form."""
    out = tmp_path / "out"
    _, stage = _tiny_cpu_build(out, cache_dir, "auto")
    auto = stage["metrics"]["auto"]
    assert [c["name"] for c in auto["candidates"]] == ["fp32", "int8"]
    for c in auto["candidates"]:
        assert len(c["p50_ms"]) == 3 and all(v > 0 for v in c["p50_ms"].values())
    assert auto["reason"] and f"auto: {auto['winner']}" in stage["message"]
    report = json.loads((out / "report.json").read_text())
    assert report["precision"] == auto["winner"]  # the title names what is served
    # issue 46: as --precision int8 --target cpu, the GPU's Q/DQ search runs only when the
    # first CPU INT8 form fails (tiny-bert's passes): no precision stage, no int8-vs-fp32
    # rows of a Q/DQ model nobody serves
    precision = next(s for s in report["stages"] if s["name"] == "precision")
    assert precision["status"] == "skipped", precision
    checks = {r["check"] for r in report["verification"]}
    assert "int8-vs-fp32" not in checks, checks
    if auto["winner"] == "fp32":
        assert not checks & {"cpu-int8-vs-fp32", "cpu-int8-heldout"}, checks
    served = out / "model_repository" / "tiny-bert" / "1" / "model.onnx"
    integer = bool(_op_types(served) & {"MatMulInteger", "DynamicQuantizeLinear"})
    assert integer == (auto["winner"] == "int8")
    import html

    page = (out / "report.html").read_text()
    assert 'id="auto-precision"' in page and html.escape(auto["reason"]) in page


def test_smoothing_is_undone_where_every_reader_stays_fp32(tmp_path: Path) -> None:
    """SmoothQuant's Mul before a MatMul kept in FP32 is pure cost: removed, the weight
    restored, the function unchanged; the Mul before a quantized MatMul stays."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from trtpack.precision.cpu.int8 import unsmooth_kept
    from trtpack.precision.smoothquant import SMOOTH_PREFIX, smooth_model
    from trtpack.runtimes.onnxruntime import cpu_session

    rng = np.random.default_rng(0)
    w1, w2 = (rng.normal(size=(8, 8)).astype(np.float32) for _ in range(2))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"], name="quantized"),
         helper.make_node("MatMul", ["h", "w2"], ["y"], name="kept")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = (rng.normal(size=(4, 8)) * np.array([1, 1, 30, 1, 1, 1, 1, 5])).astype(np.float32)
    want = cpu_session(model).run(None, {"x": x})[0]
    smooth_model(model, [{"x": x}], 0.5)
    assert sum(n.op_type == "Mul" for n in model.graph.node) == 2
    assert unsmooth_kept(model, ["kept"]) == 1
    muls = [n for n in model.graph.node if n.op_type == "Mul"]
    assert len(muls) == 1 and muls[0].name == f"{SMOOTH_PREFIX}/x"
    kept = next(n for n in model.graph.node if n.name == "kept")
    assert kept.input[0] == "h"
    weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    np.testing.assert_allclose(weights["w2"], w2, rtol=1e-5)
    onnx.checker.check_model(model)
    np.testing.assert_allclose(cpu_session(model).run(None, {"x": x})[0], want, rtol=1e-4,
                               atol=1e-4)


def test_an_optimizer_crash_serves_the_plain_graph_with_a_warning(
        tiny_build: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stage run in this process (not the build's stage process) with ONNX Runtime's
    optimizer replaced by one that raises (a STUB standing for a crash on an unusual graph)."""
    import logging

    from trtpack.api import BuildRequest, resolve_options
    from trtpack.precision.cpu import fusion as cpu_fusion
    from trtpack.stages import cpu_model
    from trtpack.stages.artifacts import Artifacts
    from trtpack.stages.base import StageContext

    def crash(*args: object, **kwargs: object) -> object:
        raise RuntimeError("no pattern for this graph")

    monkeypatch.setattr(cpu_fusion, "cpu_graph", crash)
    plan, _ = resolve_options(BuildRequest(
        model="tiny-bert", profiles=["1x4:2x8:4x16"], precision="fp32", target="cpu",
        random_weights=True, out=tmp_path / "out", cache_dir=tmp_path / "cache"))
    stage_dir = tmp_path / "stage"
    stage_dir.mkdir()
    artifacts = Artifacts(onnx=tiny_build / "artifacts" / "simplify" / "model.onnx",
                          fp32_outputs=tiny_build / "artifacts" / "verify" / "fp32_outputs.npz")
    ctx = StageContext(plan, "cpu_model", stage_dir, tmp_path, artifacts,
                       logging.getLogger("test"), lambda event: None)
    outcome = cpu_model.run(ctx)
    assert any("optimizer failed (RuntimeError: no pattern" in w for w in outcome.warnings)
    assert outcome.artifacts.cpu_onnx is not None
    assert not _op_types(outcome.artifacts.cpu_onnx) & FUSED
    assert outcome.verification and all(r.passed for r in outcome.verification)
