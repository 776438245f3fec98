"""The ``trtpack`` command line: typer commands of a few lines each over ``trtpack.api``,
``trtpack.doctor`` and ``trtpack.inspection``; ``trtpack.console`` renders what they return.
Errors the user can fix are one line and an exit code; ``--debug`` shows tracebacks."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from trtpack import __version__
from trtpack.console import (
    ProgressView,
    err,
    out,
    print_accuracy_failure,
    print_build_summary,
    print_error,
    print_interrupted,
    print_traceback,
    print_usage_error,
    print_warning,
    recipes_table,
)
from trtpack.errors import AccuracyError, ExitCode, TrtpackError

app = typer.Typer(
    name="trtpack",
    help="Compile PyTorch / Hugging Face models into verified, ready-to-serve Triton models.\n\n"
    "Example: trtpack build bert-large --profile 1x128:16x128:128x128 --target g5",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    # plain click help: rich's option panels cut option names and values ('--calibration-met…')
    # in 80 columns, and would read brackets in help text as markup
    rich_markup_mode=None,
)
recipes_app = typer.Typer(help="List and show the built-in recipes.", no_args_is_help=True,
                          rich_markup_mode=None)
app.add_typer(recipes_app, name="recipes")

STATE: dict[str, bool] = {"debug": False}

F = TypeVar("F", bound=Callable[..., Any])


def handle_errors(func: F) -> F:
    """Turn the library's errors into a one-line message and their exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except TrtpackError as e:
            if isinstance(e, AccuracyError):
                print_accuracy_failure(e)
            else:
                print_error(e)
            if STATE["debug"]:  # the traceback is extra output, the exit code the same
                print_traceback(e)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            print_interrupted()
            raise typer.Exit(ExitCode.INTERRUPTED) from None

    return wrapper  # type: ignore[return-value]


def show_version(value: bool) -> None:
    if value:
        out.print(f"trtpack {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=show_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    STATE["debug"] = debug


@app.command()
@handle_errors
def build(
    model: Annotated[str, typer.Argument(
        help="A recipe name (trtpack recipes list), a recipe YAML file, an ONNX file, a "
        "local Hugging Face model directory, or an org/name id in the local Hugging Face "
        "cache.")],
    profile: Annotated[list[str] | None, typer.Option(
        "--profile", "-p",
        help="Shape profile MIN:OPT:MAX over the dynamic axes, e.g. 1x128:16x128:128x128 "
        "(batch x sequence), or per input: 'input_ids=1x128:16x128:128x128,...'. Repeat for "
        "several optimization profiles. Default: the recipe's.")] = None,
    precision: Annotated[str | None, typer.Option(
        help="fp32, fp16 (ModelOpt AutoCast), int8 (ModelOpt Q/DQ), or auto (CPU: build fp32 "
        "and int8, time both, keep the fastest that passes). Default: the recipe's."
    )] = None,
    target: Annotated[str, typer.Option(
        help="cpu, an instance family (g4dn, g5, p4d, p5 …; see trtpack targets), or auto "
        "(the local GPU if it has TensorRT, else cpu).")] = "auto",
    opset: Annotated[int | None, typer.Option(help="ONNX opset. Default: the recipe's.")] = None,
    random_weights: Annotated[bool, typer.Option(
        "--random-weights", help="Build from the recipe's architecture config with random "
        "weights (no weight download).")] = False,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", help="Output folder (default build/<name>); replaced only when the build "
        "succeeds.")] = None,
    no_engine: Annotated[bool, typer.Option(
        "--no-engine", help="Stop before the TensorRT engine (everything else is built).")
    ] = False,
    calibration: Annotated[Path | None, typer.Option(
        help="INT8 calibration data: a text file (one sample a line) or a .npz of inputs.")
    ] = None,
    fallback: Annotated[str, typer.Option(
        help="auto: keep sensitive nodes in higher precision until verification passes; off."
    )] = "auto",
    serve: Annotated[str | None, typer.Option(
        help="tensor: clients send tensors; text: add a tokenizer and post-processing "
        "ensemble so clients send text. Default: the recipe's (triton.serve).")] = None,
    fallback_cpu: Annotated[bool | None, typer.Option(
        "--fallback-cpu/--no-fallback-cpu", help="Also emit an ONNX Runtime model with CPU "
        "instances beside a TensorRT model. Default: the recipe's.")] = None,
    portable: Annotated[str | None, typer.Option(
        help="Engine hardware compatibility: ampere+ (runs on any GPU of compute capability "
        "8.0+, a little slower) or same_compute_capability. Default: the recipe's.")] = None,
    overrides: Annotated[list[str] | None, typer.Option(
        "--set", metavar="KEY=VALUE",
        help="Override a recipe setting; repeatable, VALUE is YAML. E.g. "
        "triton.instance_count=2, triton.max_queue_delay_us=500, triton.response_cache=true; "
        "every key: trtpack recipes show NAME.")] = None,
    cache_dir: Annotated[Path | None, typer.Option(
        help="Stage cache folder (default ~/.cache/trtpack, or $TRTPACK_CACHE_DIR).")] = None,
    task: Annotated[str | None, typer.Option(
        help="The head to build for a model directory, hub id or ONNX file (default: from "
        "config.json's architectures): feature-extraction, sentence-embedding, "
        "sequence-classification, token-classification, question-answering, fill-mask, "
        "text-generation (logits only, no KV cache: LLM decoding with a KV cache belongs to "
        "TensorRT-LLM), image-classification, generic.")] = None,
    no_cache: Annotated[bool, typer.Option(
        "--no-cache", help="Rebuild every stage.")] = False,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the report as JSON instead of the summary.")] = False,
    timing_cache: Annotated[Path | None, typer.Option(
        "--timing-cache", metavar="DIR",
        help="A TensorRT timing-cache folder to share (e.g. across a CI matrix): one file per "
        "GPU (model and compute capability) and TensorRT version, read and updated; sha256 "
        "before/after in the report. Default: under --cache-dir.")] = None,
    calibration_method: Annotated[str | None, typer.Option(
        help="INT8 activation ranges: max, entropy or percentile (99.99th). Default: the "
        "recipe's (precision_options.int8.calibration_method).")] = None,
    tokenizer: Annotated[Path | None, typer.Option(
        help="The tokenizer, when it is not beside the model (e.g. an ONNX file from "
        "elsewhere): a folder with tokenizer.json or vocab.txt, or that file. Verification "
        "then draws real token ids, and --serve text works.")] = None,
    min_int8_share: Annotated[float, typer.Option(
        help="INT8: ship only when at least this share of MatMul/Gemm nodes stays INT8 "
        "after the accuracy search (else exit 1 naming the best share that passed).")] = 0.5,
    force: Annotated[bool, typer.Option(
        "--force", help="Build into an --out that holds files trtpack did not write: they are "
        "kept (never deleted), the build's files are written beside them.")] = False,
    bench: Annotated[bool, typer.Option(
        "--bench", help="After packaging, measure latency per profile corner against PyTorch "
        "(trtpack bench).")] = False,
) -> None:
    """Export, simplify, convert precision, build the engine, verify and package a model.

    \b
    Examples:
      trtpack build minilm --target cpu
      trtpack build bert-large --random-weights --profile 1x128:16x128:128x128 \\
        --target g5
      trtpack build minilm --precision int8 --calibration lines.txt --target cpu
      trtpack build minilm --serve text --set triton.instance_count=2 --target cpu
    """
    from trtpack.api import BuildRequest
    from trtpack.api import build as build_model

    request = BuildRequest(
        model=model, profiles=profile or [], precision=precision, target=target, opset=opset,
        random_weights=random_weights, out=out_dir, build_engine=not no_engine,
        calibration=calibration, fallback=fallback, serve=serve, fallback_cpu=fallback_cpu,
        cache_dir=cache_dir, use_cache=not no_cache, portable=portable,
        overrides=overrides or [], timing_cache=timing_cache, task=task,
        calibration_method=calibration_method, tokenizer=tokenizer,
        min_int8_share=min_int8_share,
        force=force,
    )
    view = ProgressView(err, enabled=not as_json)
    try:
        built = build_model(request, view, on_warning=print_warning)
    finally:
        view.stop()
    if as_json:
        report = built.report
        if bench:
            from trtpack.cli_outputs import run_bench

            report = run_bench(built.out_dir, show=False)
        sys.stdout.write(report.to_json() + "\n")
        return
    print_build_summary(built.report, built.out_dir)
    if bench:
        from trtpack.cli_outputs import run_bench

        run_bench(built.out_dir)


@recipes_app.command("list")
@handle_errors
def recipes_list() -> None:
    """List the built-in recipes."""
    from trtpack.recipe_files import builtin_recipe_names
    from trtpack.resolve import resolve_model

    out.print(recipes_table([resolve_model(name) for name in builtin_recipe_names()]))


@recipes_app.command("show")
@handle_errors
def recipes_show(
    name: Annotated[str, typer.Argument(
        help="Recipe name or YAML file, or an ONNX file, model directory or hub id (the "
        "recipe trtpack infers for it: save it, edit it, build it).")],
    task: Annotated[str | None, typer.Option(help="The head, as for build --task.")] = None,
) -> None:
    """Show a recipe with every default filled in (as YAML)."""
    import yaml

    from trtpack.resolve import resolve_model

    recipe = resolve_model(name, task)
    # plain text, never wrapped to the terminal: the output is saved and edited as a file
    sys.stdout.write(yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False))


@app.command()
@handle_errors
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
) -> None:
    """Show what is installed: Python packages, GPU, TensorRT — and what that allows."""
    from trtpack.console_views import print_doctor, print_json
    from trtpack.doctor import environment_report

    report = environment_report()
    if as_json:
        print_json(report)
    else:
        print_doctor(report)


@app.command()
@handle_errors
def targets() -> None:
    """List the deployment targets: instance families, their GPUs and compute capability.

    The 'here' column marks the targets whose engines this machine's GPU can build."""
    from trtpack.console_views import print_targets
    from trtpack.local_targets import targets_table
    from trtpack.machine import detect_gpu

    print_targets(targets_table(detect_gpu()))


@app.command()
@handle_errors
def inspect(
    path: Annotated[Path, typer.Argument(help="A model.plan, a Triton model repository (or one "
                                               "model of it), or a trtpack build folder.")],
    check: Annotated[bool, typer.Option(
        "--check", help="Exit 3 unless every engine found can run on this machine (ONNX "
        "Runtime models: loaded here).")] = False,
) -> None:
    """Show an engine's provenance and I/O, and whether it can run on this machine."""
    from trtpack.console_views import print_inspection
    from trtpack.errors import MissingEnvironmentError
    from trtpack.inspection import inspect_path

    result = inspect_path(path, load_onnx=check)
    print_inspection(result)
    if check and result.runs_here is not True:
        reasons = [r for e in result.all_engines() for r in e.reasons] + \
            [r for m in result.models if m.onnx for r in m.onnx.reasons]
        raise MissingEnvironmentError("cannot run here: " + (
            "; ".join(reasons) or "no engine or ONNX Runtime model found"))


def _register_commands() -> None:
    from trtpack import cli_cache, cli_outputs

    cli_outputs.register(app, handle_errors)
    cli_cache.register(app, handle_errors)


_register_commands()


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # a killed build cleans up like an interrupted one


def main() -> None:
    import os
    import signal

    from typer.exceptions import Abort, TyperException

    signal.signal(signal.SIGTERM, _terminate)
    try:
        # not standalone: typer's usage errors come here to be one line like trtpack's own
        code = app(prog_name="trtpack", standalone_mode=False)
    except TyperException as e:  # a usage error (exit 2), or no arguments (the help)
        ctx = getattr(e, "ctx", None)
        if type(e).__name__ == "NoArgsIsHelpError":  # its message is the help
            sys.stderr.write(e.format_message() + "\n")
        else:
            print_usage_error(e.format_message(), ctx.command_path if ctx else None)
        code = e.exit_code
    except Abort:
        print_interrupted()
        code = ExitCode.INTERRUPTED
    except SystemExit as e:
        code = e.code
    if code == ExitCode.INTERRUPTED:
        # cleaned up and said so: leave without the interpreter's shutdown, where about one
        # interrupted build in 20 ended by SIGINT (-2) instead of 130
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(ExitCode.INTERRUPTED)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
