from __future__ import annotations

import pytest

from trtpack.errors import ProfileError
from trtpack.shapes import ShapeProfile, TensorSpec, parse_profile

TEXT = [
    TensorSpec("input_ids", "int64", ("batch", "sequence"), "token_ids"),
    TensorSpec("attention_mask", "int64", ("batch", "sequence"), "attention_mask"),
]
IMAGE = [TensorSpec("pixel_values", "float32", ("batch", 3, 224, 224), "image")]


def test_global_form_applies_to_every_input_with_those_axes() -> None:
    p = parse_profile("1x128:16x128:128x128", TEXT)
    for name in ("input_ids", "attention_mask"):
        r = p.shapes[name]
        assert (r.min, r.opt, r.max) == ((1, 128), (16, 128), (128, 128))
    assert p.axis_range(0) == (1, 16, 128)


def test_dynamic_axes_only_form_fills_static_dims() -> None:
    p = parse_profile("1:8:32", IMAGE)
    assert p.shapes["pixel_values"].max == (32, 3, 224, 224)
    full = parse_profile("1x3x224x224:8x3x224x224:32x3x224x224", IMAGE)
    assert full == p


def test_per_input_form_and_inference_of_unnamed_inputs() -> None:
    p = parse_profile("input_ids=1x16:4x64:8x128", TEXT)
    assert p.shapes["attention_mask"].opt == (4, 64)


def test_single_shape_means_min_opt_max_equal() -> None:
    r = parse_profile("4x32", TEXT).shapes["input_ids"]
    assert r.min == r.opt == r.max == (4, 32)


def test_corners_in_order() -> None:
    p = parse_profile("1x8:2x16:4x32", TEXT)
    assert [(c, s["input_ids"]) for c, s in p.corners()] == [
        ("min", (1, 8)), ("opt", (2, 16)), ("max", (4, 32))]


def test_round_trip_dict() -> None:
    p = parse_profile("1x8:2x16:4x32", TEXT)
    assert ShapeProfile.from_dict(p.to_dict()) == p


@pytest.mark.parametrize(
    ("text", "inputs", "expected"),
    [
        ("", TEXT, "empty profile"),
        ("1x128:16x128", TEXT, "MIN:OPT:MAX"),
        ("1xa:2x2:3x3", TEXT, "not a shape"),
        ("0x8:2x16:4x32", TEXT, "dimension 0 (batch) must be positive"),
        ("4x8:2x16:4x32", TEXT, "input 'input_ids' dimension 0 (batch) needs min <= opt <= max"),
        ("1x64:2x16:4x32", TEXT, "dimension 1 (sequence) needs min <= opt <= max"),
        ("1x8x3:2x16x3:4x32x3", TEXT, "dimension"),
        ("1x8:2x16x3:4x32", TEXT, "different ranks"),
        ("1x4x224x224:1x4x224x224:1x4x224x224", IMAGE, "dimension 1 (3) is static"),
        ("nope=1x8:2x8:4x8", TEXT, "no input 'nope'"),
        ("input_ids=1x8:2x8:4x8,attention_mask=1x8:2x8:4x16", TEXT, "must agree"),
        ("input_ids=1x8:2x8:4x8,attention_mask", TEXT, "NAME=MIN:OPT:MAX"),
    ],
)
def test_bad_profiles_name_the_problem(text: str, inputs: list[TensorSpec], expected: str) -> None:
    with pytest.raises(ProfileError) as info:
        parse_profile(text, inputs)
    assert expected in str(info.value)
