"""The ``trtpack`` command line: thin typer wrappers over the library; the only code that
prints. Errors the user can fix are one line and an exit code; ``--debug`` shows tracebacks."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trtpack import __version__
from trtpack.errors import AccuracyError, ExitCode, TrtpackError
from trtpack.report import REPORT, BuildReport

app = typer.Typer(
    name="trtpack",
    help="Compile PyTorch / Hugging Face models into verified, ready-to-serve Triton models.\n\n"
    "Example: trtpack build bert-large --profile 1x128:16x128:128x128 --target g5",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    rich_markup_mode="rich",
)
recipes_app = typer.Typer(help="List and show the built-in recipes.", no_args_is_help=True)
app.add_typer(recipes_app, name="recipes")

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)
STATE: dict[str, bool] = {"debug": False}

F = TypeVar("F", bound=Callable[..., Any])


def _fail(e: TrtpackError) -> None:
    # escape: messages quote paths, extras ('trtpack[modelopt]') and tensor shapes in brackets
    err.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
    if e.hint:
        err.print(f"[dim]hint:[/] {escape(e.hint)}", soft_wrap=True)
    report = getattr(e, "report", None)
    if report is not None:
        err.print(f"[dim]report and logs:[/] {escape(str(report.out_dir))}", soft_wrap=True)


def handle_errors(func: F) -> F:
    """Turn the library's errors into a one-line message and their exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except AccuracyError as e:
            if e.rows:
                err.print(verification_table(e.rows, only_failed=True))
                for r in e.rows:  # the reasons in full, whatever the terminal's width
                    if not r.passed:
                        err.print(f"FAIL {r.check} {r.corner} {r.output}: {r.reason}",
                                  markup=False)
            _fail(e)
            if STATE["debug"]:
                raise
            raise typer.Exit(e.exit_code) from None
        except TrtpackError as e:
            _fail(e)
            if STATE["debug"]:
                raise
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            err.print("[bold red]interrupted[/]: nothing was written to the output folder")
            raise typer.Exit(ExitCode.INTERRUPTED) from None

    return wrapper  # type: ignore[return-value]


def _version(value: bool) -> None:
    if value:
        out.print(f"trtpack {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    STATE["debug"] = debug


def verification_table(rows: list[Any], only_failed: bool = False) -> Table:
    table = Table(title="verification" + (" — failed checks" if only_failed else ""))
    for col in ("check", "profile", "corner", "output", "max abs diff", "max rel diff",
                "metric", "result"):
        table.add_column(col, justify="right" if "diff" in col else "left")
    for r in rows:
        if only_failed and r.passed:
            continue
        value = "" if r.metric_value is None else f"{r.metric} {r.metric_value:.6f}"
        result = "[green]pass[/]" if r.passed else f"[red]FAIL[/] {r.reason}"
        table.add_row(r.check, str(r.profile), r.corner, r.output, f"{r.max_abs_diff:.3g}",
                      f"{r.max_rel_diff:.3g}", value, result)
    return table


def summary_table(report: Any) -> Table:
    table = Table(title=f"trtpack build {report.model} — {report.precision} for {report.target}")
    for col in ("stage", "status", "seconds", "peak MB", "details"):
        table.add_column(col, justify="right" if col in ("seconds", "peak MB") else "left")
    colors = {"ok": "green", "skipped": "yellow", "failed": "red"}
    for s in report.stages:
        status = f"[{colors[s.status]}]{s.status}[/]" + (" (cached)" if s.cached else "")
        peak = "" if s.peak_memory_mb is None else f"{s.peak_memory_mb:,.0f}"
        table.add_row(s.name, status, f"{s.seconds:.1f}", peak, s.message)
    return table


class ProgressView:
    """Renders pipeline progress events as a live rich status per stage."""

    def __init__(self, console: Console, enabled: bool) -> None:
        self.console = console
        self.enabled = enabled
        self.status: Any = None

    def __call__(self, event: Any) -> None:
        if not self.enabled:
            return
        if event.kind == "start":
            self.status = self.console.status(f"[bold]{event.stage}[/] …")
            self.status.start()
        elif event.kind == "update" and self.status is not None:
            self.status.update(f"[bold]{event.stage}[/] {escape(event.message)}")
        elif event.kind == "end":
            if self.status is not None:
                self.status.stop()
                self.status = None
            result = event.result
            if result is None:
                return
            mark = {"ok": "[green]✓[/]", "skipped": "[yellow]–[/]", "failed": "[red]✗[/]"}
            cached = " [dim](cached)[/]" if result.cached else ""
            self.console.print(f"{mark[result.status]} {event.stage:<10} "
                               f"{result.seconds:6.1f}s  {escape(result.message)}{cached}")
            for w in result.warnings:
                self.console.print(f"  [bold yellow]warning:[/] {escape(w)}", soft_wrap=True)

    def stop(self) -> None:
        if self.status is not None:
            self.status.stop()


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
        help="fp32, fp16 (ModelOpt AutoCast) or int8 (ModelOpt Q/DQ). Default: the recipe's."
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
        "compute capability and TensorRT version, read and updated; sha256 before/after in "
        "the report. Default: under --cache-dir.")] = None,
    calibration_method: Annotated[str | None, typer.Option(
        help="INT8 activation ranges: max, entropy or percentile (99.99th). Default: the "
        "recipe's (precision_options.int8.calibration_method).")] = None,
    bench: Annotated[bool, typer.Option(
        "--bench", help="After packaging, measure latency per profile corner against PyTorch "
        "(trtpack bench).")] = False,
) -> None:
    """Export, simplify, convert precision, build the engine, verify and package a model.

    Examples:

      trtpack build minilm --target cpu

      trtpack build bert-large --random-weights --profile 1x128:16x128:128x128 --target g5

      trtpack build minilm --precision int8 --calibration sentences.txt --target cpu

      trtpack build minilm --serve text --set triton.instance_count=2 --target cpu
    """
    from trtpack.api import BuildRequest, resolve_options
    from trtpack.errors import UserInputError
    from trtpack.pipeline import build as run_pipeline

    if fallback not in ("auto", "off"):
        raise UserInputError(f"--fallback must be auto or off, not '{fallback}'")
    if serve not in (None, "tensor", "text"):
        raise UserInputError(f"--serve must be tensor or text, not '{serve}'")
    request = BuildRequest(
        model=model, profiles=profile or [], precision=precision, target=target, opset=opset,
        random_weights=random_weights, out=out_dir, build_engine=not no_engine,
        calibration=calibration, fallback=fallback,  # type: ignore[arg-type]
        serve=serve,  # type: ignore[arg-type]
        fallback_cpu=fallback_cpu, cache_dir=cache_dir, use_cache=not no_cache,
        portable=portable, overrides=overrides or [], timing_cache=timing_cache,
        task=task, calibration_method=calibration_method,
    )
    options, warnings = resolve_options(request)
    for w in warnings:
        err.print(f"[bold yellow]warning:[/] {escape(w)}", soft_wrap=True)
    view = ProgressView(err, enabled=not as_json)
    try:
        report = run_pipeline(options, view)
    finally:
        view.stop()
    if warnings:
        report.warnings[:0] = warnings
        report.save(options.out_dir / REPORT)
    if as_json:
        if bench:
            from trtpack.cli_bench import run_bench
            run_bench(options.out_dir, show=False)
            report = BuildReport.load(options.out_dir / REPORT)
        sys.stdout.write(report.to_json() + "\n")
        return
    out.print(summary_table(report))
    out.print(verification_summary(report))
    for line in worst_samples(report):
        out.print(line, markup=False)
    out.print(f"[bold green]done[/] in {report.total_seconds:.1f}s → {options.out_dir}/"
              f"model_repository/  (report: {options.out_dir}/report.json, report.html)")
    if bench:
        from trtpack.cli_bench import run_bench

        run_bench(options.out_dir)


def verification_summary(report: Any) -> Table:
    """Worst numbers per check and output across all shapes."""
    table = Table(title="verification (worst over every profile corner)")
    for col in ("check", "output", "cases", "max abs diff", "metric", "result"):
        table.add_column(col)
    groups: dict[tuple[str, str], list[Any]] = {}
    for r in report.verification:
        groups.setdefault((r.check, r.output), []).append(r)
    for (check, output), rows in groups.items():
        values = [r.metric_value for r in rows if r.metric_value is not None]
        metric = f"{rows[0].metric} {min(values):.6f}" if values else ""
        passed = all(r.passed for r in rows)
        table.add_row(check, output, str(len(rows)),
                      f"{max(r.max_abs_diff for r in rows):.3g}", metric,
                      "[green]pass[/]" if passed else "[red]FAIL[/]")
    return table


def worst_samples(report: Any) -> list[str]:
    """One line per check and output judged per sample: worst / mean and the worst text."""
    lines = []
    groups: dict[tuple[str, str], list[Any]] = {}
    for r in report.verification:
        if r.metric_value is not None and r.metric_mean is not None:
            groups.setdefault((r.check, r.output), []).append(r)
    for (check, output), rows in groups.items():
        worst = min(rows, key=lambda r: r.metric_value)
        total = sum(r.samples or 1 for r in rows)
        mean = sum(r.metric_mean * (r.samples or 1) for r in rows) / total
        text = f' worst sample: "{worst.worst_text}"' if worst.worst_text else ""
        lines.append(f"{check} {output}: {total} samples, worst {worst.metric_value:.4f}, "
                     f"mean {mean:.4f}.{text}")
    return lines


@recipes_app.command("list")
@handle_errors
def recipes_list() -> None:
    """List the built-in recipes."""
    from trtpack.recipe_files import builtin_recipe_names
    from trtpack.resolve import resolve_model

    table = Table(title="recipes")
    for col in ("name", "task", "precision", "profiles", "description"):
        table.add_column(col)
    for name in builtin_recipe_names():
        r = resolve_model(name)
        table.add_row(r.name, r.task, r.precision, " ".join(r.profiles), r.description)
    out.print(table)


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
    from trtpack.doctor import environment_report

    report = environment_report()
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
        return
    table = Table(title="trtpack doctor")
    for col in ("component", "found", "needed for"):
        table.add_column(col)
    for item in report["components"]:
        found = f"[green]{item['version']}[/]" if item["version"] else "[red]missing[/]"
        table.add_row(item["name"], found, item["purpose"])
    out.print(table)
    for line in report["summary"]:
        out.print(f"• {line}", markup=False)


@app.command()
@handle_errors
def targets() -> None:
    """List the deployment targets: instance families, their GPUs and compute capability.

    The 'here' column marks the targets whose engines this machine's GPU can build."""
    from trtpack.gpu import detect_gpu, targets_table

    table = Table(title="targets (--target)")
    for col in ("target", "GPU", "sm", "architecture", "also", "here", "engines"):
        table.add_column(col)
    problems = []
    for r in targets_table(detect_gpu()):
        gpu = r.gpu if r.name == "cpu" else f"{r.gpu} {r.memory_gb} GB"
        engines = "—" if r.name == "cpu" else "yes" if r.engine_problem is None else "no *"
        if r.engine_problem is not None:
            problems.append(r.engine_problem)
        table.add_row(r.name, gpu, r.compute_capability, r.architecture, ", ".join(r.aliases),
                      "[green]✓[/]" if r.local else "", engines)
    out.print(table)
    out.print("--target also takes an instance type (g5.xlarge), or 'auto' (this machine's "
              "GPU when it has TensorRT, else cpu). 'here': engines this machine can build.",
              markup=False)
    for problem in problems:
        out.print(f"* {problem}", markup=False)


def _io_rows(table: Table, inputs: list[Any], outputs: list[Any]) -> None:
    for kind, tensors in (("input", inputs), ("output", outputs)):
        for t in tensors:
            table.add_row(kind, t.name, t.dtype, "x".join(str(d) for d in t.shape))


def inspection_view(result: Any) -> None:
    """Print what ``trtpack.inspection.inspect_path`` found."""
    for model in result.models:
        out.print(f"[bold]{model.name}[/] ({model.platform}, max_batch_size "
                  f"{model.max_batch_size}, {model.instance_kind}, profiles "
                  f"{','.join(model.profiles) or '-'})  {model.path}")
        if model.gpu_families:
            out.print("  serves GPU families (cc_model_filenames):")
            for fam in model.gpu_families:
                where = ", ".join(fam.targets) + (f" ({', '.join(fam.gpus)})" if fam.gpus else "")
                out.print(f"    compute capability {fam.compute_capability}: {fam.filename}"
                          f"  {escape(where) or 'no listed instance family'}"
                          + ("" if fam.present else "  [red]file missing[/]"))
        for problem in model.problems:
            out.print(f"  [red]config does not match the engine:[/] {problem}")
    for engine in result.all_engines():
        prov = engine.provenance
        out.print(f"[bold]engine[/] {engine.path}")
        if prov is not None:
            out.print(f"  built for {prov.target}: {prov.gpu_name} (sm {prov.compute_capability})"
                      f", TensorRT {prov.tensorrt_version}, CUDA {prov.cuda_runtime_version}, "
                      f"{prov.precision}, {len(prov.profiles)} profile(s), {prov.built_at}")
            out.print(f"  plan sha256 {prov.plan_sha256[:16]}…, onnx sha256 "
                      f"{prov.onnx_sha256[:16]}…, options {prov.build_options}")
        if engine.io is not None:
            table = Table(show_header=True, box=None, pad_edge=False)
            for col in ("", "tensor", "dtype", "shape"):
                table.add_column(col)
            _io_rows(table, list(engine.io.inputs), list(engine.io.outputs))
            out.print(table)
        mark = {True: "[green]yes[/]", False: "[red]no[/]", None: "[yellow]unknown[/]"}
        out.print(f"  runs on this machine: {mark[engine.runs_here]}"
                  + "".join(f"\n    - {r}" for r in engine.reasons))


@app.command()
@handle_errors
def inspect(
    path: Annotated[Path, typer.Argument(help="A model.plan, a Triton model repository (or one "
                                               "model of it), or a trtpack build folder.")],
    check: Annotated[bool, typer.Option(
        "--check", help="Exit 3 unless every engine found can run on this machine.")] = False,
) -> None:
    """Show an engine's provenance and I/O, and whether it can run on this machine."""
    from trtpack.errors import MissingEnvironmentError
    from trtpack.inspection import inspect_path

    result = inspect_path(path)
    inspection_view(result)
    if check and result.runs_here is not True:
        reasons = [r for e in result.all_engines() for r in e.reasons] or ["no engine found"]
        raise MissingEnvironmentError("cannot run here: " + "; ".join(reasons))


@app.command()
@handle_errors
def package(
    path: Annotated[Path, typer.Argument(help="A trtpack build folder or a Triton model "
                                               "repository.")],
    sagemaker: Annotated[bool, typer.Option(
        "--sagemaker", help="One <model>.tar.gz per served model for SageMaker multi-model "
        "endpoints (an ensemble packed with its members), and SAGEMAKER.md.")] = False,
    dest: Annotated[Path | None, typer.Option(
        "--dest", help="Where to write the archives (default PATH/sagemaker).")] = None,
) -> None:
    """Package a built model repository for a serving platform."""
    from trtpack.errors import UserInputError
    from trtpack.serving.sagemaker import package_sagemaker

    if not sagemaker:
        raise UserInputError("choose a format to package for: --sagemaker")
    result = package_sagemaker(path, dest)
    for archive in result.archives:
        out.print(f"{archive.path}  [dim]loads {archive.entry}: {', '.join(archive.members)}[/]",
                  soft_wrap=True)
    out.print(f"container environment: {result.note}", soft_wrap=True)


@app.command()
@handle_errors
def merge(
    build_dirs: Annotated[list[Path] | None, typer.Argument(
        metavar="BUILD_DIR...",
        help="Output folders of 'trtpack build' for different GPU targets (e.g. the GPU CI "
        "matrix's artifacts), same model, ONNX, precision and profiles.")] = None,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", help="The merged folder (new or empty): model_repository/ and merge.json."
    )] = None,
    fallback_cpu: Annotated[bool, typer.Option(
        "--fallback-cpu", help="Also serve the FP32 ONNX on ONNX Runtime with CPU instances "
        "(<name>_cpu), unless the builds already have it.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """One Triton model for several GPU families: one engine per compute capability in one
    version folder (model.sm75.plan, model.sm86.plan, ...), chosen by Triton through
    cc_model_filenames.

    Example: trtpack merge out/minilm-g4dn out/minilm-g5 out/minilm-p4d --out out/minilm-fleet
    """
    from trtpack.errors import UserInputError
    from trtpack.serving.merge import merge_builds

    if out_dir is None:
        raise UserInputError("merge needs --out DIR")
    result = merge_builds(build_dirs or [], out_dir, fallback_cpu=fallback_cpu)
    for w in result.warnings:
        err.print(f"[bold yellow]warning:[/] {escape(w)}", soft_wrap=True)
    if as_json:
        sys.stdout.write(json.dumps({"out_dir": str(result.out_dir), "model": result.name,
                                     "engines": result.engines, "targets": result.targets,
                                     "models": result.models}, indent=2) + "\n")
        return
    for cc, file in result.engines.items():
        out.print(f"compute capability {cc} ({escape(result.targets[cc])}): {file}")
    out.print(f"[bold green]merged[/] → {escape(str(result.repository))}/{escape(result.name)}"
              f"  (models: {escape(', '.join(result.models))})", soft_wrap=True)


def _register_commands() -> None:
    from trtpack.cli_bench import register

    register(app, handle_errors)


_register_commands()


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # a killed build cleans up like an interrupted one


def main() -> None:
    import signal

    signal.signal(signal.SIGTERM, _terminate)
    app()


if __name__ == "__main__":
    main()
