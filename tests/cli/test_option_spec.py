"""Each ``trtpack build`` option is declared once, as a field of ``trtpack.options.BuildRequest``
with its ``OptionSpec``: the command's options, the request's fields, ``trtpack.build``'s
keywords and the recipe keys the options override are one set, and an option added to the
spec alone appears in all of them."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, fields
from typing import get_args, get_origin

import pydantic
import typer
import typer.core
import typer.main
from typer.testing import CliRunner

from trtpack.cli.app import app
from trtpack.cli.build import CLI_ONLY, cli_parameters, with_signature
from trtpack.options import BuildRequest, keyword, option_spec, request_from_keywords, spec
from trtpack.python_api import build as python_build
from trtpack.python_api import keyword_signature
from trtpack.sources.recipe import AUTO_PRECISION, Recipe

NO_RECIPE_KEY = {
    "target": "where the build runs and what it serves on: the run's, not the model's",
    "out": "where this run writes",
    "build_engine": "how far this run goes",
    "compile_check": "what this run checks on this machine (TensorRT-RTX installed or not)",
    "fallback": "how this run's INT8 search behaves",
    "overrides": "--set itself writes recipe keys",
    "cache_dir": "this machine's cache",
    "cache_url": "the cache this run shares with other machines",
    "use_cache": "this run's cache use",
    "timing_cache": "this machine's TensorRT timing caches",
    "min_int8_share": "this run's gate on the INT8 share",
    "force": "how this run treats a foreign --out",
    "sample_inputs": "the user's data for this run's verification",
    "skip_memory_check": "this run's check of this machine's memory",
}
"""Options without a recipe key, each with the reason it is the run's, not the model's."""

BUILD_ONLY_CHOICES = {"precision": {AUTO_PRECISION}}
"""Choices of an option that its recipe key does not take: a recipe names one precision,
``--precision auto`` chooses one at build time."""


def build_command() -> typer.core.TyperCommand:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    command = group.commands["build"]
    assert isinstance(command, typer.core.TyperCommand)
    return command


def help_options(command: typer.core.TyperCommand) -> set[str]:
    """The option names of ``command``'s ``--help``, as keywords (``--no-engine`` is
    ``no_engine``; a ``--x/--no-x`` pair is ``x``)."""
    return {next(o for o in p.opts if o.startswith("--")).removeprefix("--").replace("-", "_")
            for p in command.params if p.param_type_name == "option"}


def recipe_field(key: str) -> pydantic.fields.FieldInfo:
    """The recipe schema's field at a dotted key (``triton.serve``)."""
    model: type[pydantic.BaseModel] = Recipe
    *parents, last = key.split(".")
    for part in parents:
        annotation = model.model_fields[part].annotation
        assert isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel), key
        model = annotation
    return model.model_fields[last]


def literal_choices(info: pydantic.fields.FieldInfo) -> set[str]:
    annotation = info.annotation
    if get_origin(annotation) is not None and get_origin(annotation) is not type(None):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            annotation = args[0]
    return {str(a) for a in get_args(annotation)}


def request_options(request_type: type[BuildRequest] = BuildRequest) -> set[str]:
    return {keyword(f) for f in fields(request_type) if not option_spec(f).argument}


def test_help_spec_request_python_and_recipe_keys_are_one_set() -> None:
    command = build_command()
    cli_only = {c.name.removeprefix("as_") for c in CLI_ONLY}  # --json, --bench: the terminal's
    assert help_options(command) - {"help"} == request_options() | cli_only
    python = set(inspect.signature(python_build).parameters)
    assert python - {"model", "example_inputs", "progress", "on_warning"} == request_options()
    with_key = {f.name: option_spec(f).recipe_key for f in fields(BuildRequest)
                if option_spec(f).recipe_key is not None}
    assert set(with_key) | set(NO_RECIPE_KEY) == \
        {f.name for f in fields(BuildRequest) if not option_spec(f).argument}
    assert not set(with_key) & set(NO_RECIPE_KEY)
    for name, key in with_key.items():
        assert key is not None
        info = recipe_field(key)  # a KeyError names a recipe key that does not exist
        choices = set(option_spec(next(f for f in fields(BuildRequest) if f.name == name)).choices)
        if choices:
            assert literal_choices(info) == choices - BUILD_ONLY_CHOICES.get(name, set()), name


def test_a_request_field_that_is_no_option_is_found() -> None:
    """The set comparison can fail: an option missing from ``--help`` shows up."""
    command = build_command()
    assert request_options() - (help_options(command) - {"opset"}) == {"opset"}


@dataclass
class WithInstanceCount(BuildRequest):
    """The request with one more option, declared in the spec alone."""

    instance_count: int | None = field(default=None, metadata=spec(
        "Triton instances of the model per device. Default: the recipe's.", metavar="N",
        recipe_key="triton.instance_count"))


def test_an_option_added_to_the_spec_alone_is_in_all_four() -> None:
    seen: list[BuildRequest] = []

    def run(**values: object) -> None:
        seen.append(request_from_keywords(values, WithInstanceCount))

    command = typer.Typer()
    command.command()(with_signature(run, cli_parameters(WithInstanceCount)))
    runner = CliRunner()
    shown = runner.invoke(command, ["--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert "--instance-count" in shown.output and "Triton instances of the model" in shown.output
    assert "instance_count" not in request_options()  # the spec's own option set is unchanged
    result = runner.invoke(command, ["tiny-bert", "--instance-count", "2", "--no-engine",
                                     "--set", "opset=17"])
    assert result.exit_code == 0, result.output
    request = seen[0]
    assert isinstance(request, WithInstanceCount)
    assert (request.instance_count, request.build_engine, request.overrides) == \
        (2, False, ["opset=17"])  # the request
    assert "instance_count" in request_options(WithInstanceCount)  # the spec
    assert "instance_count" in keyword_signature(WithInstanceCount).parameters  # trtpack.build
    key = option_spec(fields(WithInstanceCount)[-1]).recipe_key
    assert key == "triton.instance_count" and recipe_field(key).annotation is int  # the recipe


def test_every_option_with_choices_refuses_a_word_outside_them() -> None:
    """Each option whose spec names choices refuses another word before any work, in one
    message naming the option and its choices (``options.check_choices``, the first check of
    ``resolve_options``), and takes its words in any case."""
    from dataclasses import replace

    import pytest

    from trtpack.api import resolve_options
    from trtpack.errors import UserInputError
    from trtpack.options import check_choices, flag, one_of

    with_choices = [f for f in fields(BuildRequest) if option_spec(f).choices]
    assert {f.name for f in with_choices} >= {"precision", "fallback", "serve", "portable",
                                              "calibration_method"}
    base = BuildRequest(model="tiny-bert", target="cpu")
    for f in with_choices:
        choices = option_spec(f).choices
        with pytest.raises(UserInputError) as refused:
            resolve_options(replace(base, **{f.name: "nonsense"}))
        assert str(refused.value) == f"{flag(f)} must be {one_of(choices)}, not 'nonsense'"
        for word in choices:
            assert getattr(check_choices(replace(base, **{f.name: f" {word.upper()}"})),
                           f.name) == word


def test_field_kinds_are_declared_on_the_spec() -> None:
    """A path option's ``str`` becomes a ``Path``, a list option's one ``str`` a list of one:
    read from ``OptionSpec.kind``, which agrees with each field's type."""
    from pathlib import Path

    for f in fields(BuildRequest):
        kind = option_spec(f).kind
        assert (kind == "path") == (str(f.type) == "Path | None"), f.name
        assert (kind == "list") == (str(f.type) == "str | Sequence[str]"), f.name
    request = BuildRequest(model="m", out="o", profiles="1x4:2x8:4x16")  # type: ignore[arg-type]
    assert request.out == Path("o") and request.profiles == ["1x4:2x8:4x16"]
