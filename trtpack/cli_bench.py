"""The CLI of ``trtpack bench`` and ``trtpack report`` (and ``build --bench``): thin typer
wrappers over ``trtpack.bench``, ``trtpack.bench_served`` and ``trtpack.report_html``, and the
tables that show their results. ``trtpack.cli`` registers the commands on its app."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table


def benchmark_table(rows: list[dict[str, Any]]) -> Table:
    """Runtime rows per corner, with the speed-up against PyTorch eager."""
    table = Table(title="benchmark: latency per request (ms) at every profile corner")
    for col in ("corner", "runtime", "p50", "p99", "samples/s", "vs PyTorch"):
        table.add_column(col, justify="left" if col in ("runtime", "corner") else "right")
    previous = None
    for r in rows:
        corner = f"p{r['profile']} {r['corner']} {r['shapes'].split(',')[0].split('=', 1)[-1]}"
        shown, previous = ("" if corner == previous else corner), corner
        if r["status"] != "ok":
            table.add_row(shown, r["engine"], "", "", "",
                          f"[yellow]{r['status']}[/]: {escape(r['reason'])}")
            continue
        speed = "" if r["speedup_vs_pytorch"] is None else f"{r['speedup_vs_pytorch']:.2f}x"
        if r["runtime"] == "served" and speed:
            speed = f"[bold]{speed}[/]"
        table.add_row(shown, r["engine"], f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}",
                      f"{r['throughput']:,.1f}", speed)
    return table


def served_table(served: dict[str, Any]) -> Table:
    table = Table(title=f"served through Triton at {served['url']} (perf_analyzer)")
    for col in ("model", "backend", "batching", "corner", "batch", "concurrency", "infer/s",
                "p50 ms", "p99 ms"):
        table.add_column(col, justify="right" if col in ("batch", "concurrency", "infer/s",
                                                         "p50 ms", "p99 ms") else "left")
    for r in served["rows"]:
        table.add_row(r["model"], r["backend"], r["batching"], str(r["corner"]), str(r["batch"]),
                      str(r["concurrency"]), f"{r['throughput']:,.1f}", f"{r['p50_ms']:.2f}",
                      f"{r['p99_ms']:.2f}")
    return table


def run_bench(out_dir: Path, seconds: float = 2.0, threads: int | None = None,
               pytorch: bool = True, runtimes: bool = True, served_url: str | None = None,
               concurrency: list[int] | None = None, compare_batching: bool = False,
               corners: list[str] | None = None, show: bool = True) -> None:
    from trtpack.bench import run_benchmark, save_benchmark
    from trtpack.build_folder import open_build
    from trtpack.cli import err, out
    from trtpack.report_html import write_report_html

    result = served = None
    status = err.status("bench …")
    if show:
        status.start()
    try:
        def progress(message: str) -> None:
            status.update(f"[bold]bench[/] {escape(message)}")

        if seconds <= 0:  # checked here too: before any server is contacted
            from trtpack.errors import UserInputError

            raise UserInputError(f"--seconds must be positive, not {seconds}")
        build = open_build(out_dir)
        if served_url is not None:
            from trtpack.bench_served import DEFAULT_CONCURRENCY, served_benchmark

            served = served_benchmark(build, served_url,
                                      concurrency=concurrency or DEFAULT_CONCURRENCY,
                                      seconds=seconds, compare_batching=compare_batching,
                                      corners=corners or ("min", "opt", "max"),
                                      progress=progress)
        if runtimes:
            result = run_benchmark(out_dir, seconds=seconds, threads=threads, pytorch=pytorch,
                                   progress=progress)
    finally:
        status.stop()
    report = save_benchmark(out_dir, result, served)
    write_report_html(out_dir, report)
    if not show:
        return
    bench_section = report.benchmark or {}
    if result is not None:
        m = result.machine
        out.print(f"machine: {m['cpu']}, {m['logical_cores']} cores, "
                  f"{'GPU ' + m['gpu'] if m['gpu'] else 'no GPU'}; {result.threads} threads, "
                  f"{result.seconds_per_row:g} s per row; load average {m['load_average']}",
                  markup=False)
        out.print(benchmark_table(bench_section["rows"]))
        for note in result.notes:
            out.print(f"[bold yellow]note:[/] {escape(note)}")
    if served is not None:
        out.print(served_table(served))
    out.print(f"saved in {out_dir}/report.json (benchmark) and {out_dir}/report.html")


def register(app: typer.Typer, handle_errors: Callable[[Any], Any]) -> None:
    """Add the ``bench`` and ``report`` commands to ``app``."""

    def bench_command(
        path: Annotated[Path, typer.Argument(
            help="A trtpack build folder (--out of trtpack build).")],
        seconds: Annotated[float, typer.Option(
            help="Time budget per row in seconds, after warm-up (for --served: per measurement "
            "window).")] = 2.0,
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

        Examples:

          trtpack bench build/minilm

          trtpack bench build/minilm --served localhost:8000 --compare-batching
        """
        from trtpack.errors import UserInputError

        try:
            levels = [int(c) for c in concurrency.split(",") if c.strip()]
        except ValueError:
            levels = []
        if not levels or any(c < 1 for c in levels):
            raise UserInputError(f"--concurrency must be positive integers like 1,2,4, not "
                                 f"'{concurrency}'")
        if compare_batching and served is None:
            raise UserInputError("--compare-batching needs --served URL")
        if not runtimes and served is None:
            raise UserInputError("--no-runtimes measures nothing without --served URL")
        run_bench(path, seconds, threads, pytorch, runtimes, served, levels, compare_batching,
                   [c.strip() for c in corners.split(",") if c.strip()])


    def report_command(
        path: Annotated[Path, typer.Argument(help="A trtpack build folder.")],
    ) -> None:
        """Write (again) PATH/report.html from PATH/report.json: one self-contained page."""
        from trtpack.build_folder import load_build_report
        from trtpack.cli import out
        from trtpack.report_html import write_report_html

        report = load_build_report(path)
        out.print(str(write_report_html(path, report)), markup=False)

    app.command("bench")(handle_errors(bench_command))
    app.command("report")(handle_errors(report_command))
