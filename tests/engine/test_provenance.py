"""model.plan.json (provenance) and ``trtpack inspect``: pure logic on CPU.

The plans here are a few bytes of placeholder, never engines: inspect reads the provenance
beside a plan, and only deserializes a plan when TensorRT and a GPU are present.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trtpack.diagnostics.inspection import MachineFacts, inspect_path
from trtpack.engine.provenance import (
    EngineProvenance,
    io_records,
    onnx_hashes,
    provenance_path,
    runs_here,
)
from trtpack.errors import UserInputError
from trtpack.model_io import EngineTensor, engine_model_io
from trtpack.onnx_tools.files import sha256_file
from trtpack.serving.layout import write_engine_model
from trtpack.shapes import parse_profiles
from trtpack.sources.recipe import TritonSettings
from trtpack.sources.resolve import resolve_model

TENSORS = [
    EngineTensor("input_ids", "input", "INT64", (-1, -1)),
    EngineTensor("attention_mask", "input", "INT64", (-1, -1)),
    EngineTensor("token_type_ids", "input", "INT64", (-1, -1)),
    EngineTensor("last_hidden_state", "output", "HALF", (-1, -1, 384)),
]
A10G_HERE = MachineFacts("NVIDIA A10G", (8, 6), "10.13.0.35")
CPU_HERE = MachineFacts(None, None, None)


def make_provenance(**changes: object) -> EngineProvenance:
    inputs, outputs = io_records(engine_model_io(TENSORS))
    prov = EngineProvenance(
        trtpack_version="0.1.0", tensorrt_version="10.13.0.35", gpu_name="NVIDIA A10G",
        compute_capability="8.6", target="g5", precision="fp16",
        profiles=[{"input_ids": {"min": [1, 8], "opt": [4, 32], "max": [8, 128]}}],
        build_options={"hardware_compatibility": "none", "version_compatible": False,
                       "optimization_level": 3},
        onnx_sha256="a" * 64, plan_sha256="b" * 64, plan_bytes=4, inputs=inputs,
        outputs=outputs, cuda_runtime_version="12.8", driver_version="550.54.15",
        trtexec="trtexec --onnx=m.onnx",
    )
    for key, value in changes.items():
        setattr(prov, key, value)
    return prov


def test_json_round_trip(tmp_path: Path) -> None:
    prov = make_provenance()
    path = tmp_path / "model.plan.json"
    prov.save(path)
    loaded = EngineProvenance.load(path)
    assert loaded == prov
    assert loaded.model_io() == engine_model_io(TENSORS)


def test_unknown_keys_from_a_newer_trtpack_are_ignored(tmp_path: Path) -> None:
    data = make_provenance().to_dict() | {"added_later": 1}
    assert EngineProvenance.from_dict(data) == make_provenance()


def test_provenance_path() -> None:
    assert provenance_path(Path("a/1/model.plan")) == Path("a/1/model.plan.json")


def test_onnx_hashes_cover_external_data(tmp_path: Path) -> None:
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"graph")
    assert onnx_hashes(onnx) == (sha256_file(onnx), None)
    (tmp_path / "model.onnx.data").write_bytes(b"weights")
    assert onnx_hashes(onnx)[1] == sha256_file(tmp_path / "model.onnx.data")


@pytest.mark.parametrize(("gpu", "cc", "trt", "ok"), [
    ("NVIDIA A10G", (8, 6), "10.13.0.35", True),
    ("NVIDIA A10", (8, 6), "10.13.0.35", False),  # same compute capability, another GPU
    ("NVIDIA L4", (8, 9), "10.13.0.35", False),
    ("NVIDIA A10G", (8, 6), "10.13.1.0", False),  # engines need the exact TensorRT
    (None, None, "10.13.0.35", False),
    ("NVIDIA A10G", (8, 6), None, False),
])
def test_runs_here_native_engine(gpu: str | None, cc: tuple[int, int] | None, trt: str | None,
                                 ok: bool) -> None:
    result, reasons = runs_here(make_provenance(), gpu, cc, trt)
    assert result is ok
    assert bool(reasons) is not ok


def test_runs_here_portable_and_version_compatible() -> None:
    prov = make_provenance(build_options={"hardware_compatibility": "ampere+",
                                          "version_compatible": True})
    assert runs_here(prov, "NVIDIA H100", (9, 0), "10.14.1")[0]
    assert runs_here(prov, "NVIDIA L4", (8, 9), "11.0.0")[0]
    ok, reasons = runs_here(prov, "Tesla T4", (7, 5), "10.12.0")
    assert not ok and len(reasons) == 2  # pre-Ampere GPU and an older TensorRT
    # across majors only 10 -> 11 (and 8 -> 10): a TensorRT 12 runtime is refused
    ok, reasons = runs_here(prov, "NVIDIA H100", (9, 0), "12.0.0")
    assert not ok and "10.x into 11.x" in reasons[0]
    eleven = make_provenance(tensorrt_version="11.1.0",
                             build_options={"hardware_compatibility": "none",
                                            "version_compatible": True})
    assert runs_here(eleven, "NVIDIA A10G", (8, 6), "11.4.1")[0]
    assert not runs_here(eleven, "NVIDIA A10G", (8, 6), "10.16.1")[0]


def test_runs_here_a_plain_engine_needs_its_gpu_model_not_only_its_compute_capability(
        ) -> None:
    """Hardware compatibility ``none`` (TensorRT's kNONE) is meant for the GPU model the
    engine was built on: an L4 engine does not run on an L40S (both 8.9), while one built with
    ``same_compute_capability`` does, and ``ampere+`` runs on any 8.0+ GPU."""
    l4 = make_provenance(gpu_name="NVIDIA L4", compute_capability="8.9", target="g6")
    assert runs_here(l4, "NVIDIA L4", (8, 9), "10.13.0.35") == (True, [])
    ok, reasons = runs_here(l4, "NVIDIA L40S", (8, 9), "10.13.0.35")
    assert not ok and len(reasons) == 1
    assert "'none'" in reasons[0] and "NVIDIA L4 " in reasons[0] and "L40S" in reasons[0]
    assert "same_compute_capability" in reasons[0]
    shared = make_provenance(gpu_name="NVIDIA L4", compute_capability="8.9", target="g6",
                             build_options={"hardware_compatibility": "same_compute_capability",
                                            "version_compatible": False})
    assert runs_here(shared, "NVIDIA L40S", (8, 9), "10.13.0.35")[0]
    assert not runs_here(shared, "NVIDIA A10G", (8, 6), "10.13.0.35")[0]
    h100 = make_provenance(gpu_name="NVIDIA H100 80GB HBM3", compute_capability="9.0")
    assert runs_here(h100, "NVIDIA-H100 80GB hbm3", (9, 0), "10.13.0.35")[0]  # the same words
    t4 = make_provenance(gpu_name="NVIDIA T4", compute_capability="7.5")
    assert runs_here(t4, "Tesla T4", (7, 5), "10.13.0.35")[0]  # the vendor's word aside
    assert not runs_here(h100, "NVIDIA H200", (9, 0), "10.13.0.35")[0]


def test_runs_here_reasons_name_both_sides() -> None:
    _, reasons = runs_here(make_provenance(), "NVIDIA L4", (8, 9), "10.12.0.36")
    text = " ".join(reasons)
    assert "A10G" in text and "L4" in text and "10.13.0.35" in text and "10.12.0.36" in text


def _write_plan(folder: Path, prov: EngineProvenance | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    plan = folder / "model.plan"
    plan.write_bytes(b"plan")  # placeholder bytes, not an engine
    if prov is not None:
        prov.save(provenance_path(plan))
    return plan


def test_inspect_engine_file(tmp_path: Path) -> None:
    plan = _write_plan(tmp_path, make_provenance())
    result = inspect_path(plan, A10G_HERE)
    assert result.kind == "engine" and result.runs_here is True
    (engine,) = result.engines
    assert engine.provenance is not None and engine.provenance.target == "g5"
    assert engine.io is not None and engine.io.outputs[0].dtype == "float16"
    # the JSON path inspects the same engine
    assert inspect_path(provenance_path(plan), A10G_HERE).engines[0].path == str(plan)


def test_inspect_on_a_cpu_machine_says_why_not(tmp_path: Path) -> None:
    result = inspect_path(_write_plan(tmp_path, make_provenance()), CPU_HERE)
    assert result.runs_here is False
    assert any("no NVIDIA GPU" in r for r in result.engines[0].reasons)


def test_inspect_engine_without_provenance(tmp_path: Path) -> None:
    result = inspect_path(_write_plan(tmp_path), CPU_HERE)
    assert result.runs_here is None and result.engines[0].provenance is None


def test_inspect_model_repository(tmp_path: Path) -> None:
    profiles = parse_profiles(["1x8:4x32:8x128"], resolve_model("minilm").input_specs())
    plan = _write_plan(tmp_path / "engine", make_provenance())
    repo = tmp_path / "model_repository"
    write_engine_model(repo, "minilm", plan, profiles, TritonSettings())
    for where in (repo, repo / "minilm", tmp_path / "engine" / ".."):
        result = inspect_path(where, A10G_HERE)
        assert result.runs_here is True, where
    result = inspect_path(repo, A10G_HERE)
    (model,) = result.models
    assert (model.platform, model.max_batch_size, model.profiles) == ("tensorrt_plan", 8, ["0"])
    assert model.inputs[0] == {"name": "input_ids", "data_type": "TYPE_INT64", "dims": [-1],
                               "axes": [-1]}  # no ONNX or recipe.yaml beside the plan: unnamed
    assert model.problems == []
    assert inspect_path(repo, MachineFacts("NVIDIA L4", (8, 9), "10.13.0.35")).runs_here is False


def test_inspect_reports_a_config_that_disagrees_with_the_engine(tmp_path: Path) -> None:
    profiles = parse_profiles(["1x8:4x32:8x128"], resolve_model("minilm").input_specs())
    plan = _write_plan(tmp_path / "engine", make_provenance())
    model_dir = write_engine_model(tmp_path / "repo", "m", plan, profiles, TritonSettings())
    config = model_dir / "config.pbtxt"
    config.write_text(config.read_text().replace("TYPE_INT64", "TYPE_INT32", 1))
    (model,) = inspect_path(tmp_path / "repo", A10G_HERE).models
    assert any("input_ids" in p and "TYPE_INT32" in p for p in model.problems)


def test_inspect_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="does not exist"):
        inspect_path(tmp_path / "nope", CPU_HERE)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserInputError, match="not an engine"):
        inspect_path(tmp_path / "empty", CPU_HERE)
    bad = _write_plan(tmp_path / "bad")
    provenance_path(bad).write_text("{not json")
    with pytest.raises(UserInputError, match="not a trtpack provenance"):
        inspect_path(bad, CPU_HERE)


def test_cli_inspect_shows_provenance_and_io_and_check_exits_3(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    plan = _write_plan(tmp_path, make_provenance())
    result = run_cli("inspect", str(plan))
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    # the path may be wrapped anywhere (a worker's tmp_path is longer): compared without spaces
    assert f"{plan}:aTensorRTengine" in "".join(result.stdout.split())
    assert "NVIDIA A10G" in text and "TensorRT 10.13.0.35" in text
    assert "last_hidden_state" in text and "float16" in text
    assert "runs on this machine:" in text
    if gpu_and_tensorrt_here():
        return
    assert "no NVIDIA GPU on this machine" in text
    checked = run_cli("inspect", "--check", str(plan))
    assert checked.exit_code == 3
    assert "cannot run here" in checked.output


def gpu_and_tensorrt_here() -> bool:
    from trtpack.machine.gpus import detect_gpu
    from trtpack.machine.packages import tensorrt_available

    return detect_gpu() is not None and tensorrt_available()
