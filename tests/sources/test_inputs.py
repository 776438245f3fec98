"""The one input grammar (``--input`` and a recipe's ``inputs:`` entries)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from trtpack.cli.app import app
from trtpack.errors import ExitCode, RecipeError, UserInputError
from trtpack.shapes import TensorSpec
from trtpack.sources.inputs import (
    INPUT_DTYPES,
    InputDescription,
    ValueRule,
    parse_input_option,
    parse_input_options,
)
from trtpack.sources.recipe_files import apply_input_options, load_recipe_file
from trtpack.sources.resolve import resolve_model


@pytest.mark.parametrize(("text", "expected"), [
    ("input=float32[batch,3,224,224]",
     InputDescription("input", TensorSpec("input", "float32", ("batch", 3, 224, 224)))),
    ("sr=int64[]", InputDescription("sr", TensorSpec("sr", "int64", ()))),
    ("sr=16000", InputDescription("sr", None, ValueRule(constant=16000))),
    ("scale=0.5", InputDescription("scale", None, ValueRule(constant=0.5))),
    ("flag=true", InputDescription("flag", None, ValueRule(constant=True))),
    ("x=-1..1", InputDescription("x", None, ValueRule(low=-1, high=1))),
    ("x=0.25..1.5", InputDescription("x", None, ValueRule(low=0.25, high=1.5))),
    ("sr=int64[]=16000",
     InputDescription("sr", TensorSpec("sr", "int64", ()), ValueRule(constant=16000))),
    ("ids=int32[batch, seq]=0..999",
     InputDescription("ids", TensorSpec("ids", "int32", ("batch", "seq")),
                      ValueRule(low=0, high=999))),
    ("/model/x:0=uint8[1,2]", InputDescription(
        "/model/x:0", TensorSpec("/model/x:0", "uint8", (1, 2)))),
])
def test_each_form_parses(text: str, expected: InputDescription) -> None:
    assert parse_input_option(text) == expected


@pytest.mark.parametrize("text", [
    "sr=int64[]=16000", "x=float32[batch,8]=0.0..1.0", "flag=bool[]=true", "sr=16000",
    "x=-2..3",
])
def test_a_description_prints_back_as_it_parses(text: str) -> None:
    assert parse_input_option(str(parse_input_option(text))) == parse_input_option(text)


@pytest.mark.parametrize(("text", "problem"), [
    ("sr", "expected NAME="),
    ("=16000", "expected NAME="),
    ("sr=", "nothing after"),
    ("sr=abc", "'abc' is not a number"),
    ("sr=float64[]", "unknown dtype 'float64'"),
    ("sr=int64[batch", "is not a description"),
    ("x=float32[0,3]", "'0' is not a dimension"),
    ("x=float32[batch,-1]", "'-1' is not a dimension"),
    ("sr=int64[]=16000.5", "whole numbers"),
    ("sr=int8[]=300", "-128..127"),
    ("flag=bool[]=0..1", "true or false"),
    ("x=float32[4]=true", "true/false is not a value"),
    ("x=5..1", "runs backwards"),
    ("x=true..false", "not true/false"),
    ("sr=int64[]=", "nothing after the description"),
])
def test_bad_forms_are_exit_2_naming_the_input_and_the_forms(text: str, problem: str) -> None:
    with pytest.raises(UserInputError) as info:
        parse_input_option(text)
    assert info.value.exit_code == ExitCode.BAD_INPUT
    assert problem in str(info.value)
    name = text.partition("=")[0]
    assert (f"input '{name}'" if name else "an input") in str(info.value)
    assert info.value.hint is not None and "NAME=DTYPE[DIM,...]" in info.value.hint
    assert all(d in info.value.hint for d in INPUT_DTYPES)


def test_a_name_given_twice_is_an_error() -> None:
    assert [d.name for d in parse_input_options(["a=1", "b=0..1"])] == ["a", "b"]
    with pytest.raises(UserInputError, match="input 'a' is given twice"):
        parse_input_options(["a=1", "a=int64[]"])


def test_value_rule_is_a_constant_or_a_range() -> None:
    with pytest.raises(ValueError):
        ValueRule()
    with pytest.raises(ValueError):
        ValueRule(constant=1, low=0, high=1)
    with pytest.raises(ValueError):
        ValueRule(low=2, high=1)
    assert ValueRule(constant=3).is_constant and not ValueRule(low=0, high=1).is_constant


def test_recipe_inputs_take_mappings_with_a_value_and_grammar_strings(tmp_path: Path) -> None:
    path = tmp_path / "vad.yaml"
    path.write_text(yaml.safe_dump({
        "name": "vad", "task": "generic", "source": {"onnx": "vad.onnx"},
        "inputs": [{"name": "input", "dtype": "float32", "axes": ["batch", 512],
                    "value": "-1..1"},
                   "state=float32[2,batch,128]",
                   "sr=int64[]=16000"],
        "outputs": [{"name": "output", "axes": ["batch", 1]}],
        "profiles": ["1x512:2x512:4x512"]}))
    recipe = load_recipe_file(path)
    assert [i.name for i in recipe.inputs] == ["input", "state", "sr"]
    assert recipe.inputs[2].axes == [] and recipe.inputs[2].dtype == "int64"
    assert recipe.value_rules() == {"input": ValueRule(low=-1, high=1),
                                    "sr": ValueRule(constant=16000)}
    shown = recipe.model_dump(mode="json")["inputs"]
    assert shown[2]["value"] == 16000 and shown[0]["value"] == "-1..1"
    assert shown[1]["value"] is None


@pytest.mark.parametrize(("entry", "problem"), [
    ("sr=16000", "gives no DTYPE"),
    ("sr=int64[]=abc", "is not a number"),
    ({"name": "sr", "dtype": "int64", "axes": [], "value": 0.5}, "whole numbers"),
    ({"name": "sr", "dtype": "int64", "axes": [], "value": "1..x"}, "not a value rule"),
])
def test_a_bad_recipe_input_names_the_file_and_field(tmp_path: Path, entry: object,
                                                     problem: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({
        "name": "bad", "task": "generic", "source": {"onnx": "m.onnx"}, "inputs": [entry],
        "outputs": [{"name": "y", "axes": ["batch"]}], "profiles": ["1"]}))
    with pytest.raises(RecipeError) as info:
        load_recipe_file(path)
    assert "bad.yaml" in str(info.value) and "inputs.0" in str(info.value)
    assert problem in str(info.value)


def test_input_options_set_values_and_name_axes_on_the_recipe() -> None:
    recipe = resolve_model("tiny-bert")
    updated = apply_input_options(recipe, parse_input_options(
        ["input_ids=int64[batch,tokens]=0..99", "attention_mask=1"]))
    assert updated.inputs[0].axes == ["batch", "tokens"]
    assert updated.value_rules() == {"input_ids": ValueRule(low=0, high=99),
                                     "attention_mask": ValueRule(constant=1)}
    assert recipe.value_rules() == {}  # the original is unchanged


@pytest.mark.parametrize(("option", "problem"), [
    ("nope=1", "has no input 'nope'; its inputs are input_ids"),
    ("input_ids=int32[batch,sequence]", "is int64, not int32"),
    ("input_ids=int64[batch]", "has 2 dimension(s), not 1"),
    ("input_ids=0.5", "whole numbers"),
])
def test_input_options_that_do_not_fit_the_model_are_exit_2(option: str, problem: str
                                                            ) -> None:
    with pytest.raises(UserInputError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        apply_input_options(resolve_model("tiny-bert"), parse_input_options([option]))


def test_build_input_flag_is_checked_before_any_work(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [
        "build", "tiny-bert", "--random-weights", "--target", "cpu", "--out",
        str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"), "--input", "sr=abc"])
    assert result.exit_code == ExitCode.BAD_INPUT
    assert "input 'sr'" in result.output and "NAME=DTYPE[DIM,...]" in result.output
    assert not (tmp_path / "out").exists()
