"""What the command line shows: one rich console for output and one for messages, the one
error line, the progress view of a build and the build summary. Only the CLI imports this:
the library reports through return values and callbacks, and never prints."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

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


WIDE = 120
"""From this console width on, tables add the columns a narrow one leaves to report.html and
the lines above them (a stage's details, a recipe's description)."""


def fitted_table(title: str, columns: Sequence[tuple[str, str]]) -> Table:
    """A table whose cells fold rather than cut (no ``…`` in a number or a name): each column
    as (header, kind), kind ``num`` (right-aligned, never wrapped), ``key`` (never wrapped)
    or ``text`` (folded over lines)."""
    table = Table(title=title)
    for header, kind in columns:
        table.add_column(header, justify="right" if kind == "num" else "left",
                         no_wrap=kind in ("num", "key"), overflow="fold")
    return table


def gate_text(r: VerificationRow) -> str:
    """A row's worst metric on one line and its gate on the next: ``pooled_cosine`` /
    ``1.000000 ≥ 0.99`` (a generic output's ``scaled_error`` is shown as the score it gates,
    1 − scaled error)."""
    if r.metric_value is None:
        return ""
    name = "1 - scaled_error" if r.metric == "scaled_error" else r.metric
    value = shown_metric(r.metric_value, r.threshold, digits=6)
    if r.threshold is None:
        return f"{name}\n{value}"
    sign = "≥" if r.metric_value >= r.threshold else "<"
    return f"{name}\n{value} {sign} {r.threshold:g}"


def verification_table(rows: Sequence[VerificationRow], only_failed: bool = False) -> Table:
    """Every case (check, output, profile corner); a failed one's reason is printed in full
    below it (``print_accuracy_failure``)."""
    table = fitted_table("verification" + (" — failed checks" if only_failed else ""),
                         [("check\noutput", "text"), ("corner", "key"),
                          ("max abs\nmax rel", "num"), ("worst metric\nvs gate", "key"),
                          ("result", "key")])
    for r in rows:
        if only_failed and r.passed:
            continue
        table.add_row(f"{escape(r.check)}\n{escape(r.output)}", f"p{r.profile} {r.corner}",
                      f"{r.max_abs_diff:.3g}\n{r.max_rel_diff:.3g}", escape(gate_text(r)),
                      "[green]pass[/]" if r.passed else "[red]FAIL[/]")
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


def summary_table(report: BuildReport, details: bool = True) -> Table:
    """The stages: status, seconds, peak memory; ``details``: each stage's message too (a
    narrow terminal has them in the lines printed as each stage ended)."""
    table = fitted_table(f"trtpack build {report.model} — {report.precision} for "
                         f"{report.target}",
                         [("stage", "key"), ("status", "key"), ("seconds", "num"),
                          ("peak MB", "num"), *([("details", "text")] if details else [])])
    colors = {"ok": "green", "skipped": "yellow", "failed": "red"}
    for s in report.stages:
        status = f"[{colors[s.status]}]{s.status}[/]" + (" (cached)" if s.cached else "")
        peak = "" if s.peak_memory_mb is None else f"{s.peak_memory_mb:,.0f}"
        table.add_row(s.name, status, f"{s.seconds:.1f}", peak,
                      *([escape(s.message)] if details else []))
    return table


def verification_summary(report: BuildReport) -> Table:
    """Worst numbers per check and output across all profile corners, and the gate each
    passed or failed."""
    table = fitted_table("verification (worst over every profile corner)",
                         [("check\noutput", "text"), ("corners", "num"),
                          ("max abs\ndiff", "num"), ("worst metric\nvs gate", "key"),
                          ("result", "key")])
    groups: dict[tuple[str, str], list[VerificationRow]] = {}
    for r in report.verification:
        groups.setdefault((r.check, r.output), []).append(r)
    for (check, output), rows in groups.items():
        scored = [r for r in rows if r.metric_value is not None]
        worst = min(scored, key=lambda r: r.metric_value or 0.0) if scored else None
        passed = all(r.passed for r in rows)
        table.add_row(f"{escape(check)}\n{escape(output)}", str(len(rows)),
                      f"{max(r.max_abs_diff for r in rows):.3g}",
                      escape(gate_text(worst)) if worst is not None else "",
                      "[green]pass[/]" if passed else "[red]FAIL[/]")
    return table


def worst_samples(report: BuildReport) -> list[str]:
    """One line per check and output judged per sample: worst / mean and the worst text."""
    lines = []
    # (row, its worst value, its mean) of the rows whose metric values are set
    groups: dict[tuple[str, str], list[tuple[VerificationRow, float, float]]] = {}
    for r in report.verification:
        if r.metric_value is not None and r.metric_mean is not None:
            groups.setdefault((r.check, r.output), []).append((r, r.metric_value, r.metric_mean))
    for (check, output), rows in groups.items():
        worst, worst_value, _ = min(rows, key=lambda row: row[1])
        total = sum(r.samples or 1 for r, _, _ in rows)
        mean = sum(row_mean * (r.samples or 1) for r, _, row_mean in rows) / total
        text = f' worst sample: "{worst.worst_text}"' if worst.worst_text else ""
        lines.append(f"{check} {output}: {total} samples over {len(rows)} corners, worst "
                     f"{shown_metric(worst_value, worst.threshold)}, mean "
                     f"{shown_metric(mean, worst.threshold)}.{text}")
    return lines


def print_build_summary(report: BuildReport, out_dir: Path) -> None:
    """What ``trtpack build`` prints when it succeeds: stages, verification, where it is."""
    out.print(summary_table(report, details=out.width >= WIDE))
    out.print(verification_summary(report))
    for line in worst_samples(report):
        out.print(line, markup=False)
    check = report.stage(COMPILE_CHECK_STAGE)
    if check is not None and check.status == "ok":
        for line in record_lines(check.metrics):
            out.print(f"compile check: {line}", markup=False)
    out.print(f"[bold green]done[/] in {report.total_seconds:.1f}s → {out_dir}/"
              f"model_repository/  (report: {out_dir}/report.json, report.html)")


HUB_NOTE = ("* from the Hugging Face hub (once, then its cache); --random-weights builds it "
            "offline")


def weights_origin(recipe: Recipe) -> str:
    """Where a recipe's weights come from, and so whether it builds offline, in two short
    lines; ``HUB_NOTE`` explains the ``*`` of a model from the hub."""
    from trtpack.sources.resolve import cached_snapshot

    source = recipe.source
    if source.random_weights:
        return "offline:\nrandom"
    if source.package:
        return "offline:\nPyPI package"
    if source.factory:
        return "offline:\nfactory"
    if source.path or source.onnx:
        return "offline:\nlocal files"
    if source.hf_id and cached_snapshot(source.hf_id) is not None:
        return "offline:\nHF cache"
    return "HF hub *"


def recipes_table(recipes: Sequence[Recipe], descriptions: bool = True) -> Table:
    """The recipes: name, task and precision, profiles, weights; ``descriptions`` too on a
    wide terminal (``recipes show NAME`` has it)."""
    table = fitted_table("recipes", [("name", "key"), ("task\nprecision", "key"),
                                     ("profiles", "key"), ("weights", "key"),
                                     *([("description", "text")] if descriptions else [])])
    table.pad_edge = False
    for r in recipes:
        table.add_row(r.name, f"{r.task}\n{r.precision}", "\n".join(r.profiles),
                      escape(weights_origin(r)),
                      *([escape(r.description)] if descriptions else []))
    return table
