"""The Triton config of an engine from a description of its I/O and profiles (CPU).

The engine I/O is given as ``EngineTensor`` values: what ``runtimes.tensorrt.engine_tensors``
returns from a real engine. The one test of that reader uses a stand-in object with the
four TensorRT methods it calls; it checks our loop, not TensorRT.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtpack.engine.provenance import EngineProvenance, io_records, provenance_path
from trtpack.errors import UserInputError
from trtpack.model_io import EngineTensor, engine_model_io
from trtpack.serving.config import check_config, config_text, engine_model_config, read_config
from trtpack.serving.layout import write_engine_model
from trtpack.shapes import parse_profiles
from trtpack.sources.recipe import TritonSettings
from trtpack.sources.resolve import resolve_model

pb = pytest.importorskip("tritonclient.grpc.model_config_pb2")

BERT_TENSORS = [
    EngineTensor("input_ids", "input", "INT64", (-1, -1)),
    EngineTensor("attention_mask", "input", "INT64", (-1, -1)),
    EngineTensor("token_type_ids", "input", "INT64", (-1, -1)),
    EngineTensor("last_hidden_state", "output", "FLOAT", (-1, -1, 384)),
]


@pytest.fixture
def profiles() -> list:
    recipe = resolve_model("minilm")
    return parse_profiles(["1x8:4x32:8x128", "8x128:16x256:32x512"], recipe.input_specs())


def test_engine_io_keeps_engine_dtypes_and_dims() -> None:
    io = engine_model_io(BERT_TENSORS)
    assert [t.name for t in io.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
    assert io.inputs[0].dtype == "int64" and io.inputs[0].shape == (-1, -1)
    assert io.outputs[0].dtype == "float32" and io.outputs[0].shape == (-1, -1, 384)
    assert io.all_batched


def test_engine_io_fp16_output_and_int32_input() -> None:
    io = engine_model_io([EngineTensor("x", "input", "INT32", (-1, 16)),
                          EngineTensor("y", "output", "HALF", (-1, 8))])
    assert (io.inputs[0].dtype, io.outputs[0].dtype) == ("int32", "float16")


def test_engine_io_batch_names_decide_the_batch_axis() -> None:
    io = engine_model_io(BERT_TENSORS, batch_names={"input_ids", "attention_mask"})
    assert not io.all_batched
    assert not io.inputs[2].batch_dynamic


def test_engine_io_rejects_types_triton_cannot_serve() -> None:
    with pytest.raises(UserInputError, match="FP8"):
        engine_model_io([EngineTensor("q", "output", "FP8", (-1, 4))])


def test_config_from_engine_io(profiles: list) -> None:
    config = engine_model_config("minilm", engine_model_io(BERT_TENSORS), profiles,
                                 TritonSettings(instance_count=2))
    assert config.platform == "tensorrt_plan"
    assert config.default_model_filename == "model.plan"
    # the largest profile max batch: Triton loads every profile and uses the larger one
    # (tests/serving/test_triton_rules.py)
    assert config.max_batch_size == 32
    assert [list(i.dims) for i in config.input] == [[-1], [-1], [-1]]
    assert pb.DataType.Name(config.input[0].data_type) == "TYPE_INT64"
    assert list(config.output[0].dims) == [-1, 384]
    (group,) = config.instance_group
    assert pb.ModelInstanceGroup.Kind.Name(group.kind) == "KIND_GPU"
    assert group.count == 2 and list(group.profile) == ["0", "1"]
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 16, 32]
    assert not config.model_warmup and not config.optimization.cuda.graphs
    assert check_config(config, engine_model_io(BERT_TENSORS)) == []


def test_config_text_parses_back_with_tritons_schema(profiles: list, tmp_path: Path) -> None:
    config = engine_model_config("minilm", engine_model_io(BERT_TENSORS), profiles,
                                 TritonSettings(warmup=True, cuda_graphs=True))
    path = tmp_path / "config.pbtxt"
    path.write_text(config_text(config))
    assert read_config(path) == config


def test_warmup_one_request_per_profile_at_opt(profiles: list) -> None:
    config = engine_model_config("minilm", engine_model_io(BERT_TENSORS), profiles,
                                 TritonSettings(warmup=True))
    w0, w1 = config.model_warmup
    assert (w0.name, w0.batch_size) == ("profile_0_opt", 4)
    assert list(w0.inputs["input_ids"].dims) == [32] and w0.inputs["input_ids"].zero_data
    assert pb.DataType.Name(w0.inputs["attention_mask"].data_type) == "TYPE_INT64"
    assert w1.batch_size == 16
    assert list(w1.inputs["token_type_ids"].dims) == [256]


def test_cuda_graphs_only_at_shapes_every_profile_holds(profiles: list) -> None:
    """Item I. tensorrt_backend ``InitializeCudaGraph`` (``src/instance_state.cc`` lines
    3665-3671 at e2ef6d7): "CUDA graph will be captured for every TRT contexts" -- every
    graph spec is built on every profile's context, and ``BuildCudaGraph`` logs "Failed to
    set cuda graph shape" for a spec outside that context's profile. Profiles 1x8:4x32:8x128
    and 8x128:16x256:32x512 hold only batch 8 x 128 in common: one spec, there (before: one
    spec per profile opt, 4 x 32 and 16 x 256, each failing on the other context)."""
    config = engine_model_config("minilm", engine_model_io(BERT_TENSORS), profiles,
                                 TritonSettings(cuda_graphs=True))
    cuda = config.optimization.cuda
    assert cuda.graphs
    assert [s.batch_size for s in cuda.graph_spec] == [8]
    assert list(cuda.graph_spec[0].input["input_ids"].dim) == [128]
    ps = [p.shapes for p in profiles]
    for spec in cuda.graph_spec:  # every context holds every spec
        shape = (spec.batch_size, *spec.input["input_ids"].dim)
        assert all(all(lo <= d <= hi for d, lo, hi in zip(shape, s["input_ids"].min,
                                                           s["input_ids"].max, strict=True))
                   for s in ps)


def test_cuda_graphs_are_left_out_when_profiles_share_no_shape() -> None:
    disjoint = parse_profiles(["1x8:4x32:8x64", "8x128:16x256:32x512"],
                              resolve_model("minilm").input_specs())
    config = engine_model_config("m", engine_model_io(BERT_TENSORS), disjoint,
                                 TritonSettings(cuda_graphs=True))
    assert not config.optimization.cuda.graphs and not config.optimization.cuda.graph_spec


def test_unbatched_engine(profiles: list) -> None:
    tensors = [EngineTensor("input_ids", "input", "INT64", (-1, -1)),
               EngineTensor("attention_mask", "input", "INT64", (-1, -1)),
               EngineTensor("token_type_ids", "input", "INT64", (-1, -1)),
               EngineTensor("pooled", "output", "FLOAT", (384,))]
    config = engine_model_config("m", engine_model_io(tensors), profiles,
                                 TritonSettings(warmup=True, cuda_graphs=True))
    assert config.max_batch_size == 0
    assert list(config.input[0].dims) == [-1, -1]
    assert not config.HasField("dynamic_batching")
    assert config.model_warmup[0].batch_size == 1
    assert list(config.model_warmup[0].inputs["input_ids"].dims) == [4, 32]
    assert config.optimization.cuda.graph_spec[0].batch_size == 0


def test_engine_input_without_profile_shape_is_an_error(profiles: list) -> None:
    tensors = [*BERT_TENSORS, EngineTensor("extra", "input", "INT64", (-1, -1))]
    with pytest.raises(UserInputError, match="extra"):
        engine_model_config("m", engine_model_io(tensors), profiles, TritonSettings(warmup=True))


def _provenance(io_tensors: list[EngineTensor]) -> EngineProvenance:
    inputs, outputs = io_records(engine_model_io(io_tensors))
    return EngineProvenance(
        trtpack_version="0.1.0", tensorrt_version="10.13.0.35", gpu_name="NVIDIA A10G",
        compute_capability="8.6", target="g5", precision="fp16", profiles=[],
        build_options={"hardware_compatibility": "none"}, onnx_sha256="0" * 64,
        plan_sha256="1" * 64, plan_bytes=4, inputs=inputs, outputs=outputs)


def test_write_engine_model_from_provenance(profiles: list, tmp_path: Path) -> None:
    plan = tmp_path / "engine" / "model.plan"
    plan.parent.mkdir()
    plan.write_bytes(b"plan")  # not an engine: the repository writer never reads it
    _provenance(BERT_TENSORS).save(provenance_path(plan))
    model_dir = write_engine_model(tmp_path / "repo", "minilm", plan, profiles,
                                   TritonSettings())
    assert (model_dir / "1" / "model.plan").read_bytes() == b"plan"
    assert json.loads((model_dir / "1" / "model.plan.json").read_text())["target"] == "g5"
    config = read_config(model_dir / "config.pbtxt")
    assert config.platform == "tensorrt_plan" and config.max_batch_size == 32


def test_write_engine_model_needs_provenance(profiles: list, tmp_path: Path) -> None:
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"plan")
    with pytest.raises(UserInputError, match=r"model\.plan\.json"):
        write_engine_model(tmp_path / "repo", "m", plan, profiles, TritonSettings())


class _StandInEngine:
    """NOT TensorRT: an object with the four ICudaEngine members engine_tensors() calls,
    used only to test our loop over them. Real engines are read in tests/gpu."""

    class _DType:
        def __init__(self, name: str) -> None:
            self.name = name

    def __init__(self, tensors: list[EngineTensor], input_mode: object) -> None:
        self._t = tensors
        self._input = input_mode
        self.num_io_tensors = len(tensors)

    def get_tensor_name(self, i: int) -> str:
        return self._t[i].name

    def get_tensor_mode(self, name: str) -> object:
        t = next(t for t in self._t if t.name == name)
        return self._input if t.mode == "input" else object()

    def get_tensor_dtype(self, name: str) -> _StandInEngine._DType:
        return self._DType(next(t for t in self._t if t.name == name).dtype)

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return next(t for t in self._t if t.name == name).shape


def test_engine_tensors_loop_with_a_labelled_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    from trtpack.runtimes import tensorrt as tensorrt_api

    input_mode = object()
    fake_trt = types.SimpleNamespace(TensorIOMode=types.SimpleNamespace(INPUT=input_mode))
    monkeypatch.setitem(sys.modules, "tensorrt", fake_trt)  # stand-in module, not TensorRT
    assert tensorrt_api.engine_tensors(_StandInEngine(BERT_TENSORS, input_mode)) == BERT_TENSORS
