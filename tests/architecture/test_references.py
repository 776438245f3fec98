"""Docstrings, comments and docs name only modules and tests that exist: every
``trtpack/…py``, ``tests/…py`` or ``benchmarks/…py`` path, and every dotted ``trtpack.x``
name written in backticks (``trtpack.precision.int8.search``, ``trtpack.engine.builder.x``),
resolves to a file (and, for ``module.name``, to a name that module mentions). A rename that
leaves a reference behind fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PATH = re.compile(r"(?<![\w/.~-])((?:trtpack|tests|benchmarks)/[\w/]+\.py)\b")
DOTTED = re.compile(r"`+(trtpack(?:\.\w+)+)")

# names written on purpose although gone, with why
GONE_ON_PURPOSE = {
    "trtpack.gpu": "tests/test_ci_files.py: what the NGC image's check once imported",
}
# the architecture tests' own examples of made-up modules
EXAMPLES = ROOT / "tests" / "architecture"


def text_files() -> list[Path]:
    found = [*ROOT.glob("*.md"), ROOT / "pyproject.toml", ROOT / "Makefile",
             *ROOT.glob("mk/*.mk"), *ROOT.glob("docs/**/*.md")]
    for folder in ("trtpack", "tests", "benchmarks"):
        found += [p for p in (ROOT / folder).rglob("*.py") if not p.is_relative_to(EXAMPLES)]
    return sorted(p for p in found if p.is_file())


def module_file(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def dotted_name_exists(name: str) -> bool:
    """``trtpack.a.b`` is a module, or ``trtpack.a`` a module that mentions ``b`` (``trtpack.b``:
    the package itself, whose ``__init__`` exposes ``build`` and the like)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        source = module_file(parts[:end])
        if source is not None:
            if end == len(parts):
                return True
            return re.search(rf"\b{re.escape(parts[end])}\b",
                             source.read_text(encoding="utf-8")) is not None
    return False


def stale_references(path: Path, text: str) -> list[str]:
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = [f"{where}: {p}" for p in PATH.findall(text) if not (ROOT / p).is_file()]
    found += [f"{where}: {n}" for n in DOTTED.findall(text)
              if n not in GONE_ON_PURPOSE and not dotted_name_exists(n)]
    return found


def test_a_stale_reference_is_found() -> None:
    text = ("see ``trtpack.precision.int8.search`` and trtpack/precision/int8/conversion.py, not\n"
            "``trtpack.engine.no_such_module``, tests/test_engine_tensorrt_names.py or\n"
            "``trtpack.precision.int8.search.no_such_function``")
    assert stale_references(Path("x.py"), text) == [
        "x.py: tests/test_engine_tensorrt_names.py", "x.py: trtpack.engine.no_such_module",
        "x.py: trtpack.precision.int8.search.no_such_function"]


def test_every_named_module_and_test_exists() -> None:
    found = []
    for path in text_files():
        found += stale_references(path, path.read_text(encoding="utf-8"))
    assert found == []
