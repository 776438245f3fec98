"""The repositories trtpack writes: every config.pbtxt parses with Triton's protobuf schema and
agrees with the model's real I/O; ensembles are wired member by member; bad options are
exit-2 errors; serving options from the recipe reach the configs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.serving.conftest import BuiltModel
from trtpack.api import BuildRequest, resolve_options
from trtpack.engine.provenance import EngineProvenance, io_records, provenance_path
from trtpack.errors import ExitCode, UserInputError
from trtpack.model_io import ModelIO, TensorIO, model_io_from_onnx
from trtpack.serving.config import check_config, read_config, write_config
from trtpack.serving.ensemble import check_ensemble
from trtpack.serving.layout import ModelRepository


def test_text_repository_layout(minilm_text_repo: ModelRepository) -> None:
    root = minilm_text_repo.root
    assert sorted(p.name for p in root.iterdir()) == [
        "minilm", "minilm_ensemble", "minilm_postprocess", "minilm_tokenizer"]
    assert (root / "minilm" / "1" / "model.onnx").is_file()
    assert (root / "minilm_tokenizer" / "1" / "model.py").is_file()
    assert (root / "minilm_tokenizer" / "1" / "tokenizer" / "tokenizer.json").is_file()
    assert (root / "minilm_postprocess" / "1" / "model.py").is_file()
    assert (root / "minilm_ensemble" / "1").is_dir()  # Triton wants a version folder
    assert minilm_text_repo.get("minilm_ensemble").members == (
        "minilm_tokenizer", "minilm", "minilm_postprocess")


@pytest.mark.parametrize("repo_fixture", ["minilm_text_repo", "classifier_text_repo",
                                          "unbatched_text_repo"])
def test_every_config_parses_and_matches_the_model(repo_fixture: str,
                                                   request: pytest.FixtureRequest) -> None:
    repo: ModelRepository = request.getfixturevalue(repo_fixture)
    for m in repo.models:
        config = read_config(m.path / "config.pbtxt")  # Triton's schema
        assert config.name == m.name
        if m.backend == "onnxruntime_onnx":
            assert config.platform == "onnxruntime_onnx"
            assert check_config(config, model_io_from_onnx(m.path / "1" / "model.onnx")) == []
        elif m.backend == "ensemble":
            assert check_ensemble(repo.root, m.name) == []
        else:
            assert config.backend == "python"
            assert (m.path / "1" / "model.py").is_file()


def test_tokenizer_config_follows_the_profiles_and_the_model_inputs(
        minilm_text_repo: ModelRepository) -> None:
    config = read_config(minilm_text_repo.root / "minilm_tokenizer" / "config.pbtxt")
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert (params["min_sequence"], params["max_sequence"]) == ("8", "128")  # 1x8:4x32:8x128
    assert config.max_batch_size == 8
    assert [(t.name, list(t.dims)) for t in config.input] == [("TEXT", [1])]
    model = read_config(minilm_text_repo.root / "minilm" / "config.pbtxt")
    assert [(t.name, t.data_type, list(t.dims)) for t in config.output] == [
        (t.name, t.data_type, list(t.dims)) for t in model.input]


def test_unbatched_model_gets_full_dims_everywhere(unbatched_text_repo: ModelRepository
                                                   ) -> None:
    for m in unbatched_text_repo.models:
        config = read_config(m.path / "config.pbtxt")
        assert config.max_batch_size == 0, m.name
        assert all(t.dims[0] == -1 for t in [*config.input, *config.output]), m.name
    tok = read_config(unbatched_text_repo.root / "minilm-nobatch_tokenizer" / "config.pbtxt")
    assert tok.parameters["max_texts"].string_value == "8"


def test_classifier_postprocess_has_the_config_json_labels(
        classifier_text_repo: ModelRepository) -> None:
    post = classifier_text_repo.root / "tiny-classifier_postprocess"
    assert json.loads((post / "1" / "labels.json").read_text()) == [
        "negative", "neutral", "positive"]
    config = read_config(post / "config.pbtxt")
    assert {k: v.string_value for k, v in config.parameters.items()}["mode"] == "softmax"
    ensemble = read_config(classifier_text_repo.root / "tiny-classifier_ensemble" /
                           "config.pbtxt")
    assert [t.name for t in ensemble.output] == ["probabilities", "label"]


def test_check_ensemble_finds_a_wrong_integer_type(minilm_text_repo: ModelRepository,
                                                   tmp_path: Path) -> None:
    """The INT64-vs-INT32 mistake: the model takes INT32 but the tokenizer gives INT64."""
    from tritonclient.grpc import model_config_pb2 as pb

    repo = tmp_path / "repo"
    shutil.copytree(minilm_text_repo.root, repo)
    config = read_config(repo / "minilm" / "config.pbtxt")
    config.input[0].data_type = pb.TYPE_INT32
    config.max_batch_size = 4
    write_config(repo / "minilm" / "config.pbtxt", config)
    problems = check_ensemble(repo, "minilm_ensemble")
    assert any("'input_ids'" in p and "int32" in p for p in problems), problems
    assert any("max_batch_size 4" in p for p in problems), problems


def test_check_ensemble_finds_an_unmapped_input(minilm_text_repo: ModelRepository,
                                                tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(minilm_text_repo.root, repo)
    config = read_config(repo / "minilm_ensemble" / "config.pbtxt")
    del config.ensemble_scheduling.step[1].input_map["token_type_ids"]
    write_config(repo / "minilm_ensemble" / "config.pbtxt", config)
    assert check_ensemble(repo, "minilm_ensemble") == [
        "minilm_ensemble: 'minilm' input 'token_type_ids' is not mapped",
        # and the tokenizer's token_type_ids is now read by no step (Triton refuses that too)
        "minilm_ensemble: ensemble tensor 'token_type_ids' is unused in ensemble "
        "'minilm_ensemble' (no step reads it and it is not an ensemble output)"]


def test_serving_options_reach_the_configs(minilm: BuiltModel, tmp_path: Path) -> None:
    settings = minilm.recipe.triton.model_copy(update={
        "instance_count": 3, "max_queue_delay_us": 250, "response_cache": True,
        "warmup": True, "version_policy": "all"})
    repo = minilm.write(tmp_path / "repo", settings=settings, serve="text")
    model = read_config(repo.root / "minilm" / "config.pbtxt")
    assert model.instance_group[0].count == 3
    assert model.dynamic_batching.max_queue_delay_microseconds == 250
    assert model.response_cache.enable
    assert model.version_policy.WhichOneof("policy_choice") == "all"
    warm = model.model_warmup[0]
    assert warm.batch_size == 4 and list(warm.inputs["input_ids"].dims) == [32]  # opt 4x32
    tok = read_config(repo.root / "minilm_tokenizer" / "config.pbtxt")
    assert tok.instance_group[0].count == 3 and not tok.response_cache.enable
    assert not tok.HasField("dynamic_batching") and not tok.model_warmup
    ensemble = read_config(repo.root / "minilm_ensemble" / "config.pbtxt")
    assert ensemble.response_cache.enable and not ensemble.instance_group
    assert repo.warnings == []


def _fake_engine(tmp_path: Path, minilm: BuiltModel, dtype: str = "int32") -> Path:
    """A stand-in model.plan (not a real engine: TensorRT is not installable here) with the
    model.plan.json the engine stage writes: an engine taking INT32 token ids."""
    plan = tmp_path / "engine" / "model.plan"
    plan.parent.mkdir()
    plan.write_bytes(b"not a real engine")
    io = model_io_from_onnx(minilm.onnx)
    engine_io = ModelIO(tuple(TensorIO(t.name, dtype, t.shape, t.batch_dynamic)
                              for t in io.inputs), io.outputs)
    inputs, outputs = io_records(engine_io)
    EngineProvenance(
        trtpack_version="0", tensorrt_version="10.13", gpu_name="NVIDIA A10G",
        compute_capability="8.6", target="g5", precision="fp16",
        profiles=[p.to_dict() for p in minilm.profiles], build_options={},
        onnx_sha256="", plan_sha256="", plan_bytes=plan.stat().st_size,
        inputs=inputs, outputs=outputs).save(provenance_path(plan))
    return plan


def test_engine_repository_with_cpu_fallback_and_cuda_graphs(minilm: BuiltModel,
                                                             tmp_path: Path) -> None:
    plan = _fake_engine(tmp_path, minilm)
    settings = minilm.recipe.triton.model_copy(update={"cuda_graphs": True, "instance_count": 2})
    repo = minilm.write(tmp_path / "repo", model_path=plan, fallback_cpu=True,
                        fallback_onnx=minilm.onnx, serve="text", settings=settings)
    names = sorted(m.name for m in repo.models)
    assert names == ["minilm", "minilm_cpu", "minilm_ensemble", "minilm_postprocess",
                     "minilm_tokenizer"]
    engine = read_config(repo.root / "minilm" / "config.pbtxt")
    assert engine.platform == "tensorrt_plan" and engine.default_model_filename == "model.plan"
    assert engine.optimization.cuda.graphs
    assert engine.instance_group[0].kind == 1 and engine.instance_group[0].count == 2  # GPU
    cpu = read_config(repo.root / "minilm_cpu" / "config.pbtxt")
    assert cpu.platform == "onnxruntime_onnx" and cpu.instance_group[0].kind == 2  # KIND_CPU
    assert check_config(cpu, model_io_from_onnx(repo.root / "minilm_cpu" / "1" / "model.onnx")
                        ) == []
    # the tokenizer gives the engine's INT32, so the INT64 CPU model gets no ensemble of its own
    tok = read_config(repo.root / "minilm_tokenizer" / "config.pbtxt")
    assert {t.data_type for t in tok.output} == {8}  # TYPE_INT32
    assert check_ensemble(repo.root, "minilm_ensemble") == []
    assert any("minilm_cpu_ensemble" in w for w in repo.warnings)


def test_fallback_with_matching_io_gets_its_own_ensemble(minilm: BuiltModel,
                                                         tmp_path: Path) -> None:
    plan = _fake_engine(tmp_path, minilm, dtype="int64")
    repo = minilm.write(tmp_path / "repo", model_path=plan, fallback_cpu=True,
                        fallback_onnx=minilm.onnx, serve="text")
    assert repo.get("minilm_cpu_ensemble").members == (
        "minilm_tokenizer", "minilm_cpu", "minilm_postprocess")
    assert check_ensemble(repo.root, "minilm_cpu_ensemble") == []


def test_serve_text_without_a_tokenizer_is_exit_2(tmp_path: Path) -> None:
    # --serve / --fallback-cpu are validated in one place, the API, before any stage runs
    request = BuildRequest("minilm", target="cpu", serve="text", out=tmp_path / "out",
                           overrides=["tokenizer=false"])
    with pytest.raises(UserInputError, match="--serve text needs a tokenizer") as e:
        resolve_options(request)
    assert e.value.exit_code == ExitCode.BAD_INPUT
    assert not (tmp_path / "out").exists()  # nothing written


def test_serve_text_with_an_empty_tokenizer_dir_is_exit_2(minilm: BuiltModel,
                                                          tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserInputError, match="no tokenizer files"):
        minilm.write(tmp_path / "repo", serve="text", tokenizer_dir=tmp_path / "empty")


def test_serve_text_for_a_non_token_input_is_exit_2(minilm: BuiltModel, tmp_path: Path) -> None:
    inputs = [i.model_copy(update={"kind": "generic"}) if i.name == "token_type_ids" else i
              for i in minilm.recipe.inputs]
    recipe = minilm.recipe.model_copy(update={"inputs": inputs})
    with pytest.raises(UserInputError, match=r"'token_type_ids' .* kind 'generic'"):
        BuiltModel(recipe, minilm.profiles, minilm.onnx, minilm.hf_dir).write(
            tmp_path / "repo", serve="text")


def test_fallback_cpu_on_a_cpu_build_is_exit_2(tmp_path: Path) -> None:
    request = BuildRequest("minilm", target="cpu", fallback_cpu=True, out=tmp_path / "out")
    with pytest.raises(UserInputError, match="--fallback-cpu") as e:
        resolve_options(request)
    assert e.value.exit_code == ExitCode.BAD_INPUT


def test_an_engine_without_provenance_is_exit_2(minilm: BuiltModel, tmp_path: Path) -> None:
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"x")
    with pytest.raises(UserInputError, match=r"model\.plan\.json"):
        minilm.write(tmp_path / "repo", model_path=plan)


def test_an_existing_repository_is_not_overwritten(minilm: BuiltModel, tmp_path: Path) -> None:
    (tmp_path / "repo" / "other").mkdir(parents=True)
    with pytest.raises(UserInputError, match="not empty"):
        minilm.write(tmp_path / "repo")


def test_onnx_on_gpu_without_engine(minilm: BuiltModel, tmp_path: Path) -> None:
    repo = minilm.write(tmp_path / "repo", gpu=True, fallback_cpu=True)
    assert read_config(repo.root / "minilm" / "config.pbtxt").instance_group[0].kind == 1
    assert read_config(repo.root / "minilm_cpu" / "config.pbtxt").instance_group[0].kind == 2


def test_recipe_can_ask_for_text_serving_and_cpu_fallback(minilm: BuiltModel) -> None:
    from pydantic import ValidationError

    from trtpack.sources.recipe import TritonSettings

    settings = TritonSettings.model_validate({"serve": "text", "fallback_cpu": True})
    assert (settings.serve, settings.fallback_cpu) == ("text", True)
    assert (TritonSettings().serve, TritonSettings().fallback_cpu) == ("tensor", False)
    with pytest.raises(ValidationError):
        TritonSettings.model_validate({"serve": "image"})


def test_tokenizers_is_carried_only_when_it_is_an_abi3_linux_build(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed (PyPI, abi3 manylinux) tokenizers is copied whole; a per-version macOS
    build found first on sys.path is not, and the build says why."""
    import importlib.metadata

    from trtpack.serving.tokenizer_model import vendor_tokenizers

    assert vendor_tokenizers(tmp_path / "vendor") is None
    installed = Path(importlib.metadata.distribution("tokenizers").locate_file("tokenizers"))
    copied = sorted(p.relative_to(tmp_path / "vendor" / "tokenizers")
                    for p in (tmp_path / "vendor" / "tokenizers").rglob("*.py"))
    assert copied == sorted(p.relative_to(installed) for p in installed.rglob("*.py"))
    assert (tmp_path / "vendor" / "tokenizers" / "tokenizers.abi3.so").stat().st_size > 1e6

    other = tmp_path / "site"
    info = other / "tokenizers-0.23.3.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tokenizers\nVersion: 0.23.3\n")
    (info / "WHEEL").write_text("Wheel-Version: 1.0\nTag: cp311-cp311-macosx_11_0_arm64\n")
    monkeypatch.syspath_prepend(str(other))
    warning = vendor_tokenizers(tmp_path / "mac")
    assert warning is not None and "not an abi3 Linux build" in warning
    assert "cp311-cp311-macosx_11_0_arm64" in warning and not (tmp_path / "mac").exists()
