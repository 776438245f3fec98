"""Which Triton serves an engine, recorded where a user deploys from: provenance, the model
repository's README, SAGEMAKER.md, ``trtpack doctor``.

The rules mirrored: a plan loads only in the TensorRT that built it, or a newer one of its
major (10.x also in 11.x) when version-compatible (TensorRT support matrix, "Engine
Portability"); Triton's TensorRT backend loads a version-compatible engine only with
``--backend-config=tensorrt,version-compatible=true`` (tensorrt_backend README: "The
``version-compatible`` flag ... The default value is false"). Engines here are a few bytes
with a provenance file (no GPU or TensorRT on this machine).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trtpack.engine.provenance import EngineProvenance, io_records, provenance_path, runs_here
from trtpack.engine.triton_release import (
    TRITON_RELEASES,
    VERSION_COMPATIBLE_BACKEND_CONFIG,
    TritonRelease,
    tensorrt_loads,
    triton_serving,
)
from trtpack.model_io import EngineTensor, engine_model_io
from trtpack.shapes import parse_profiles
from trtpack.sources.recipe import TritonSettings
from trtpack.sources.resolve import resolve_model

FLAG = "--backend-config=tensorrt,version-compatible=true"
# MADE-UP rows for the lookup logic (not real releases; the real table is TRITON_RELEASES)
TABLE = (TritonRelease("91.02", "10.14.1.48", "test row"),
         TritonRelease("91.01", "10.13.3.9", "test row"),
         TritonRelease("92.01", "11.1.0.5", "test row"))


def test_the_backend_config_is_tensorrt_backends_flag() -> None:
    assert VERSION_COMPATIBLE_BACKEND_CONFIG == FLAG


@pytest.mark.parametrize(("built", "runtime", "vc", "loads"), [
    ("10.13.3.9", "10.13.3.9", False, True), ("10.13.3.9", "10.14.1.48", False, False),
    ("10.13.3.9", "10.14.1.48", True, True), ("10.13.3.9", "11.1.0.5", True, True),
    ("10.14.1.48", "10.13.3.9", True, False), ("11.1.0.5", "10.14.1.48", True, False),
])
def test_which_tensorrt_loads_a_plan(built: str, runtime: str, vc: bool, loads: bool) -> None:
    assert tensorrt_loads(built, runtime, vc) is loads


def test_the_oldest_release_that_loads_the_engine_is_named() -> None:
    exact = triton_serving("10.13.3.9", False, TABLE)
    assert [r.release for r in exact.releases] == ["91.01"] and exact.backend_config == ()
    assert "nvcr.io/nvidia/tritonserver:91.01-py3" in exact.summary()
    assert "--backend-config" not in exact.summary()
    compatible = triton_serving("10.13.3.9", True, TABLE)
    assert [r.release for r in compatible.releases] == ["91.01", "91.02", "92.01"]
    assert compatible.backend_config == (FLAG,) and FLAG in compatible.summary()
    assert compatible.to_dict()["triton_release"] == "91.01"
    missing = triton_serving("10.12.0.36", False, TABLE)
    assert missing.minimum_release is None and missing.to_dict()["triton_image"] is None
    assert "no NGC Triton release in trtpack's table" in missing.summary()
    assert "TensorRT 10.12.0.36" in missing.summary()


def test_every_release_row_names_its_source_and_the_table_is_in_order() -> None:
    for row in TRITON_RELEASES:
        assert row.source.startswith("https://docs.nvidia.com/"), row
    versions = [tuple(map(int, r.release.split("."))) for r in TRITON_RELEASES]
    assert versions == sorted(versions)


def _provenance(version_compatible: bool, tensorrt: str = "10.13.3.9") -> EngineProvenance:
    inputs, outputs = io_records(engine_model_io([
        EngineTensor("input_ids", "input", "INT64", (-1, -1)),
        EngineTensor("attention_mask", "input", "INT64", (-1, -1)),
        EngineTensor("token_type_ids", "input", "INT64", (-1, -1)),
        EngineTensor("last_hidden_state", "output", "FLOAT", (-1, -1, 384))]))
    return EngineProvenance(
        trtpack_version="0.1.0", tensorrt_version=tensorrt, gpu_name="NVIDIA A10G",
        compute_capability="8.6", target="g5", precision="fp16", profiles=[],
        build_options={"hardware_compatibility": "none",
                       "version_compatible": version_compatible},
        onnx_sha256="0" * 64, plan_sha256="1" * 64, plan_bytes=4, inputs=inputs,
        outputs=outputs,
        triton=triton_serving(tensorrt, version_compatible).to_dict())


def test_provenance_records_the_triton_and_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "model.plan.json"
    _provenance(True).save(path)
    loaded = EngineProvenance.load(path)
    assert loaded.triton["backend_config"] == [FLAG]
    assert "10.13.3.9 or newer within 10.x" in loaded.triton["tensorrt_needed"]
    assert loaded.triton_serving().backend_config == (FLAG,)
    assert EngineProvenance.load(path).triton == loaded.to_dict()["triton"]
    _provenance(False).save(path)
    assert EngineProvenance.load(path).triton["backend_config"] == []
    # the same rule decides whether it runs on a machine (runs_here)
    assert runs_here(_provenance(True), "NVIDIA A10G", (8, 6), "11.1.0.5")[0]
    assert not runs_here(_provenance(False), "NVIDIA A10G", (8, 6), "11.1.0.5")[0]


def _engine_repository(root: Path, version_compatible: bool, ensembles: bool = False) -> Path:
    """A model repository with an engine (a few bytes + provenance), optionally with the two
    text ensembles of --serve text --fallback-cpu (configs only: nothing is served)."""
    from trtpack.serving.layout import write_engine_model

    profiles = parse_profiles(["1x8:4x32:8x128"], resolve_model("minilm").input_specs())
    plan = root / "engine" / "model.plan"
    plan.parent.mkdir(parents=True)
    plan.write_bytes(b"plan")
    _provenance(version_compatible).save(provenance_path(plan))
    repo = root / "model_repository"
    write_engine_model(repo, "minilm", plan, profiles, TritonSettings())
    if ensembles:
        configs = {
            "minilm_cpu": 'platform: "onnxruntime_onnx"',
            "minilm_tokenizer": 'backend: "python"',
            "minilm_ensemble": 'platform: "ensemble" ensemble_scheduling { step { '
                               'model_name: "minilm_tokenizer" model_version: -1 } step { '
                               'model_name: "minilm" model_version: -1 } }',
            "minilm_cpu_ensemble": 'platform: "ensemble" ensemble_scheduling { step { '
                                   'model_name: "minilm_tokenizer" model_version: -1 } step { '
                                   'model_name: "minilm_cpu" model_version: -1 } }',
        }
        _write_configs(repo, configs)
    return repo


def _write_configs(repo: Path, configs: dict[str, str]) -> None:
    """One model folder per name in ``repo``: a version folder and its config.pbtxt."""
    from trtpack.serving.config import CONFIG_FILE

    for name, body in configs.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / CONFIG_FILE).write_text(f'name: "{name}"\n{body}\n')


@pytest.mark.parametrize("version_compatible", [True, False])
def test_the_repository_readme_says_which_triton_and_the_flag(
        tmp_path: Path, version_compatible: bool) -> None:
    from trtpack.serving.layout import ModelRepository, ServedModel
    from trtpack.serving.tuning import README, write_tuning_files

    repo_dir = _engine_repository(tmp_path, version_compatible)
    repo = ModelRepository(repo_dir, [ServedModel("minilm", "model", repo_dir / "minilm",
                                                  "tensorrt_plan")])
    profiles = parse_profiles(["1x8:4x32:8x128"], resolve_model("minilm").input_specs())
    write_tuning_files(tmp_path / "tuning", repo, profiles, TritonSettings())
    text = (tmp_path / "tuning" / README).read_text()
    command = next(line for line in text.splitlines() if "tritonserver --model-repository"
                   in line)
    assert (FLAG in command) is version_compatible
    assert "TensorRT 10.13.3.9" in text
    assert ("or newer within 10.x" in text) is version_compatible
    assert ("10.13.3.9 exactly" in text) is not version_compatible


def test_sagemaker_note_names_the_container_and_every_flag(tmp_path: Path) -> None:
    pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from trtpack.serving.sagemaker import package_sagemaker

    repo = _engine_repository(tmp_path, True, ensembles=True)
    package = package_sagemaker(repo, tmp_path / "sagemaker")
    text = package.note.read_text()
    args = next(line for line in text.splitlines()
                if line.startswith("| `SAGEMAKER_TRITON_ADDITIONAL_ARGS`"))
    assert "--model-namespacing=true" in args and FLAG in args
    assert "## Container" in text
    assert "`minilm_tokenizer` is in" in text or "`minilm` is in" in text
    assert "TensorRT 10.13.3.9 or newer within 10.x" in text
    assert "InferenceResponse(error=...)" in text


def test_sagemaker_note_without_shared_models_or_engine_flags(tmp_path: Path) -> None:
    pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from trtpack.serving.sagemaker import package_sagemaker

    repo = _engine_repository(tmp_path, False)
    text = package_sagemaker(repo, tmp_path / "sagemaker").note.read_text()
    assert "--model-namespacing" not in text and FLAG not in text
    assert "TensorRT 10.13.3.9 exactly" in text


def test_doctor_says_which_triton_serves_engines_built_here(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With TensorRT present (stubbed: this machine has none, so its version is given)."""
    from trtpack.diagnostics import doctor
    from trtpack.machine import packages

    monkeypatch.setattr(packages, "tensorrt_version", lambda: "10.13.3.9")
    summary = doctor.environment_report()["summary"]
    line = next(s for s in summary if s.startswith("Triton:"))
    assert "TensorRT 10.13.3.9" in line and FLAG in line
    monkeypatch.setattr(packages, "tensorrt_version", lambda: None)
    assert not any(s.startswith("Triton:") for s in doctor.environment_report()["summary"])


def test_inspect_says_which_triton_serves_an_engine(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    plan = tmp_path / "model.plan"
    plan.write_bytes(b"plan")
    _provenance(True).save(provenance_path(plan))
    result = run_cli("inspect", str(plan))
    text = " ".join(result.stdout.split())  # the console wraps long lines
    assert "Triton: served by a Triton with TensorRT 10.13.3.9 or newer" in text
    assert FLAG in text


def test_release_floors_name_a_release_and_a_source() -> None:
    from trtpack.engine.triton_release import (
        CACHE_CONFIG,
        ERROR_ONLY_RESPONSE,
        MODEL_NAMESPACING,
        SAGEMAKER_ADDITIONAL_ARGS,
        minimum_release,
    )

    floors = [MODEL_NAMESPACING, CACHE_CONFIG, SAGEMAKER_ADDITIONAL_ARGS, ERROR_ONLY_RESPONSE]
    for feature in floors:
        assert len(tuple(map(int, feature.release.split(".")))) == 2, feature
        assert feature.source.startswith("https://github.com/"), feature
    assert minimum_release(floors) == ERROR_ONLY_RESPONSE
    assert minimum_release([MODEL_NAMESPACING, SAGEMAKER_ADDITIONAL_ARGS]) == \
        SAGEMAKER_ADDITIONAL_ARGS
    assert minimum_release([]) is None


def test_table_rows_parse_and_are_unique() -> None:
    """Every row of the real table (empty until a primary source is read: see its docstring)
    has a yy.mm release, a full TensorRT version and one row per release."""
    from trtpack.machine.packages import parse_version

    for row in TRITON_RELEASES:
        assert len(parse_version(row.release)) == 2 and row.tag == f"{row.release}-py3", row
        assert len(parse_version(row.tensorrt)) >= 3, row
    assert len({r.release for r in TRITON_RELEASES}) == len(TRITON_RELEASES)


def test_sagemaker_note_names_the_minimum_release_of_a_cpu_only_archive(
        tmp_path: Path) -> None:
    """No engine: the floor comes from the flags and the Python models alone."""
    pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from trtpack.serving.sagemaker import package_sagemaker

    repo = tmp_path / "model_repository"
    configs = {
        "minilm_cpu": 'platform: "onnxruntime_onnx" response_cache { enable: true }',
        "minilm_tokenizer": 'backend: "python"',
        "minilm_cpu_ensemble": 'platform: "ensemble" ensemble_scheduling { step { '
                               'model_name: "minilm_tokenizer" model_version: -1 } step { '
                               'model_name: "minilm_cpu" model_version: -1 } }',
    }
    _write_configs(repo, configs)
    text = package_sagemaker(repo, tmp_path / "sagemaker").note.read_text()
    assert "- Minimum release: **23.07** (`nvcr.io/nvidia/tritonserver:23.07-py3` or later" \
        in text
    assert "`--model-namespacing` (one model name in several repositories): 23.03 " \
           "(https://github.com/triton-inference-server/server/releases/tag/v2.32.0)" in text
    assert "`--cache-config` (the response cache as a cache library): 23.03" in text
    assert "`SAGEMAKER_TRITON_ADDITIONAL_ARGS` (extra tritonserver flags on SageMaker): " \
           "23.06 (https://github.com/aws/deep-learning-containers/issues/3299)" in text
    assert "needs no output tensors: 23.07 " \
           "(https://github.com/triton-inference-server/python_backend/pull/251)" in text
    assert "TensorRT" not in text  # no engine, no TensorRT requirement


def test_a_release_in_the_table_reaches_provenance_readme_sagemaker_and_doctor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan whose TensorRT is in the table gets that release's image everywhere a user
    deploys from. The row is MADE UP (release 91.01): the real table is empty because no
    primary source for the -py3 images' TensorRT could be read; TensorRT is stubbed for
    doctor (this machine has none)."""
    pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from trtpack.diagnostics import doctor
    from trtpack.engine import triton_release
    from trtpack.machine import packages
    from trtpack.serving.layout import ModelRepository, ServedModel
    from trtpack.serving.sagemaker import package_sagemaker
    from trtpack.serving.tuning import README, write_tuning_files

    row = TritonRelease("91.01", "10.13.3.9", "made-up test row")
    monkeypatch.setattr(triton_release, "TRITON_RELEASES", (row,))
    image = "nvcr.io/nvidia/tritonserver:91.01-py3"
    assert _provenance(False).to_dict()["triton"]["triton_image"] == image
    repo_dir = _engine_repository(tmp_path, False, ensembles=True)
    repo = ModelRepository(repo_dir, [ServedModel("minilm", "model", repo_dir / "minilm",
                                                  "tensorrt_plan")])
    profiles = parse_profiles(["1x8:4x32:8x128"], resolve_model("minilm").input_specs())
    write_tuning_files(tmp_path / "tuning", repo, profiles, TritonSettings())
    assert image in (tmp_path / "tuning" / README).read_text()
    note = package_sagemaker(repo_dir, tmp_path / "sagemaker").note.read_text()
    assert f"- Release: **91.01** (`{image}`; on SageMaker" in note
    assert "its TensorRT 10.13.3.9 loads the engine, and it is no older than 23.07" in note
    monkeypatch.setattr(packages, "tensorrt_version", lambda: "10.13.3.9")
    line = next(s for s in doctor.environment_report()["summary"] if s.startswith("Triton:"))
    assert image in line
    # a builder's TensorRT that no row ships names no image, only where to look
    monkeypatch.setattr(packages, "tensorrt_version", lambda: "10.12.0.36")
    line = next(s for s in doctor.environment_report()["summary"] if s.startswith("Triton:"))
    assert image not in line and "Frameworks Support Matrix" in line


def test_sagemaker_note_says_when_no_table_release_is_new_enough(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A MADE-UP row (22.01) loads the engine but predates what the flags need (23.07)."""
    pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from trtpack.engine import triton_release
    from trtpack.serving.sagemaker import package_sagemaker

    monkeypatch.setattr(triton_release, "TRITON_RELEASES",
                        (TritonRelease("22.01", "10.13.3.9", "made-up test row"),))
    repo = _engine_repository(tmp_path, False, ensembles=True)
    note = package_sagemaker(repo, tmp_path / "sagemaker").note.read_text()
    assert "- Release: none in trtpack's table both loads the engine " \
           "(nvcr.io/nvidia/tritonserver:22.01-py3 (TensorRT 10.13.3.9)) and is no older " \
           "than 23.07, for:" in note
