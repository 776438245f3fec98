"""``trtpack merge``: one Triton model for several GPU families, on CPU.

The build folders here are real ``trtpack build --no-engine --target <gpu>`` outputs whose
model is then replaced the way the engine stage leaves it: a ``model.plan`` with the
``model.plan.json`` trtpack's provenance code writes (I/O read from the build's ONNX) and a
``tensorrt_plan`` config from ``write_engine_model``. The plans are stand-in bytes, not
engines: the merge handles files and configs; it does not run engines (no GPU here).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_cli
from trtpack.diagnostics.inspection import MachineFacts, inspect_path
from trtpack.engine.builder import builder_settings
from trtpack.engine.provenance import EngineProvenance, io_records, onnx_hashes, provenance_path
from trtpack.machine.targets import resolve_target
from trtpack.model_io import model_io_from_onnx
from trtpack.onnx_tools.files import sha256_file
from trtpack.serving.config import check_config, read_config
from trtpack.serving.layout import write_engine_model
from trtpack.shapes import parse_profiles
from trtpack.sources.recipe import EngineSettings
from trtpack.sources.resolve import resolve_model

TENSORRT = "10.13.0.35"


def _no_engine_build(out: Path, cache_dir: Path, *extra: str, model: str = "tiny-bert",
                     profile: str = "1x4:2x8:4x16") -> Path:
    args = ["build", model, "--target", "g5", "--no-engine", "--precision", "fp32",
            "--profile", profile, "--out", str(out), "--cache-dir", str(cache_dir), *extra]
    if model == "tiny-bert":
        args.append("--random-weights")
    result = run_cli(*args)
    assert result.exit_code == 0, result.output
    return out


def engine_build(source: Path, dest: Path, target: str, **changes: object) -> Path:
    """``source`` (a --no-engine build) as the engine stage would have left it for
    ``target``: model.plan is a stand-in (not an engine), its provenance is real."""
    shutil.copytree(source, dest)
    report = json.loads((dest / "report.json").read_text())
    recipe = resolve_model(report["model"])
    name = report["model"]
    gpu = resolve_target(target).gpu
    assert gpu is not None
    onnx = dest / "artifacts" / "simplify" / "model.onnx"
    plan = dest / "artifacts" / "engine" / "model.plan"
    plan.parent.mkdir(parents=True)
    plan.write_bytes(f"stand-in engine for {target} (sm {gpu.sm}), not an engine".encode())
    profiles = parse_profiles(report["profiles"], recipe.input_specs())
    inputs, outputs = io_records(model_io_from_onnx(onnx))
    onnx_sha, data_sha = onnx_hashes(onnx)
    prov = EngineProvenance(
        trtpack_version="0.1.0", tensorrt_version=TENSORRT, gpu_name=f"NVIDIA {gpu.name}",
        compute_capability=gpu.sm, target=target, precision=report["precision"],
        profiles=[p.to_dict() for p in profiles],
        build_options=builder_settings(EngineSettings(), (10, 13, 0, 35)).to_dict(),
        onnx_sha256=onnx_sha, onnx_data_sha256=data_sha, plan_sha256=sha256_file(plan),
        plan_bytes=plan.stat().st_size, inputs=inputs, outputs=outputs,
    )
    for key, value in changes.items():
        setattr(prov, key, value)
    prov.save(provenance_path(plan))
    repo = dest / "model_repository"
    shutil.rmtree(repo / name)
    write_engine_model(repo, name, plan, profiles, recipe.triton)
    report["target"] = target
    (dest / "report.json").write_text(json.dumps(report))
    return dest


@pytest.fixture(scope="module")
def no_engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("merge-src")
    return _no_engine_build(root / "tiny-g5", root / "cache")


@pytest.fixture(scope="module")
def fleet(no_engine: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("fleet")
    return [engine_build(no_engine, root / t, t) for t in ("g5", "g4dn", "p4d")]


def test_merge_writes_one_model_with_an_engine_per_gpu_family(
        fleet: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "merged"
    result = run_cli("merge", *map(str, fleet), "--out", str(out))
    assert result.exit_code == 0, result.output
    model = out / "model_repository" / "tiny-bert"
    # parsed with Triton's own schema (tritonclient's model_config_pb2)
    config = read_config(model / "config.pbtxt")
    assert dict(config.cc_model_filenames) == {
        "7.5": "model.sm75.plan", "8.0": "model.sm80.plan", "8.6": "model.sm86.plan"}
    assert config.platform == "tensorrt_plan" and not config.default_model_filename
    for folder in fleet:
        prov = EngineProvenance.load(folder / "artifacts" / "engine" / "model.plan.json")
        file = model / "1" / f"model.sm{prov.compute_capability.replace('.', '')}.plan"
        assert sha256_file(file) == prov.plan_sha256
        assert EngineProvenance.load(provenance_path(file)) == prov
        assert check_config(config, prov.model_io()) == []
    assert sorted(p.name for p in (model / "1").iterdir() if p.suffix == ".plan") == \
        ["model.sm75.plan", "model.sm80.plan", "model.sm86.plan"]
    record = json.loads((out / "merge.json").read_text())
    assert [e["target"] for e in record["engines"]] == ["g4dn", "p4d", "g5"]
    assert "sm 8.0" not in result.stderr and "8.6 (g5)" in " ".join(result.stdout.split())


def test_inspect_lists_the_gpu_families_and_runs_on_any_of_them(
        fleet: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "merged"
    assert run_cli("merge", *map(str, fleet), "--out", str(out)).exit_code == 0
    on_a10g = inspect_path(out, MachineFacts("NVIDIA A10G", (8, 6), TENSORRT))
    (model,) = on_a10g.models
    # an engine built with hardware compatibility none serves its GPU model alone: p4d's
    # A100-SXM4-40GB engine is not p4de's (issue 45, item 2)
    assert [(f.compute_capability, f.filename, f.targets, f.not_for)
            for f in model.gpu_families] == [
        ("7.5", "model.sm75.plan", ("g4dn",), ()), ("8.0", "model.sm80.plan", ("p4d",), ("p4de",)),
        ("8.6", "model.sm86.plan", ("g5",), ())]
    assert len(model.engines) == 3 and model.problems == []
    assert on_a10g.runs_here is True
    assert inspect_path(out, MachineFacts("NVIDIA L4", (8, 9), TENSORRT)).runs_here is False
    # an engine filed under another GPU's compute capability is reported
    config_file = out / "model_repository" / "tiny-bert" / "config.pbtxt"
    config_file.write_text(config_file.read_text().replace('"7.5"', '"8.9"'))
    (wrong,) = inspect_path(out, MachineFacts(None, None, None)).models
    assert any("model.sm75.plan to compute capability 8.9, but it was built for 7.5" in p
               for p in wrong.problems), wrong.problems
    config_file.write_text(config_file.read_text().replace('"8.9"', '"7.5"'))
    shown = run_cli("inspect", str(out / "model_repository"))
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.stdout.split())
    assert "serves GPU families" in text
    assert "compute capability 7.5: model.sm75.plan g4dn (T4)" in text


def test_fallback_cpu_adds_the_onnx_runtime_model(fleet: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "merged"
    result = run_cli("merge", *map(str, fleet[:2]), "--out", str(out), "--fallback-cpu",
                     "--json")
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)  # --json: nothing but the JSON on stdout
    assert printed["engines"] == {"7.5": "model.sm75.plan", "8.6": "model.sm86.plan"}
    assert printed["models"] == ["tiny-bert", "tiny-bert_cpu"]
    cpu = out / "model_repository" / "tiny-bert_cpu"
    config = read_config(cpu / "config.pbtxt")
    assert config.platform == "onnxruntime_onnx" and (cpu / "1" / "model.onnx").is_file()
    assert check_config(config, model_io_from_onnx(cpu / "1" / "model.onnx")) == []


def _refused(args: list[str], out: Path, *expected: str) -> None:
    result = run_cli("merge", *args, "--out", str(out))
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert lines[0].startswith("error:") and len(lines) == 1, result.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}*"))


def test_bad_input_is_one_line_exit_2_and_nothing_written(
        fleet: list[Path], no_engine: Path, tmp_path: Path) -> None:
    g5 = str(fleet[0])
    out = tmp_path / "out" / "merged"
    out.parent.mkdir()
    _refused([], out, "two or more", "no build folder")
    _refused([g5], out, "one build folder", g5)
    _refused([g5, g5], out, g5, "compute capability 8.6", "one engine per compute capability")
    _refused([g5, str(no_engine)], out, str(no_engine), "not a TensorRT engine")
    plain = tmp_path / "plain"
    plain.mkdir()
    _refused([g5, str(plain)], out, str(plain), "not a trtpack build folder")

    def variant(name: str, target: str = "g6", **changes: object) -> str:
        return str(engine_build(no_engine, tmp_path / name, target, **changes))

    _refused([g5, variant("onnx", onnx_sha256="0" * 64)], out, "onnx sha256 differs", g5)
    _refused([g5, variant("precision", precision="fp16")], out, "precision differs")
    _refused([g5, variant("profiles", profiles=[{"input_ids": {"min": [1, 1], "opt": [1, 1],
                                                                "max": [1, 1]}}])],
             out, "profiles differ")
    io = json.loads((Path(g5) / "artifacts/engine/model.plan.json").read_text())["outputs"]
    io[0] = {**io[0], "dtype": "float16"}
    _refused([g5, variant("io", outputs=io)], out, "outputs differ")
    _refused([g5, variant("trt", tensorrt_version="11.4.0.106")], out,
             "tensorrt version differs")

    cpu = Path(variant("cpu"))
    report = json.loads((cpu / "report.json").read_text())
    (cpu / "report.json").write_text(json.dumps({**report, "target": "cpu"}))
    _refused([g5, str(cpu)], out, f"build folder '{cpu}' is a CPU-only build")

    missing = Path(variant("missing"))
    provenance_path(missing / "model_repository/tiny-bert/1/model.plan").unlink()
    _refused([g5, str(missing)], out, str(missing), "model.plan.json is missing")
    corrupt = Path(variant("corrupt"))
    provenance_path(corrupt / "model_repository/tiny-bert/1/model.plan").write_text("{nope")
    _refused([g5, str(corrupt)], out, str(corrupt), "not a valid trtpack provenance")
    _refused([g5, str(tmp_path / "absent")], out, "is not a folder")


def test_out_must_be_new_or_empty(fleet: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "merged"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = run_cli("merge", *map(str, fleet[:2]), "--out", str(out))
    assert result.exit_code == 2 and "not empty" in result.stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


@pytest.mark.slow
def test_serve_text_ensembles_keep_working_over_the_merged_model(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """minilm (real tokenizer) built with --serve text for two GPU targets: the merged
    repository keeps the tokenizer, post-processing and ensemble models, and the ensemble's
    wiring checks out against the merged engine model's config."""
    from trtpack.serving.ensemble import check_ensemble

    root = tmp_path_factory.mktemp("merge-text")
    source = _no_engine_build(root / "minilm", root / "cache", "--serve", "text",
                              model="minilm", profile="1x8:2x16:4x32")
    builds = [engine_build(source, root / t, t) for t in ("g4dn", "g6")]
    out = root / "merged"
    result = run_cli("merge", *map(str, builds), "--out", str(out), "--fallback-cpu")
    assert result.exit_code == 0, result.output
    repo = out / "model_repository"
    assert sorted(p.name for p in repo.iterdir()) == [
        "minilm", "minilm_cpu", "minilm_ensemble", "minilm_postprocess", "minilm_tokenizer"]
    assert check_ensemble(repo, "minilm_ensemble") == []
    assert dict(read_config(repo / "minilm" / "config.pbtxt").cc_model_filenames) == {
        "7.5": "model.sm75.plan", "8.9": "model.sm89.plan"}
    assert "no minilm_cpu_ensemble" in result.stderr
    for model in ("minilm_tokenizer", "minilm_postprocess"):
        assert sorted(p.name for p in (repo / model / "1").rglob("*")) == \
            sorted(p.name for p in (source / "model_repository" / model / "1").rglob("*"))


def test_ampere_plus_engines_are_filed_under_the_family_they_were_built_for(
        no_engine: Path, tmp_path: Path) -> None:
    """An 'ampere+' (hardware-compatible) engine for g5 (A10G, 8.6) built on an A100 (8.0):
    the merged config files it under 8.6, so an A10G's instance finds it (Triton's
    cc_model_filenames lookup, ``triton_rules.engine_file``); a plain engine keeps the
    building GPU's compute capability."""
    from trtpack.engine.provenance import runs_here
    from trtpack.serving.triton_rules import engine_file

    options = builder_settings(EngineSettings(hardware_compatibility="ampere+"),
                               (10, 13, 0, 35)).to_dict()
    g5 = engine_build(no_engine, tmp_path / "g5", "g5", gpu_name="NVIDIA A100-SXM4-40GB",
                      compute_capability="8.0", build_options=options)
    g4dn = engine_build(no_engine, tmp_path / "g4dn", "g4dn")
    out = tmp_path / "merged"
    result = run_cli("merge", str(g5), str(g4dn), "--out", str(out))
    assert result.exit_code == 0, result.output
    model = out / "model_repository" / "tiny-bert"
    config = read_config(model / "config.pbtxt")
    for gpu, cc in (("NVIDIA A10G", (8, 6)), ("Tesla T4", (7, 5))):
        file = model / "1" / engine_file(config, cc)
        assert file.is_file(), (cc, dict(config.cc_model_filenames))
        ok, reasons = runs_here(EngineProvenance.load(provenance_path(file)), gpu, cc, TENSORRT)
        assert ok, reasons
    assert engine_file(config, (8, 0)) == "model.plan"  # no A100 engine: refused, not wrong
    assert not (model / "1" / "model.plan").exists()
    record = json.loads((out / "merge.json").read_text())
    assert [(e["compute_capability"], e["target"]) for e in record["engines"]] == [
        ("7.5", "g4dn"), ("8.6", "g5")]
    (inspected,) = inspect_path(out, MachineFacts("NVIDIA A10G", (8, 6), TENSORRT)).models
    assert inspected.problems == []
    # a second ampere+ g5 engine (built on an L4) clashes with the first, as for any family
    g5_again = engine_build(no_engine, tmp_path / "g5-l4", "g5", gpu_name="NVIDIA L4",
                            compute_capability="8.9", build_options=options)
    _refused([str(g5), str(g5_again)], tmp_path / "again", "compute capability 8.6")


def test_two_gpu_models_of_one_compute_capability(no_engine: Path, tmp_path: Path) -> None:
    """Issue 45, item 2: g6 (L4) and g6e (L40S) are both 8.9, and Triton's
    cc_model_filenames holds one engine per compute capability. With hardware compatibility
    none each engine is meant for the GPU model it was built on (TensorRT
    ``include/NvInfer.h`` at a892d22, lines 10396-10423), so merge refuses them together (one
    repository per GPU model); built with same_compute_capability, the first serves both, the
    other is left out with a warning, and the config and ``inspect`` say so. Before: one
    engine per compute capability was all that was checked, and g6's served g6e."""
    same_cc = builder_settings(EngineSettings(hardware_compatibility="same_compute_capability"),
                               (10, 13, 0, 35)).to_dict()
    g6 = engine_build(no_engine, tmp_path / "g6", "g6")
    g6e = engine_build(no_engine, tmp_path / "g6e", "g6e")
    g5 = engine_build(no_engine, tmp_path / "g5", "g5")
    _refused([str(g5), str(g6), str(g6e)], tmp_path / "refused", "compute capability 8.9",
             "merge each GPU model into its own repository", "same_compute_capability")
    # one repository per GPU model
    for name, folders in (("l4", [g5, g6]), ("l40s", [g5, g6e])):
        assert run_cli("merge", str(folders[0]), str(folders[1]),
                       "--out", str(tmp_path / name)).exit_code == 0
    (l4,) = inspect_path(tmp_path / "l4", MachineFacts(None, None, None)).models
    (family,) = [f for f in l4.gpu_families if f.compute_capability == "8.9"]
    assert family.targets == ("g6",) and family.not_for == ("g6e",)
    assert family.serves is not None and "NVIDIA L4 alone" in family.serves
    # built with same_compute_capability: one engine serves both
    g6_shared = engine_build(no_engine, tmp_path / "g6-shared", "g6", build_options=same_cc)
    g6e_shared = engine_build(no_engine, tmp_path / "g6e-shared", "g6e", build_options=same_cc)
    out = tmp_path / "shared"
    result = run_cli("merge", str(g5), str(g6_shared), str(g6e_shared), "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "serves compute capability 8.9 through same_compute_capability" in \
        " ".join(result.output.split())
    text = (out / "model_repository" / "tiny-bert" / "config.pbtxt").read_text()
    config = read_config(out / "model_repository" / "tiny-bert" / "config.pbtxt")
    assert dict(config.cc_model_filenames) == {"8.6": "model.sm86.plan",
                                               "8.9": "model.sm89.plan"}
    comments = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))
    assert ("model.sm89.plan is meant for every GPU of compute capability 8.9, through "
            "hardware compatibility same_compute_capability") in comments
    assert "model.sm86.plan is meant for the NVIDIA A10G alone" in comments
    # the single build's config says it as well (write_engine_model)
    single = (g6e_shared / "model_repository" / "tiny-bert" / "config.pbtxt").read_text()
    assert "# model.plan is meant for every GPU of compute capability 8.9, through" in single
    (shared,) = inspect_path(out, MachineFacts(None, None, None)).models
    (family,) = [f for f in shared.gpu_families if f.compute_capability == "8.9"]
    assert family.targets == ("g6", "g6e") and family.not_for == ()
    shown = " ".join(run_cli("inspect", str(out)).stdout.split())
    assert "meant for every GPU of compute capability 8.9, through hardware compatibility " \
        "same_compute_capability (built on NVIDIA L4)" in shown


def test_fleet_assemble_puts_every_model_in_one_repository(
        fleet: list[Path], no_engine: Path, tmp_path: Path) -> None:
    """``trtpack fleet assemble`` (gpu.yml's last job): one model's engine builds for three
    families (stand-in plans, as above) merged by merge's rule, beside another model's CPU
    build, in one repository whose configs parse with Triton's schema; a model built both
    for the CPU and a GPU, or two GPU models of one compute capability, are refused by the
    same rules, nothing written."""
    from trtpack.testing.models import conv_onnx

    conv = conv_onnx(tmp_path / "conv.onnx")
    result = run_cli("build", str(conv), "--target", "cpu", "--profile",
                     "1x3x8x8:2x3x16x16:4x3x32x32", "--out", str(tmp_path / "conv-cpu"),
                     "--cache-dir", str(tmp_path / "cache"))
    assert result.exit_code == 0, result.output
    out = tmp_path / "assembled"
    result = run_cli("fleet", "assemble", *map(str, fleet), str(tmp_path / "conv-cpu"),
                     "--out", str(out))
    assert result.exit_code == 0, result.output
    repository = out / "model_repository"
    configs = {p.parent.name: read_config(p) for p in repository.glob("*/config.pbtxt")}
    assert {"tiny-bert", "conv"} <= set(configs)
    assert dict(configs["tiny-bert"].cc_model_filenames) == {
        "7.5": "model.sm75.plan", "8.0": "model.sm80.plan", "8.6": "model.sm86.plan"}
    assert sorted(p.name for p in (repository / "tiny-bert" / "1").glob("*.plan")) == [
        "model.sm75.plan", "model.sm80.plan", "model.sm86.plan"]
    assert configs["conv"].platform == "onnxruntime_onnx"
    record = json.loads((out / "assemble.json").read_text())
    assert {m["model"]: m["merged"] for m in record["models"]} == {"tiny-bert": True,
                                                                   "conv": False}
    # refused, nothing written
    g6 = engine_build(no_engine, tmp_path / "g6", "g6")
    g6e = engine_build(no_engine, tmp_path / "g6e", "g6e")
    for folders, says in (([fleet[0], no_engine], "is not a GPU engine build"),
                          ([g6, g6e], "compute capability 8.9")):
        refused = run_cli("fleet", "assemble", *map(str, folders), "--out",
                          str(tmp_path / "refused"))
        assert refused.exit_code == 2, refused.output
        assert refused.stderr.count("error:") == 1 and says in refused.stderr, refused.stderr
        assert not (tmp_path / "refused").exists()
        assert not list(tmp_path.glob(".refused.assembling-*"))
