"""The benchmark scripts' own arithmetic (benchmarks/ is not a package: loaded by path):
the CPU anchor's rotation, its rotation-by-rotation pairs and the issue's checks."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import environment_kept, python_path, without_stage_server

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str) -> ModuleType:
    """The benchmark script ``name`` imported as a module. What its import writes to
    ``os.environ`` (cpu_anchor.py sets ``OMP_WAIT_POLICY`` for its own PyTorch) is undone: a
    module fixture loads it outside ``environment_restored``, and left in place it reached
    every later test of the worker, whose builds the stage server then refused."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    with environment_kept():
        spec.loader.exec_module(module)
    return module


def test_loading_a_benchmark_leaves_the_environment_as_it_was(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    load("cpu_anchor")  # its import sets OMP_WAIT_POLICY for the PyTorch it loads
    assert "OMP_WAIT_POLICY" not in os.environ


@pytest.fixture(scope="module")
def anchor() -> ModuleType:
    return load("cpu_anchor")


def test_each_rotation_runs_every_call_in_a_new_order(anchor: ModuleType) -> None:
    order: list[str] = []
    calls = {name: (lambda name=name: order.append(name)) for name in "abcd"}
    timed = anchor.time_rotation(calls, rounds=6, seconds=0.0)
    rotations = ["".join(order[12 + 4 * i:16 + 4 * i]) for i in range(6)]  # after warm-up
    assert all(sorted(r) == list("abcd") for r in rotations)
    followers = {r[r.index("a") + 1] for r in rotations if not r.endswith("a")}
    assert len(followers) > 1  # "a" is not always followed by the same call
    assert all(len(t["round_p50_ms"]) == 6 for t in timed.values())


def timing(*rounds: float) -> dict[str, object]:
    return {"p50_ms": sorted(rounds)[len(rounds) // 2], "round_p50_ms": list(rounds)}


def test_pairs_are_read_rotation_by_rotation(anchor: ModuleType) -> None:
    # a load burst in rotation 2 slows both: the per-rotation ratio stays 2
    timings = {"8x128": {"trtpack fp32": timing(10, 50, 10),
                         "optimum O2": timing(20, 100, 20)}}
    assert anchor.paired_ratios(timings) == {"optimum O2 / trtpack fp32": {"8x128": 2.0}}


def test_checks_fail_on_one_slower_corner(anchor: ModuleType) -> None:
    fast = {"trtpack fp32": timing(1), "optimum O2": timing(2), "optimum O3": timing(2),
            "trtpack int8": timing(1), "optimum dynamic int8": timing(2)}
    slow = {**fast, "trtpack fp32": timing(3)}
    result = {"timings": {"1x8": fast, "8x128": slow},
              "accuracy": {"trtpack int8": {"worst": 0.995}}}
    checks = anchor.checks(result)
    assert list(checks.values()) == [False, True, True]
    result["timings"] = {"1x8": fast, "8x128": fast}
    result["accuracy"] = {"trtpack int8": {"worst": 0.989}}
    assert list(anchor.checks(result).values()) == [True, True, False]


def test_the_optimum_venv_never_takes_a_cuda_torch(anchor: ModuleType) -> None:
    assert anchor.TORCH_CPU.endswith("+cpu")
    assert not any(p.startswith("torch") for p in anchor.optimum_pins())


@pytest.fixture(scope="module")
def compute_floor() -> ModuleType:
    return load("compute_floor")


def test_onnxruntime_pass_multiplies_as_numpy(compute_floor: ModuleType, tmp_path: Path
                                              ) -> None:
    import numpy as np

    rng = np.random.default_rng(1)
    a = rng.standard_normal((48, 32), dtype=np.float32)
    b = rng.standard_normal((32, 24), dtype=np.float32)
    for prepacked in (False, True):
        (got,) = compute_floor.onnxruntime_matmul(b, 1, prepacked, tmp_path)(a)
        np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)


def test_each_runtime_timed_on_a_tiny_gemm(compute_floor: ModuleType) -> None:
    rates = compute_floor.gemm_rates(threads=1, repeats=2, m=64, k=32, n=48, prepacked=False)
    assert set(rates) == {"torch", "onnxruntime", "numpy"}
    assert all(r["best_gflops"] >= r["median_gflops"] > 0 for r in rates.values())


def test_each_pass_at_the_rate_of_its_runtime(compute_floor: ModuleType) -> None:
    rates = {"torch": {"best_gflops": 100.0}, "onnxruntime": {"best_gflops": 400.0},
             "numpy": {"best_gflops": 10_000.0}}  # numpy runs no pass: never the floor's
    passes = compute_floor.floor_seconds(4_000_000_000_000, rates)
    assert list(passes.values()) == [40.0, 10.0, 10.0]
    assert [runtime for _, runtime in compute_floor.PASSES] == ["torch", "onnxruntime",
                                                               "onnxruntime"]


def test_each_fp32_form_computes_the_served_model(tiny_build: Path, tmp_path: Path) -> None:
    """cpu_fp32_forms.py's variants of a served fused CPU model (tiny-bert): each makes the
    change it names and gives the served model's outputs on the build's own inputs."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    forms = load("cpu_fp32_forms")
    served = next(tiny_build.glob("model_repository/*/1/model.onnx"))
    reference = np.load(tiny_build / "artifacts" / "export" / "reference.npz")
    feed = {k.rsplit(".", 1)[1]: reference[k] for k in reference.files
            if k.startswith("p1.max.input.")}
    assert feed["attention_mask"].min() == 0  # padded rows: the mask matters

    def run(path: Path, optimized: Path | None = None) -> np.ndarray:
        options = ort.SessionOptions()
        if optimized is not None:
            options.optimized_model_filepath = str(optimized)
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        names = {i.name for i in session.get_inputs()}
        return session.run(None, {k: v for k, v in feed.items() if k in names})[0]

    # tiny-bert's random biases are zeros, which the simplifier removes: give each residual
    # a bias Add (as minilm's served graph has) so that sum3 and gemm have one to move
    model = onnx.load(str(served))
    rng = np.random.default_rng(3)
    for index, total in enumerate([n for n in model.graph.node if n.op_type == "Sum"]):
        hidden = int(np.load(tiny_build / "artifacts" / "export" / "reference.npz")[
            "p1.max.output.last_hidden_state"].shape[-1])
        model.graph.initializer.append(onnx.numpy_helper.from_array(
            rng.normal(0, 0.1, hidden).astype(np.float32), f"injected{index}"))
        add = onnx.helper.make_node("Add", [total.input[0], f"injected{index}"],
                                    [f"injected{index}_out"], name=f"injected{index}_bias")
        total.input[0] = f"injected{index}_out"
        model.graph.node.insert(list(model.graph.node).index(total), add)
    served = tmp_path / "served.onnx"
    onnx.save_model(model, str(served))
    assert len(forms.residual_adds(model)) == 4
    expected = run(served)
    signs = {"skip layer norm (O2's residual)": "SkipLayerNormalization",
             "mask index (O2's mask, -60)": "ReduceSum",
             "sum3 (bias in the residual Sum)": "Sum", "gemm bias (bias in the projection)": "Gemm"}
    for index, (name, change) in enumerate(forms.VARIANTS.items()):
        model = onnx.load(str(served))
        change(model)
        path, optimized = tmp_path / f"form{index}.onnx", tmp_path / f"form{index}.ran.onnx"
        onnx.save_model(model, str(path))
        np.testing.assert_allclose(run(path, optimized), expected, rtol=1e-4, atol=1e-4,
                                   err_msg=name)
        ran = [n.op_type for n in onnx.load(str(optimized), load_external_data=False).graph.node]
        if name in signs:
            assert signs[name] in ran, (name, sorted(set(ran)))
        if name.startswith(("sum3", "gemm")):
            assert forms.residual_adds(model) == []  # every bias Add moved


def test_the_reference_heap_script_runs_both_heaps_in_rotation(tmp_path: Path) -> None:
    import json
    import subprocess

    out = tmp_path / "heap.json"
    subprocess.run([sys.executable, str(BENCHMARKS / "reference_heap.py"), "--config",
                    "bert-base", "--batch", "2", "--seq", "8", "--rounds", "2", "--json",
                    str(out)], check=True, capture_output=True, timeout=600)
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["default heap", "reused_heap"] * 2
    assert all(r["cpu"] >= r["sys"] >= 0 and r["minor_faults"] >= 0 for r in rows)


def test_the_export_beside_script_runs_every_order(tmp_path: Path) -> None:
    import json
    import subprocess

    out = tmp_path / "beside.json"
    subprocess.run([sys.executable, str(BENCHMARKS / "export_beside.py"), "--recipe",
                    "tiny-bert", "--profile", "1x4:2x8:4x16", "--rounds", "1", "--work",
                    str(tmp_path / "work"), "--json", str(out)], check=True,
                   capture_output=True, timeout=600)
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows] == ["one after the other", "largest after",
                                            "largest in row pieces"]
    assert all(r["wall"] > 0 and r["cpu"] > 0 for r in rows)


def test_the_cold_build_script_runs_each_variant_cold_then_again(tmp_path: Path) -> None:
    """``minilm_cold.py``: per variant a cold build on an empty cache, then the rebuild
    (cached: no export process), the same model.onnx from both, nothing left behind."""
    import json
    import subprocess

    out, work = tmp_path / "cold.json", tmp_path / "work"
    env = without_stage_server({**os.environ, "PYTHONPATH": python_path()})
    subprocess.run([sys.executable, str(BENCHMARKS / "minilm_cold.py"), "--model",
                    "tiny-bert", "--pairs", "1", "--variant", "a:", "--variant",
                    "b:TRTPACK_NO_PRESTART=1", "--work", str(work), "--json", str(out), "--",
                    "--random-weights", "--precision", "fp32", "--profile", "1x4:2x8:4x16"],
                   check=True, capture_output=True, timeout=900, env=env)
    rows = json.loads(out.read_text())["rows"]
    assert [(r["variant"], r["env"]) for r in rows] == [
        ("a", {}), ("b", {"TRTPACK_NO_PRESTART": "1"})]
    for row in rows:
        assert row["cold"]["returncode"] == 0 and row["rebuild"]["returncode"] == 0
        assert row["cold"]["export_cpu_s"] > 0 and row["cold"]["export_end_s"] > 0
        assert row["rebuild"]["export_cpu_s"] is None  # every stage from the cache
    assert rows[0]["model_onnx_sha256"] == rows[1]["model_onnx_sha256"] is not None
    assert not work.exists() or not any(work.iterdir())


def test_the_autogroup_script_runs_both_nice_values(tmp_path: Path) -> None:
    import json
    import subprocess

    out = tmp_path / "share.json"
    env = {**os.environ, "PYTHONPATH": python_path()}
    subprocess.run([sys.executable, str(BENCHMARKS / "autogroup_share.py"), "--seconds",
                    "0.3", "--rounds", "2", "--json", str(out)], check=True,
                   capture_output=True, timeout=300, env=env)
    rows = json.loads(out.read_text())["rows"]
    assert [r["nice"] for r in rows] == [0, 10, 10, 0]  # alternating
    assert all(0 < r["export_share"] <= 1.5 and len(r["warming_cpu_s"]) == 3 for r in rows)


def test_modelopt_ranges_compare_counts_ulps_and_missing_ranges(tmp_path: Path) -> None:
    """int8_modelopt_ranges.compare: a served activation scale equal to ONNX Runtime's scale
    of ModelOpt's range, one float32 ulp above it, and one with no ModelOpt range at all."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    ranges = load("int8_modelopt_ranges")
    exact = ranges.ort_scale(-1.27, 0.5)  # symmetric: 1.27 * 2 / 254
    assert np.isclose(float(exact), 0.01, rtol=1e-6)
    above = np.nextafter(exact, np.float32(1.0))
    nodes, inits = [], []
    for name, scale in (("a", exact), ("b", above), ("c", exact)):
        inits += [numpy_helper.from_array(np.asarray(scale, np.float32), f"{name}_scale"),
                  numpy_helper.from_array(np.zeros((), np.int8), f"{name}_zero_point")]
        nodes += [helper.make_node("QuantizeLinear", [name, f"{name}_scale",
                                                      f"{name}_zero_point"], [f"{name}_q"]),
                  helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_scale",
                                                        f"{name}_zero_point"], [f"{name}_dq"])]
    nodes.append(helper.make_node("Sum", ["a_dq", "b_dq", "c_dq"], ["y"]))
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in "abc"]
    graph = helper.make_graph(nodes, "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                              inits)
    served = tmp_path / "model.onnx"
    onnx.save_model(helper.make_model(graph), str(served))
    found = ranges.compare(served, {"a": [-1.27, 0.5], "b": [-1.27, 0.5]})
    assert (found["activations"], found["equal"], found["max_ulps"]) == (3, 1, 1)
    assert [d["tensor"] for d in found["differ"]] == ["b"]
    assert found["no_modelopt_range"] == ["c"]


def test_the_denormals_script_runs_every_pass_both_ways(tiny_build: Path, tmp_path: Path
                                                        ) -> None:
    """benchmarks/denormals.py (issue 47): verify's and the CPU model's ONNX Runtime passes
    and the PyTorch reference, each with and without the flush, at every corner of the
    build; its PyTorch side is the build's own model (the saved reference reproduced)."""
    import json
    import subprocess

    out = tmp_path / "denormals.json"
    subprocess.run([sys.executable, str(BENCHMARKS / "denormals.py"), str(tiny_build),
                    "--random-weights", "--rounds", "2", "--json", str(out)], check=True,
                   capture_output=True, timeout=600)
    passes = json.loads(out.read_text())["passes"]
    assert list(passes) == ["verify (ONNX Runtime)", "cpu_model (ONNX Runtime)",
                            "reference (PyTorch)"]
    for found in passes.values():
        assert len(found["corners"]) == 6  # two profiles' min/opt/max
        for corner in found["corners"]:
            assert corner["median_cpu_s"]["plain"] > 0 and corner["median_cpu_s"]["flush"] > 0
            assert corner["max_abs_vs_pytorch"]["plain"] < 1e-4
            assert corner["max_abs_plain_vs_flush"] < 1e-6
    assert max(c["max_abs_vs_pytorch"]["plain"]
               for c in passes["reference (PyTorch)"]["corners"]) < 1e-5


def test_the_operator_profile_script_shares_the_kernel_time(tiny_build: Path, tmp_path: Path
                                                            ) -> None:
    """benchmarks/ort_operators.py (issue 47): the kernel time of verify's graph by operator
    (the shares sum to one, its MatMuls among them) and of the fused CPU model (Attention)."""
    import json
    import subprocess

    for model, fused in (("verify", "MatMul"), ("cpu_model", "Attention")):
        out = tmp_path / f"{model}.json"
        subprocess.run([sys.executable, str(BENCHMARKS / "ort_operators.py"), str(tiny_build),
                        "--model", model, "--json", str(out)], check=True,
                       capture_output=True, timeout=600)
        operators = json.loads(out.read_text())["operators"]
        assert fused in operators
        assert abs(sum(o["share"] for o in operators.values()) - 1) < 1e-6


def test_calibration_methods_show_decision_splits_only() -> None:
    """int8_calibration_methods.figures: each decision split's worst error (1 - cosine) and
    their largest; the held-out split only when asked (a method is chosen without it)."""
    methods = load("int8_calibration_methods")
    splits = {"calibration": {"worst": 0.9985}, "check": {"worst": 0.999},
              "search": {"worst": 0.9986}, "holdout": {"worst": 0.9}}
    precision = {"name": "precision", "seconds": 1.0, "peak_memory_mb": 10.0, "metrics": {
        "low_precision": {"matmul_gemm_low_precision": 3, "matmul_gemm_nodes": 4},
        "splits": splits, "kept_layers": ["a"]}}
    report = {"status": "ok", "peak_memory_mb": 12.0,
              "stages": [precision, {"name": "export", "cached": True, "seconds": 0.0}]}
    found = methods.figures(report, show_holdout=False)
    assert "holdout" not in found["worst_error"]
    assert found["decision_worst_error"] == round(1 - 0.9985, 8)
    assert (found["matmul_gemm_int8"], found["kept_layers"]) == ([3, 4], 1)
    assert found["cached_stages"] == ["export"]
    assert methods.figures(report, show_holdout=True)["worst_error"]["holdout"] == round(0.1, 8)
    assert methods.figures(report, True)["decision_worst_error"] == found["decision_worst_error"]


def test_the_int8_design_card_reads_its_lines_and_the_calibration_choice() -> None:
    """int8_design_card.figures/checks (issue 49): the held-out worst, the INT8 share and
    the peaks against the issue's bounds, and which calibration the build used (the
    bert-large recipe's auto: max or mse, chosen on the search split)."""
    card = load("int8_design_card")
    choice = {"chosen": "mse", "search_worst": {"max": 0.99867, "mse": 0.99886}}
    precision = {"name": "precision", "status": "ok", "seconds": 240.0,
                 "peak_memory_mb": 5898.0, "metrics": {
                     "low_precision": {"matmul_gemm_low_precision": 192,
                                       "matmul_gemm_nodes": 192},
                     "splits": {"holdout": {"worst": 0.998901, "worst_text": "Hello?"}},
                     "calibration": {"method": "mse", "choice": choice}}}
    report = {"status": "ok", "total_seconds": 400.0, "peak_memory_mb": 5898.0,
              "stages": [precision]}
    found = card.figures(report)
    assert (found["calibration_method"], found["calibration_choice"]) == ("mse", choice)
    assert found["matmul_gemm_int8"] == [192, 192]
    assert all(card.checks(0, 400.0, found).values())
    assert not card.checks(0, 400.0, {**found, "held_out_worst": 0.99871})[
        "held-out worst >= 0.9988"]
    assert not card.checks(0, 400.0, {**found, "peak_mb": 6200})["whole build <= 6 GB"]


def test_the_attention_export_script_runs_both_graphs(tmp_path: Path) -> None:
    """benchmarks/export_attention.py (issue 47): tiny-bert exported from SDPA and from eager
    attention; what ONNX Runtime runs of each (the SDPA graph's NaN guard, none in the eager
    one), both passes close to PyTorch's outputs at every corner."""
    import json
    import subprocess

    out = tmp_path / "attention.json"
    subprocess.run([sys.executable, str(BENCHMARKS / "export_attention.py"), "--recipe",
                    "tiny-bert", "--profile", "1x8:2x16:4x32", "--rounds", "1",
                    "--work", str(tmp_path / "work"), "--json", str(out)], check=True,
                   capture_output=True, timeout=600)
    found = json.loads(out.read_text())
    operators = found["optimized_operators"]
    assert operators["sdpa"].get("IsNaN", 0) > 0 and operators["eager"].get("IsNaN", 0) == 0
    assert [r["graph"] for r in found["rows"]] == ["sdpa", "eager"]
    for name in ("sdpa", "eager"):
        assert len(found["max_abs_vs_pytorch"][name]) == 3
        assert max(found["max_abs_vs_pytorch"][name]) < 1e-4
