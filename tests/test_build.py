"""End-to-end builds on the CPU (tiny-bert, random weights) through the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tests.conftest import run_cli, sigint_as_default, without_stage_server
from trtpack.model_io import model_io_from_onnx
from trtpack.onnx_tools.files import sha256_file
from trtpack.report import BuildReport
from trtpack.serving.config import check_config, read_config
from trtpack.shapes import TensorSpec
from trtpack.sources.recipe_files import RECIPES_DIR
from trtpack.verify.samples import make_inputs


def test_repository_config_parses_and_matches_the_onnx(tiny_build: Path) -> None:
    model_dir = tiny_build / "model_repository" / "tiny-bert"
    config = read_config(model_dir / "config.pbtxt")
    onnx_path = model_dir / "1" / "model.onnx"
    io = model_io_from_onnx(onnx_path)
    assert config.platform == "onnxruntime_onnx"
    assert check_config(config, io) == []
    assert config.max_batch_size == 8  # the largest profile max batch (4 and 8)
    assert [i.name for i in config.input] == ["input_ids", "attention_mask", "token_type_ids"]
    assert list(config.output[0].dims) == [-1, 64]
    assert list(config.dynamic_batching.preferred_batch_size) == [2, 4, 8]


def test_exported_onnx_has_named_dynamic_axes_and_pinned_opset(tiny_build: Path) -> None:
    import onnx

    version = tiny_build / "model_repository" / "tiny-bert" / "1"
    # the weight matrices in model.onnx.data, a copy of its own (not a hard link into the
    # stage cache: onnx refuses to load those) so onnx.load works on the served model
    assert (version / "model.onnx.data").stat().st_nlink == 1
    model = onnx.load(str(version / "model.onnx"))
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in (*model.graph.input, *model.graph.output)}
    assert dims["input_ids"] == ["batch", "sequence"]
    assert dims["last_hidden_state"] == ["batch", "sequence", 64]
    assert {o.version for o in model.opset_import if o.domain in ("", "ai.onnx")} == {18}


def test_report_has_stages_artifacts_versions_and_every_corner(tiny_build: Path) -> None:
    report = BuildReport.load(tiny_build / "report.json")
    assert report.status == "ok"
    assert [s.name for s in report.stages] == ["export", "simplify", "verify", "precision",
                                                "cpu_model", "engine", "package"]
    assert report.stage("precision").status == "skipped"  # type: ignore[union-attr]
    assert report.stage("engine").status == "skipped"  # type: ignore[union-attr]
    export = report.stage("export")
    assert export is not None and export.status == "ok" and export.seconds > 0
    assert export.peak_memory_mb and export.peak_memory_mb > 100
    onnx_artifact = next(a for a in export.artifacts if a.name == "onnx")
    assert sha256_file(tiny_build / onnx_artifact.path) == onnx_artifact.sha256
    for dist in ("torch", "onnx", "onnxruntime", "trtpack"):
        assert report.versions[dist]
    corners = {(r.profile, r.corner) for r in report.verification}
    assert corners == {(p, c) for p in (0, 1) for c in ("min", "opt", "max")}
    assert all(r.passed and r.max_abs_diff < 1e-3 for r in report.verification)
    simplify = report.stage("simplify")
    assert simplify is not None and simplify.metrics["nodes_before"] > 0


def test_served_onnx_matches_the_torch_reference(tiny_build: Path) -> None:
    """Independent of the pipeline's own check: rerun ORT on fresh inputs at a shape between
    the corners and compare with the reference saved by export for the same shapes."""
    from trtpack.cases import load_cases

    session = ort.InferenceSession(
        str(tiny_build / "model_repository" / "tiny-bert" / "1" / "model.onnx"))
    cases = load_cases(tiny_build / "artifacts" / "export" / "reference.npz")
    assert len(cases) == 6
    for case in cases:
        assert case.inputs["attention_mask"].min() == 0 or case.corner == "min"  # padded rows
        assert len(np.unique(case.inputs["input_ids"])) > 3  # not constant inputs
        got = session.run(None, case.inputs)[0]
        np.testing.assert_allclose(got, case.outputs["last_hidden_state"], atol=1e-4)
    specs = [TensorSpec(n, "int64", ("batch", "sequence"), k) for n, k in (
        ("input_ids", "token_ids"), ("attention_mask", "attention_mask"),
        ("token_type_ids", "token_type_ids"))]
    feeds = make_inputs(specs, {s.name: (3, 12) for s in specs}, vocab_size=1000, seed=7)
    out = session.run(None, feeds)[0]
    assert out.shape == (3, 12, 64) and np.isfinite(out).all()


def test_rebuild_reuses_every_stage(tiny_build: Path, cache_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "again"
    result = run_cli("build", "tiny-bert", "--random-weights", "--target", "cpu",
                     "--profile", "1x4:2x8:4x16", "--profile", "2x16:4x32:8x64",
                     "--out", str(out), "--cache-dir", str(cache_dir), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    ran = {s["name"]: s for s in report["stages"]}
    assert all(ran[n]["cached"] for n in ("export", "simplify", "verify"))
    assert not ran["package"]["cached"]
    assert (out / "model_repository" / "tiny-bert" / "1" / "model.onnx").is_file()
    first = BuildReport.load(tiny_build / "report.json")
    assert [r.max_abs_diff for r in first.verification] == [
        r["max_abs_diff"] for r in report["verification"]]


def test_accuracy_failure_exits_1_and_keeps_the_previous_output(
    tiny_build: Path, cache_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "keep"
    ok = run_cli("build", "tiny-bert", "--random-weights", "--target", "cpu",
                 "--out", str(out), "--cache-dir", str(cache_dir))
    assert ok.exit_code == 0, ok.output
    marker = sha256_file(out / "report.json")
    strict = tmp_path / "strict.yaml"
    strict.write_text("extends: tiny-bert\nname: tiny-bert\n"
                      "verify:\n  fp32: {atol: 1.0e-12, min_cosine: 1.0}\n")
    failed = run_cli("build", str(strict), "--random-weights", "--target", "cpu",
                     "--out", str(out), "--cache-dir", str(cache_dir))
    assert failed.exit_code == 1, failed.output
    assert "FAIL" in failed.output and "max abs diff" in failed.output
    assert sha256_file(out / "report.json") == marker  # previous build untouched
    failed_report = BuildReport.load(tmp_path / "keep.failed" / "report.json")
    assert failed_report.status == "accuracy_failed"
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]
    # the CPU model's head start (its fusion, beside verify) made files for a stage that
    # never ran: the failed build's folder holds only what ran
    assert not (tmp_path / "keep.failed" / "artifacts" / "cpu_model").exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "kill"])
def test_ctrl_c_mid_build_leaves_nothing_half_written(signum: int, tmp_path: Path) -> None:
    import psutil

    out = tmp_path / "interrupted"
    # its stage processes found among its children: none from a stage server
    env = without_stage_server({**os.environ, "TRTPACK_CACHE_DIR": str(tmp_path / "cache")})
    proc = subprocess.Popen(
        [sys.executable, "-m", "trtpack.cli", "build", "tiny-bert", "--random-weights",
         "--target", "cpu", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=sigint_as_default,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(tmp_path.glob(".interrupted.partial-*")):
        time.sleep(0.1)
    time.sleep(2.0)  # inside the export stage, which runs in a child process
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, [p.cmdline() for p in alive]
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".interrupted")]
    stages = tmp_path / "cache" / "stages"
    leftovers = [p for p in stages.rglob("*") if ".tmp-" in p.name] if stages.exists() else []
    assert not leftovers


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        (["build", "no-such-model"], 2, "known recipes: "),
        (["build", "missing/dir/recipe.yaml"], 2, "does not exist"),
        (["build", "tiny-bert", "--profile", "1x8:2x4:4x16"], 2, "min <= opt <= max"),
        (["build", "tiny-bert", "--profile", "1x8x2:2x8x2:4x8x2"], 2, "dynamic axes"),
        (["build", "tiny-bert", "--precision", "int4"], 2,
         "--precision must be fp32, fp16, int8 or auto, not 'int4'"),
        (["build", "tiny-bert", "--target", "tpu"], 2, "unknown target 'tpu'"),
        (["build", "tiny-bert", "--target", "g5"], 3, "--target cpu"),
        (["build", "resnet-50", "--serve", "text", "--target", "cpu"], 2, "needs a tokenizer"),
        (["build", "tiny-bert", "--fallback", "maybe"], 2, "--fallback must be"),
        (["build", "tiny-bert", "--calibration", "nope.txt", "--precision", "int8"], 2,
         "does not exist"),
    ],
)
def test_bad_input_is_one_clear_line_and_an_exit_code(
    args: list[str], code: int, expected: str, tmp_path: Path
) -> None:
    result = run_cli(*args, "--out", str(tmp_path / "out"))
    assert result.exit_code == code, result.output
    assert expected in result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_unreadable_yaml_recipe_is_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ninputs: [\n")
    result = run_cli("build", str(bad), "--out", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert "not valid YAML" in result.stderr and str(bad) in result.stderr


@pytest.mark.parametrize("module", ["modelopt", "onnxslim"])
def test_missing_modelopt_dependency_is_exit_3_before_any_work(
    module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # sys.modules[name] = None makes find_spec report the package as not installed
    monkeypatch.setitem(sys.modules, module, None)
    out = tmp_path / "out"
    result = run_cli("build", "tiny-bert", "--random-weights", "--target", "cpu",
                     "--precision", "fp16", "--out", str(out))
    assert result.exit_code == 3, result.output
    assert "--precision fp16 (NVIDIA ModelOpt) needs" in result.stderr
    assert "trtpack[modelopt]" in result.stderr
    assert not out.exists() and not list(tmp_path.iterdir())
    doctor = run_cli("doctor")
    assert doctor.exit_code == 0
    assert "precision conversion (fp16/int8) needs" in doctor.stdout


def test_onnxsim_failure_keeps_the_exported_model_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trtpack.stages import simplify

    # a real onnxsim run, killed by its timeout: the build goes on with the export
    monkeypatch.setenv(simplify.TIMEOUT_ENV, "0.01")
    out = tmp_path / "out"
    result = run_cli("build", "tiny-bert", "--random-weights", "--target", "cpu",
                     "--profile", "1x4:2x8:4x16", "--out", str(out),
                     "--cache-dir", str(tmp_path / "cache"), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    stage = next(s for s in report["stages"] if s["name"] == "simplify")
    assert stage["status"] == "skipped"
    assert "onnxsim failed (timed out after 0.01 s); kept the unsimplified model" \
        in stage["message"]
    assert any("onnxsim failed" in w for w in report["warnings"])
    # the CPU model (the served one, fused for ONNX Runtime) was made from the exported model
    cpu_model = next(s for s in report["stages"] if s["name"] == "cpu_model")
    exported = onnx_nodes(out / "artifacts" / "export" / "model.onnx")
    assert cpu_model["metrics"]["nodes_before"] == exported == stage["metrics"]["nodes_before"]


def onnx_nodes(path: Path) -> int:
    import onnx

    return len(onnx.load(str(path), load_external_data=False).graph.node)


def test_gpu_target_without_gpu_names_what_is_missing(tmp_path: Path) -> None:
    """`trtpack build minilm --target g5` on a machine without a GPU names what is missing."""
    if os.path.exists("/dev/nvidia0"):
        pytest.skip("this machine has an NVIDIA GPU")
    out = tmp_path / "out"
    result = run_cli("build", "minilm", "--target", "g5", "--out", str(out))
    assert result.exit_code == 3, result.output
    first = result.stderr.splitlines()[0]
    assert "--target g5 (A10G, compute capability 8.6)" in first
    assert "found no GPU" in first and "no TensorRT" in first
    assert "--target cpu" in result.stderr and "--no-engine" in result.stderr
    assert not out.exists()


def test_volta_target_cannot_have_engines_but_no_engine_builds(tmp_path: Path) -> None:
    result = run_cli("build", "tiny-bert", "--random-weights", "--target", "p3",
                     "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert "TensorRT 10.5 and later do not support it" in result.stderr
    targets = run_cli("targets")
    assert targets.exit_code == 0
    assert "* target 'p3' is V100" in targets.stdout


def test_gpu_target_with_no_engine_builds_everything_up_to_the_engine(
    tmp_path: Path, cache_dir: Path
) -> None:
    from trtpack.serving.config import read_config

    out = tmp_path / "out"
    result = run_cli("build", "tiny-bert", "--random-weights", "--target", "g5", "--no-engine",
                     "--fallback-cpu", "--profile", "1x4:2x8:4x16", "--out", str(out),
                     "--cache-dir", str(cache_dir), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    stages = {s["name"]: s for s in report["stages"]}
    assert stages["engine"]["status"] == "skipped" and stages["engine"]["message"] == \
        "--no-engine"
    assert report["target"] == "g5"
    repo = out / "model_repository"
    gpu_model = read_config(repo / "tiny-bert" / "config.pbtxt")
    assert gpu_model.platform == "onnxruntime_onnx"
    assert (repo / "tiny-bert" / "1" / "model.onnx").is_file()
    cpu_model = read_config(repo / "tiny-bert_cpu" / "config.pbtxt")
    assert [g.kind for g in cpu_model.instance_group] == [cpu_model.instance_group[0].KIND_CPU]


def test_set_overrides_recipe_serving_options_in_the_config(tmp_path: Path,
                                                            cache_dir: Path) -> None:
    from trtpack.serving.config import read_config

    out = tmp_path / "out"
    result = run_cli("build", "tiny-bert", "--random-weights", "--target", "cpu",
                     "--profile", "1x4:2x8:4x16", "--out", str(out), "--cache-dir",
                     str(cache_dir), "--set", "triton.instance_count=3",
                     "--set", "triton.max_queue_delay_us=750",
                     "--set", "triton.response_cache=true")
    assert result.exit_code == 0, result.output
    config = read_config(out / "model_repository" / "tiny-bert" / "config.pbtxt")
    assert [g.count for g in config.instance_group] == [3]
    assert config.dynamic_batching.max_queue_delay_microseconds == 750
    assert config.response_cache.enable


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("triton.instance_count=0", "triton.instance_count: Input should be greater than"),
        ("triton.no_such_option=1", "triton.no_such_option: unknown key"),
        ("triton.instance_count", "expected KEY=VALUE"),
        ("engine.optimization_level=fast", "engine.optimization_level"),
        # PyYAML raises ValueError (not a YAMLError) for an escape past Unicode's range; found
        # by the fuzz suites' full search (TRTPACK_FUZZ=full)
        ('triton.instance_count="\\U0011ffff"', "triton.instance_count"),
    ],
)
def test_bad_set_override_is_exit_2_naming_it(override: str, expected: str,
                                              tmp_path: Path) -> None:
    result = run_cli("build", "tiny-bert", "--random-weights", "--target", "cpu",
                     "--set", override, "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert expected in result.stderr
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


def test_error_in_the_export_process_keeps_its_exit_code_and_hint(tmp_path: Path) -> None:
    """The export stage runs in a child process; a user error there is exit 3 with its
    hint here, the failed build's report names the stage, and the process is gone."""
    out = tmp_path / "out"
    # a model factory whose package is not installed: found out when the export loads it
    recipe = (RECIPES_DIR / "tiny-bert.yaml").read_text().replace(
        "  random_weights: true", '  factory: "trtpack_absent_models:make"')
    (tmp_path / "absent.yaml").write_text(recipe)
    result = run_cli("build", str(tmp_path / "absent.yaml"), "--target", "cpu", "--out",
                     str(out), "--cache-dir", str(tmp_path / "cache"))
    assert result.exit_code == 3, result.output
    assert "cannot import 'trtpack_absent_models'" in result.stderr
    assert "hint: pip install the package that provides trtpack_absent_models" in result.stderr
    report = json.loads((tmp_path / "out.failed" / "report.json").read_text())
    assert report["status"] == "failed" and "cannot import" in report["error"]
    assert not out.exists()
    import multiprocessing

    assert not multiprocessing.active_children()


def test_perf_analyzer_script_names_the_final_repository_and_sends_the_verified_inputs(
        tiny_build: Path, tmp_path: Path) -> None:
    """Run OUT/tuning/perf_analyzer.sh with a perf_analyzer stand-in on PATH (no Triton
    here) that records its arguments: every run sends a perf_inputs_*.json of the build."""
    script = tiny_build / "tuning" / "perf_analyzer.sh"
    text = script.read_text()
    assert ".tmp" not in text and "../model_repository/" in text
    assert "--input-data zero" not in text
    fake = tmp_path / "bin" / "perf_analyzer"
    fake.parent.mkdir()
    log = tmp_path / "calls.txt"
    fake.write_text(f'#!/usr/bin/env bash\necho "$*" >> {log}\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    subprocess.run(["bash", str(script)], env=env, check=True, timeout=30)
    calls = log.read_text().splitlines()
    assert len(calls) == 4  # two profiles, opt and max each
    for call in calls:
        data = Path(call.split("--input-data ")[1].split()[0])
        assert data.parent == tiny_build / "tuning" and data.name.startswith("perf_inputs_p")
        batch = int(call.split(" -b ")[1].split()[0])
        entries = json.loads(data.read_text())["data"]
        assert len(entries) >= batch  # a row of the verified corner per entry, -b of them sent
        assert any(v for e in entries for v in e["input_ids"]["content"])  # not zeros


def test_inspect_check_runs_a_cpu_build_s_onnx_model(tiny_build: Path, tmp_path: Path) -> None:
    result = run_cli("inspect", str(tiny_build), "--check")
    assert result.exit_code == 0, result.output
    assert "no engine found" not in result.output
    assert "runs on this machine (ONNX Runtime loads" in " ".join(result.stdout.split())
    broken = tmp_path / "broken"
    import shutil

    shutil.copytree(tiny_build / "model_repository", broken / "model_repository")
    (broken / "model_repository" / "tiny-bert" / "1" / "model.onnx").write_bytes(b"not onnx")
    failed = run_cli("inspect", str(broken), "--check")
    assert failed.exit_code == 3
    assert "ONNX Runtime cannot load it" in failed.stderr
