"""Item K of issue 32: trtpack's pinned ONNX opset against the parser of every TensorRT it
supports (``trtpack.engine.parser_opsets``, rows read from onnx-tensorrt's operator table:
"TensorRT <v> supports operators in the inclusive range of opset 9 to opset <N>")."""

from __future__ import annotations

import itertools

from trtpack.engine.parser_opsets import PARSER_OPSETS, max_parsed_opset, opset_warning
from trtpack.machine.packages import MIN_TENSORRT
from trtpack.sources.recipe import Recipe
from trtpack.sources.recipe_files import RECIPES_DIR, load_recipe_file


def test_the_table_only_grows() -> None:
    """The lower-bound reading of a version between rows needs ranges that never shrink."""
    rows = list(PARSER_OPSETS)
    assert rows == sorted(rows, key=lambda r: r.tensorrt)
    assert all(a.max_opset <= b.max_opset for a, b in itertools.pairwise(rows))
    assert max_parsed_opset("10.0.1.6") == 20 and max_parsed_opset("10.15.1") == 24
    assert max_parsed_opset("11.5.0.1") == 25 and max_parsed_opset("9.3") is None


def test_every_pinned_opset_is_parsed_by_every_supported_tensorrt() -> None:
    """The oldest supported TensorRT (``MIN_TENSORRT``) reads the least; every built-in
    recipe's opset and the recipe default must be within it (and so within every newer
    one's)."""
    limit = max_parsed_opset(MIN_TENSORRT)
    assert limit is not None
    pinned = {path.stem: load_recipe_file(path).opset for path in RECIPES_DIR.glob("*.yaml")}
    pinned["(default)"] = Recipe.model_fields["opset"].default
    assert all(opset <= limit for opset in pinned.values()), (limit, pinned)
    for row in PARSER_OPSETS:
        if row.tensorrt >= MIN_TENSORRT:
            assert all(opset <= row.max_opset for opset in pinned.values()), row


def test_an_opset_above_the_parsers_is_warned_about() -> None:
    from trtpack.api import BuildRequest, resolve_options

    assert opset_warning(18, None) is None
    warning = opset_warning(23, None)
    assert warning is not None and "TensorRT 10.12 (the oldest trtpack supports)" in warning
    assert opset_warning(23, "11.5.0") is None
    request = BuildRequest(model="tiny-bert", target="g5", build_engine=False,
                           random_weights=True, opset=23)
    assert any("--opset 23" in w for w in resolve_options(request)[1])
    cpu = BuildRequest(model="tiny-bert", target="cpu", random_weights=True, opset=23)
    assert not any("--opset" in w for w in resolve_options(cpu)[1])
