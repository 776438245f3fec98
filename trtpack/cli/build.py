"""``trtpack build``: a typer command over ``trtpack.api.build``; ``trtpack.cli.console`` shows
its progress and summary. Its parameters are made from ``trtpack.options.BuildRequest``, where
each option is declared once; ``--json`` and ``--bench`` are this command's own."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Annotated, get_type_hints

import typer

from trtpack.cli.console import ProgressView, err, out, print_build_summary, print_warning
from trtpack.cli.exits import handle_errors
from trtpack.options import (
    BuildRequest,
    is_list,
    keyword,
    keyword_default,
    option_spec,
    request_from_keywords,
)

commands = typer.Typer()


@dataclass(frozen=True)
class CliOnlyOption:
    """An option of the terminal run, not of the build: no request field, no recipe key."""

    name: str
    flag: str
    help: str
    after: str  # the request field it follows in --help


CLI_ONLY = (
    CliOnlyOption("as_json", "--json", "Print the report as JSON instead of the summary.",
                  after="use_cache"),
    CliOnlyOption("bench", "--bench", "After packaging, measure latency per profile corner "
                  "against PyTorch (trtpack bench).", after="skip_memory_check"),
)


def cli_parameters(request_type: type[BuildRequest] = BuildRequest,
                   cli_only: tuple[CliOnlyOption, ...] = CLI_ONLY) -> list[inspect.Parameter]:
    """The command's parameters, one per request field (and ``cli_only``), each annotated
    with its ``typer.Option`` from the field's ``OptionSpec``: a list option takes a
    ``list[str]``, an inverted one (``--no-engine``) a flag that defaults to off."""
    hints = get_type_hints(request_type)
    parameters: list[inspect.Parameter] = []
    for f in fields(request_type):
        found = option_spec(f)
        metavar = found.metavar or ("|".join(found.choices) if found.choices else None)
        name = keyword(f)
        if found.argument:
            parameters.append(inspect.Parameter(
                name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Annotated[
                    str, typer.Argument(metavar=metavar, help=found.help_text)]))
            continue
        default = keyword_default(f)
        annotation = list[str] | None if is_list(f) else bool if found.inverted else hints[f.name]
        assert default is not MISSING, f.name
        flags = found.flags or ((f"--{name.replace('_', '-')}",) if annotation is bool else ())
        parameters.append(inspect.Parameter(
            name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[
                annotation, typer.Option(*flags, metavar=metavar,
                                         help=found.help_text)]))
        for extra in cli_only:
            if extra.after == f.name:
                parameters.append(inspect.Parameter(
                    extra.name, inspect.Parameter.KEYWORD_ONLY, default=False,
                    annotation=Annotated[bool, typer.Option(extra.flag, help=extra.help)]))
    return parameters


def with_signature(run: Callable[..., None], parameters: list[inspect.Parameter]
                   ) -> Callable[..., None]:
    """``run`` with ``parameters`` as its signature, which typer reads."""
    setattr(run, "__signature__",  # noqa: B010 -- not an attribute a Callable declares
            inspect.Signature(parameters, return_annotation=None))
    return run


def build(**values: str | bool | float | int | Path | list[str] | None) -> None:
    """Export, simplify, convert precision, build the engine, verify and package a model.

    \b
    Examples (on any machine, offline):
      trtpack build minilm --target cpu
      trtpack build minilm --precision int8 --calibration lines.txt --target cpu
      trtpack build minilm --serve text --set triton.instance_count=2 --target cpu
      trtpack build silero_vad.onnx --input sr=16000 --target cpu
    With an NVIDIA GPU and TensorRT:
      trtpack build bert-large --random-weights --profile 1x128:16x128:128x128 \\
        --target g5
    """
    from trtpack.api import build as build_model

    request = request_from_keywords(values)
    as_json, bench = bool(values["as_json"]), bool(values["bench"])
    view = ProgressView(err, enabled=not as_json)
    new_cache = request.use_cache and request.cache_dir is not None \
        and not Path(request.cache_dir).exists()  # a typo there rebuilds every stage
    try:
        built = build_model(request, view, on_warning=print_warning)
    finally:
        view.stop()
    if as_json:
        report = built.report
        if bench:
            from trtpack.cli.outputs import run_bench

            report = run_bench(built.out_dir, show=False)
        sys.stdout.write(report.to_json() + "\n")
        return
    print_build_summary(built.report, built.out_dir)
    if new_cache and not any(s.cached for s in built.report.stages):  # none from --cache-url
        out.print(f"note: --cache-dir '{request.cache_dir}' did not exist: a new empty cache, "
                  "so every stage ran", markup=False)
    if bench:
        from trtpack.cli.outputs import run_bench

        run_bench(built.out_dir)


commands.command()(handle_errors(with_signature(build, cli_parameters())))
