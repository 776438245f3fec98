"""``trtpack cache info|verify|prune|constraints``: the stage cache that builds share (on a
laptop, or a CI volume kept between runs). Thin wrappers over
``trtpack.pipeline.cache.StageCache`` (and ``pipeline.keys`` for the constraints)."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from trtpack.cli.console import out, print_warning
from trtpack.cli.exits import handle_errors
from trtpack.errors import UserInputError
from trtpack.machine.paths import default_cache_dir
from trtpack.pipeline.cache import StageCache
from trtpack.pipeline.cache_budget import BUDGET_VARIABLE, DEFAULT_BUDGET

commands = typer.Typer(help="The stage cache: show, check or empty it.",
                        no_args_is_help=True)

CacheDir = Annotated[Path | None, typer.Option(
    "--cache-dir", metavar="DIR",
    help="The stage cache (default ~/.cache/trtpack, or $TRTPACK_CACHE_DIR).")]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``3600s``, ``2w`` -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text)
    if m is None:
        raise UserInputError(f"--older-than must be a number and a unit (s, m, h, d, w), "
                             f"like 30d or 12h, not '{text}'")
    return float(m.group(1)) * _UNITS[m.group(2)]


def cache_root(cache_dir: Path | None) -> Path:
    """The cache folder to read: ``--cache-dir`` must be one that exists (a typo is not an
    empty cache); the default may not exist yet (no build has run)."""
    root = cache_dir or default_cache_dir()
    if root.exists() and not root.is_dir():
        raise UserInputError(f"--cache-dir '{root}' is a file, not a stage cache folder")
    if cache_dir is not None and not root.exists():
        raise UserInputError(f"--cache-dir '{root}' does not exist",
                             hint="a build creates it: trtpack build ... --cache-dir DIR")
    return root


def _size(n: float) -> str:
    return f"{n / 2**20:,.1f} MB"


@commands.command("info")
@handle_errors
def info(cache_dir: CacheDir = None) -> None:
    """What the stage cache holds: entries and size per stage."""
    root = cache_root(cache_dir)
    entries = StageCache(root).entries()
    table = Table(title=f"stage cache {escape(str(root))}")
    for col in ("stage", "entries", "size", "last used"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    for stage in sorted({e.stage for e in entries}):
        mine = [e for e in entries if e.stage == stage]
        newest = max(e.modified for e in mine)
        table.add_row(stage, str(len(mine)), _size(sum(e.bytes for e in mine)),
                      time.strftime("%Y-%m-%d %H:%M", time.localtime(newest)))
    out.print(table)
    out.print(f"{len(entries)} entries, {_size(sum(e.bytes for e in entries))}, of which "
              f"{_size(sum(e.own_bytes for e in entries))} held by the cache alone (the rest "
              "is shared with build folders by hard links); the budget of what it alone "
              f"holds: {BUDGET_VARIABLE} (default {DEFAULT_BUDGET})", markup=False)

@commands.command("verify")
@handle_errors
def verify(cache_dir: CacheDir = None) -> None:
    """Check every entry's files (sizes and BLAKE3 recorded when stored); damaged or
    incomplete entries are discarded (their stage runs again in the next build)."""
    cache = StageCache(cache_root(cache_dir))
    count = len(cache.entries())
    problems = cache.verify()
    for p in problems:
        print_warning(f"cache entry {p}; discarded")
    out.print(f"{count - len(problems)} of {count} entries intact, {len(problems)} "
              "discarded", markup=False)

@commands.command("prune")
@handle_errors
def prune(
    cache_dir: CacheDir = None,
    older_than: Annotated[str | None, typer.Option(
        "--older-than", metavar="AGE",
        help="Only entries no build used for longer than AGE (30d, 12h, 90m). Default: "
        "every entry, after asking (or with --yes).")] = None,
    yes: Annotated[bool, typer.Option(
        "--yes", "-y", help="Remove every entry without asking (without --older-than).")
    ] = False,
) -> None:
    """Remove cache entries (and what interrupted builds left in the cache)."""
    age = parse_age(older_than) if older_than is not None else None
    root = cache_root(cache_dir)
    cache = StageCache(root)
    if age is None and not yes:
        entries = cache.entries()
        if not entries:
            pass  # nothing to lose: prune what interrupted builds left
        elif sys.stdin.isatty():
            asked = f"remove all {len(entries)} entries ({_size(sum(e.bytes for e in entries))})" \
                    f" of {root}?"
            if not typer.confirm(asked, default=False, err=True):
                out.print("nothing removed", markup=False)
                return
        else:
            raise UserInputError(
                f"cache prune without --older-than removes all {len(entries)} entries of "
                f"{root}: add --yes to confirm",
                hint="or keep recent entries: trtpack cache prune --older-than 30d")
    removed = cache.prune(age)
    out.print(f"removed {len(removed)} entries, {_size(sum(e.bytes for e in removed))}",
              markup=False)


@commands.command("constraints")
@handle_errors
def constraints() -> None:
    """Print, as a pip constraints file, the version of every package a stage's cache key
    holds (the packages each stage's code imports, and what they require).

    \b
    Machines sharing a cache (--cache-url) share an entry only when its key
    matches: install every runner of a fleet with the same constraints,
    written once on a reference machine:
      trtpack cache constraints > fleet-constraints.txt
      pip install -c fleet-constraints.txt 'trtpack[all]'
    """
    from trtpack.pipeline.keys import constraints as pinned
    from trtpack.pipeline.stage import STAGES

    sys.stdout.write(pinned([s.module for s in STAGES]))
