from __future__ import annotations

from pathlib import Path

import pytest

from trtpack.errors import UserInputError
from trtpack.model_io import ModelIO, TensorIO
from trtpack.serving.config import (
    check_config,
    max_batch_size,
    model_config,
    read_config,
    write_config,
)
from trtpack.shapes import TensorSpec, parse_profile
from trtpack.sources.recipe import TritonSettings

SPECS = [TensorSpec("input_ids", "int64", ("batch", "sequence"))]
IO = ModelIO(
    (TensorIO("input_ids", "int64", (-1, -1), True),),
    (TensorIO("hidden", "float32", (-1, -1, 384), True),),
)


def test_max_batch_is_the_largest_profile_max_and_dims_exclude_batch(tmp_path: Path) -> None:
    profiles = [parse_profile("1x8:4x32:8x128", SPECS), parse_profile("8x8:16x32:32x64", SPECS)]
    # the largest profile max: with the smallest, Triton never uses the larger profile
    # (tests/serving/test_triton_rules.py)
    assert max_batch_size(IO, profiles) == 32
    config = model_config("m", IO, profiles, TritonSettings(instance_count=2),
                          platform="onnxruntime_onnx")
    path = tmp_path / "config.pbtxt"
    write_config(path, config)
    parsed = read_config(path)
    assert parsed.max_batch_size == 32
    assert list(parsed.input[0].dims) == [-1]
    assert list(parsed.output[0].dims) == [-1, 384]
    assert list(parsed.dynamic_batching.preferred_batch_size) == [4, 16, 32]
    assert parsed.instance_group[0].count == 2
    assert check_config(parsed, IO) == []


def test_static_batch_means_max_batch_zero_and_full_dims() -> None:
    io = ModelIO((TensorIO("x", "float32", (1, 3), False),),
                 (TensorIO("y", "float32", (1, 2), False),))
    profile = parse_profile("1x3", [TensorSpec("x", "float32", (1, 3))])
    config = model_config("m", io, [profile], TritonSettings(), platform="onnxruntime_onnx")
    assert config.max_batch_size == 0
    assert list(config.input[0].dims) == [1, 3]
    assert not config.HasField("dynamic_batching")


def test_check_config_finds_the_classic_mismatches() -> None:
    profile = parse_profile("1x8:4x32:8x128", SPECS)
    config = model_config("m", IO, [profile], TritonSettings(), platform="onnxruntime_onnx")
    config.input[0].data_type = 8  # TYPE_INT32 instead of INT64
    config.output[0].dims.insert(0, -1)  # batch dimension included in dims
    problems = check_config(config, IO)
    assert any("TYPE_INT32" in p and "TYPE_INT64" in p for p in problems)
    assert any("hidden" in p and "batch dimension excluded" in p for p in problems)


def test_invalid_pbtxt_is_a_user_error(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    path.write_text('name: "m"\nmax_batch_size: "eight"\n')
    with pytest.raises(UserInputError, match="not a valid Triton config"):
        read_config(path)
