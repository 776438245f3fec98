"""The commands over what ``trtpack build`` wrote: ``bench`` (and ``build --bench``),
``report``, ``package``, ``engine`` and ``merge``: thin typer wrappers over
``trtpack.bench``, ``trtpack.report_page``, ``trtpack.pipeline.engine_from_build`` and
``trtpack.serving``; ``trtpack.cli.views`` shows the results."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from trtpack.cli.console import ProgressView, err, out, print_build_summary, print_warning
from trtpack.cli.exits import handle_errors
from trtpack.errors import UserInputError
from trtpack.report import BuildReport
from trtpack.serving.package_formats import FORMATS, format_help

commands = typer.Typer()


def run_bench(out_dir: Path, seconds: float | None = None, threads: int | None = None,
              pytorch: bool = True, runtimes: bool = True, served_url: str | None = None,
              concurrency: list[int] | None = None, compare_batching: bool = False,
              corners: list[str] | None = None, show: bool = True) -> BuildReport:
    """Bench a build with a live status line; ``show``: print the results. The build's
    report, with the benchmark in it. ``seconds``: per row (None: 2, or
    ``$TRTPACK_BENCH_SECONDS``)."""
    from trtpack.bench.benchmark import benchmark_build
    from trtpack.cli.views import print_benchmark

    status = err.status("bench …")
    if show:
        status.start()
    try:
        measured = benchmark_build(
            out_dir, seconds=seconds, threads=threads, pytorch=pytorch, runtimes=runtimes,
            served_url=served_url, concurrency=concurrency, compare_batching=compare_batching,
            corners=corners,
            progress=lambda message: status.update(f"[bold]bench[/] {escape(message)}"))
    finally:
        status.stop()
    if show:
        print_benchmark(measured, out_dir)
    return measured.report


@commands.command("package")
@handle_errors
def package(
    path: Annotated[Path, typer.Argument(help="A trtpack build folder or a Triton model "
                                               "repository.")],
    package_format: Annotated[str | None, typer.Option(
        "--format", metavar="FORMAT", help="What to write: " + format_help())] = None,
    sagemaker: Annotated[bool, typer.Option(
        "--sagemaker", help="The same as --format sagemaker.")] = False,
    dest: Annotated[Path | None, typer.Option(
        "--dest", metavar="DIR",
        help="Where to write the archives (default PATH/<format>).")] = None,
) -> None:
    """Package a built model repository for a serving platform."""
    from trtpack.cli.views import print_sagemaker_package
    from trtpack.serving.package_formats import package as write_package

    package_format = package_format.strip().lower() if package_format else None  # as build's
    if sagemaker and package_format not in (None, "sagemaker"):
        raise UserInputError(f"--sagemaker and --format {package_format} disagree")
    name = package_format or ("sagemaker" if sagemaker else None)
    if name is None:
        raise UserInputError("choose a format to package for: --format "
                             + ", ".join(f.name for f in FORMATS))
    print_sagemaker_package(write_package(name, path, dest))

@commands.command("merge")
@handle_errors
def merge(
    build_dirs: Annotated[list[Path] | None, typer.Argument(
        metavar="BUILD_DIR...",
        help="Output folders of 'trtpack build' for different GPU targets (e.g. the GPU CI "
        "matrix's artifacts), same model, ONNX, precision and profiles.")] = None,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", metavar="DIR",
        help="The merged folder (new or empty): model_repository/ and merge.json."
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
    from trtpack.cli.views import print_merge
    from trtpack.serving.merge import merge_builds

    if out_dir is None:
        raise UserInputError("merge needs --out DIR")
    result = merge_builds(build_dirs or [], out_dir, fallback_cpu=fallback_cpu)
    for w in result.warnings:
        print_warning(w)
    print_merge(result, as_json)

@commands.command("engine")
@handle_errors
def engine(
    build_dir: Annotated[Path, typer.Argument(
        metavar="BUILD_DIR",
        help="The --out of 'trtpack build ... --no-engine' for a GPU target: its ONNX is "
        "built into an engine, verified against the references that build recorded.")],
    target: Annotated[str, typer.Option(
        "--target", help="The GPU family to build the engine for (trtpack targets), e.g. g5.")],
    out_dir: Annotated[Path, typer.Option(
        "--out", help="The new build folder: BUILD_DIR's stages copied, the engine and its "
        "model repository added.")],
    cache_dir: Annotated[Path | None, typer.Option(
        "--cache-dir", help="Stage and TensorRT timing cache (default ~/.cache/trtpack).")] = None,
    no_cache: Annotated[bool, typer.Option(
        "--no-cache", help="Build the engine again even if the cache has it.")] = False,
) -> None:
    """Convert once, build engines per GPU family: the TensorRT engine for --target from a
    finished --no-engine build, whose export, simplification, verification and precision
    are reused as they are, so every family's engine comes from one ONNX (what 'trtpack
    merge' requires).

    Example: trtpack build minilm --target g5 --no-engine --out out/minilm-onnx
             trtpack engine out/minilm-onnx --target g4dn --out out/minilm-g4dn
    """
    from trtpack.pipeline.engine_from_build import build_engine_from

    view = ProgressView(err, enabled=True)
    try:
        report = build_engine_from(build_dir, target, out_dir, cache_dir=cache_dir,
                                   use_cache=not no_cache, progress=view)
    finally:
        view.stop()
    print_build_summary(report, out_dir)


@commands.command("bench")
@handle_errors
def bench_command(
    path: Annotated[Path, typer.Argument(
        help="A trtpack build folder (--out of trtpack build).")],
    seconds: Annotated[float | None, typer.Option(
        help="Time budget per row in seconds, after warm-up (for --served: per measurement "
        "window). [default: 2, or $TRTPACK_BENCH_SECONDS]", show_default=False)] = None,
    threads: Annotated[int | None, typer.Option(
        help="CPU threads for ONNX Runtime and PyTorch (default: all cores).")] = None,
    pytorch: Annotated[bool, typer.Option(
        "--pytorch/--no-pytorch", help="Time PyTorch eager as the baseline.")] = True,
    runtimes: Annotated[bool, typer.Option(
        "--runtimes/--no-runtimes", help="Time the models in their runtimes here (with "
        "--served: --no-runtimes measures the server only).")] = True,
    served: Annotated[str | None, typer.Option(
        "--served", metavar="URL", help="Also measure a running Triton serving this build's "
        "repository with perf_analyzer (its HTTP address, e.g. localhost:8000).")] = None,
    concurrency: Annotated[str, typer.Option(
        help="Concurrency sweep for --served, comma-separated.")] = "1,2,4",
    compare_batching: Annotated[bool, typer.Option(
        "--compare-batching", help="With --served: measure again with a config variant "
        "without dynamic batching (needs tritonserver --model-control-mode=explicit).")
    ] = False,
    corners: Annotated[str, typer.Option(
        help="Profile corners for --served, comma-separated.")] = "min,opt,max",
) -> None:
    """Measure a build: latency and throughput at every profile corner of the served model,
    the FP32 ONNX and PyTorch eager; with --served, throughput through Triton.

    \b
    Examples:
      trtpack bench build/minilm
      trtpack bench build/minilm --served localhost:8000 --compare-batching
    """
    try:
        levels = [int(c) for c in concurrency.split(",") if c.strip()]
    except ValueError:
        levels = []
    if not levels or any(c < 1 for c in levels):
        raise UserInputError(f"--concurrency must be positive integers like 1,2,4, not "
                             f"'{concurrency}'")
    run_bench(path, seconds, threads, pytorch, runtimes, served, levels, compare_batching,
              [c.strip() for c in corners.split(",") if c.strip()])

@commands.command("report")
@handle_errors
def report_command(
    path: Annotated[Path, typer.Argument(help="A trtpack build folder.")],
) -> None:
    """Write (again) PATH/report.html from PATH/report.json: one self-contained page."""
    from trtpack.pipeline.build_folder import load_build_report
    from trtpack.report_page.html import write_report_html

    report = load_build_report(path)
    out.print(str(write_report_html(path, report)), markup=False)
