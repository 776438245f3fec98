"""Every table trtpack prints reads at 80 columns (issue 46): no line over 80 characters, no
``…`` cutting a number or a name, no cell over two lines — ``recipes list``, ``targets``, a
build's stage summary and verification tables, ``bench`` (with and without PyTorch),
``inspect`` (build, repository, ONNX file), ``cache info`` and ``doctor``.

The commands' own functions render into an 80-column console that draws a line between
rows (``show_lines``), so each cell's height can be read from the text; ``bench`` runs as a
user runs it (a subprocess with ``COLUMNS=80``)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from rich.table import Table

from tests.conftest import trtpack

WIDTH = 80


class RowLines(Console):
    """An 80-column console that records, drawing every table with a line between rows."""

    def print(self, *objects: Any, **kwargs: Any) -> None:  # type: ignore[override]
        for o in objects:
            if isinstance(o, Table):
                o.show_lines = True
        super().print(*objects, **kwargs)


def table_problems(text: str) -> list[str]:
    """Lines over ``WIDTH``, ``…`` in a table, and cells over two lines (a row's lines
    between the rules of a table drawn with ``show_lines``)."""
    problems = [f"{len(line)} columns: {line!r}" for line in text.splitlines()
                if len(line) > WIDTH]
    row: list[str] = []
    for line in text.splitlines():
        boxed = line.startswith(("│", "┃"))
        if boxed and "…" in line:
            problems.append(f"cut: {line!r}")
        if boxed:
            row.append(line)
            continue
        if len(row) > 2:
            problems.append("a cell over 2 lines:\n" + "\n".join(row))
        row = []
    return problems


@pytest.fixture
def console(monkeypatch: pytest.MonkeyPatch) -> RowLines:
    import trtpack.cli.cache
    import trtpack.cli.console
    import trtpack.cli.recipes
    import trtpack.cli.views

    recording = RowLines(width=WIDTH, record=True, file=io.StringIO(), highlight=False,
                         color_system=None)
    for module in (trtpack.cli.console, trtpack.cli.views, trtpack.cli.cache,
                   trtpack.cli.recipes):
        monkeypatch.setattr(module, "out", recording)
    return recording


def test_commands_tables_fit_80_columns(console: RowLines, tiny_build: Path,
                                        cache_dir: Path) -> None:
    from trtpack.cli.cache import info
    from trtpack.cli.console import print_build_summary, verification_table
    from trtpack.cli.diagnostics import doctor, targets
    from trtpack.cli.recipes import recipes_list
    from trtpack.cli.views import print_inspection
    from trtpack.diagnostics.inspection import inspect_path
    from trtpack.report import BuildReport

    report = BuildReport.load(tiny_build / "report.json")
    shown: dict[str, str] = {}

    def render(name: str, *calls: Any) -> None:
        for call in calls:
            call()
        shown[name] = console.export_text()  # clears the record

    render("recipes list", recipes_list)
    render("targets", targets)
    render("doctor", lambda: doctor(as_json=False))
    render("cache info", lambda: info(cache_dir))
    render("build summary", lambda: print_build_summary(report, tiny_build))
    render("failed checks", lambda: console.print(verification_table(report.verification)))
    onnx = next((tiny_build / "artifacts").glob("*/model.onnx"))
    for path in (tiny_build, tiny_build / "model_repository", onnx):
        render(f"inspect {path.name}", lambda p=path: print_inspection(inspect_path(p)))
    assert "verification" in shown["build summary"] and "corners" in shown["build summary"]
    assert "tiny-bert" in shown["recipes list"] and "g5" in shown["targets"]
    problems = {name: table_problems(text) for name, text in shown.items()}
    assert not any(problems.values()), json.dumps(problems, indent=1, ensure_ascii=False)


def test_the_checker_finds_what_it_looks_for(console: RowLines) -> None:
    cut = Table(title="cut")
    cut.add_column("name", no_wrap=True)
    cut.add_row("a-name-" * 20)
    console.print(cut)
    assert any(p.startswith("cut:") for p in table_problems(console.export_text()))
    tall = Table(title="tall")
    tall.add_column("name")
    tall.add_column("words")
    tall.add_row("minilm", "word " * 60)
    console.print(tall)
    assert any(p.startswith("a cell over 2 lines") for p in table_problems(
        console.export_text()))
    console.print("x" * 100, soft_wrap=True)
    assert any("100 columns" in p for p in table_problems(console.export_text()))


@pytest.mark.parametrize("pytorch", ["--pytorch", "--no-pytorch"])
def test_bench_fits_80_columns(tiny_build: Path, tmp_path: Path, pytorch: str) -> None:
    done = trtpack("bench", str(tiny_build), pytorch, "--seconds", "0.05",
                   env={"COLUMNS": str(WIDTH)})
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "p0 min" in text and "served" in text
    table = text[text.index("benchmark:"):text.index("└")]
    assert not [line for line in table.splitlines() if len(line) > WIDTH or "…" in line], table
    if pytorch == "--no-pytorch":
        assert "vs eager" not in table and "skipped" not in table
        assert "PyTorch eager: skipped at every corner: not asked for" in text
    else:
        assert "vs eager" in table
