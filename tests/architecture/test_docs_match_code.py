"""ARCHITECTURE.md, docs/builds.md and docs/development.md say what the code is, checked here
rather than kept by hand: every module of the package has its line in ARCHITECTURE.md's module
index, with its purpose (an empty or placeholder line fails, so does a line for a module that
is gone); every test of ``tests/architecture/`` is named where the docs list them; the stages
the docs say run in processes of their own are ``pipeline.stage.STAGES``' isolated ones."""

from __future__ import annotations

import re
from pathlib import Path

import trtpack
from trtpack.pipeline.stage import STAGES

PACKAGE = Path(trtpack.__file__).parent
ROOT = PACKAGE.parent
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
INDEX_HEADING = "## Every module"
PLACEHOLDERS = {"todo", "tbd", "...", "…", "-", "?", "xxx", "purpose", "module", "helpers"}


def package_modules() -> list[str]:
    """Each module of the package, relative to ``trtpack/`` (Triton's Python-backend models
    in ``serving/templates/`` are Triton's, not the package's)."""
    return sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                  if not p.is_relative_to(PACKAGE / "serving" / "templates"))


def module_index(text: str) -> dict[str, str]:
    """ARCHITECTURE.md's module index: ``- `path`: purpose`` lines under its heading."""
    section = text.split(INDEX_HEADING, 1)[1] if INDEX_HEADING in text else ""
    section = section.split("\n## ", 1)[0]
    return {m[1]: m[2].strip() for m in re.finditer(r"^- `([^`]+)`:?(.*)$", section, re.M)}


def index_problems(modules: list[str], index: dict[str, str]) -> list[str]:
    problems = [f"{m}: no line in ARCHITECTURE.md's module index" for m in modules
                if m not in index]
    problems += [f"{m}: listed, but no such module" for m in index if m not in modules]
    for module, purpose in index.items():
        words = re.findall(r"[A-Za-z]+", purpose)
        if purpose.lower().strip(" .") in PLACEHOLDERS or len(words) < 3:
            problems.append(f"{module}: '{purpose}' states no purpose")
    return problems


def test_a_missing_stale_or_empty_module_line_is_found() -> None:
    index = module_index(f"{INDEX_HEADING}\n\n- `a.py`: reads the input files\n"
                         "- `b.py`: TODO\n- `gone.py`: what was once here\n\n## Next\n")
    assert index_problems(["a.py", "b.py", "c.py"], index) == [
        "c.py: no line in ARCHITECTURE.md's module index",
        "gone.py: listed, but no such module", "b.py: 'TODO' states no purpose"]


def test_every_module_has_its_purpose_line_in_architecture_md() -> None:
    index = module_index(ARCHITECTURE.read_text(encoding="utf-8"))
    assert index_problems(package_modules(), index) == []


ARCHITECTURE_TESTS = sorted(p.name for p in (ROOT / "tests" / "architecture").glob("test_*.py"))


def test_the_docs_name_every_architecture_test() -> None:
    for doc in (ARCHITECTURE, ROOT / "docs" / "development.md"):
        text = doc.read_text(encoding="utf-8")
        named = set(re.findall(r"`(test_\w+\.py)`", text))
        assert [t for t in ARCHITECTURE_TESTS if t not in named] == [], doc.name
        assert [t for t in named if t not in ARCHITECTURE_TESTS] == [], doc.name


ISOLATED_MARK = "processes of their own"


def isolated_in(text: str) -> set[str]:
    """The backticked stage names of the sentence that says which stages run in
    ``ISOLATED_MARK``."""
    start = text.index(ISOLATED_MARK)
    sentence = text[text.rfind(".", 0, start) + 1:start]
    return set(re.findall(r"`(\w+)`", sentence))


def test_the_docs_list_the_isolated_stages() -> None:
    isolated = {s.name for s in STAGES if s.isolated}
    for doc in (ARCHITECTURE, ROOT / "docs" / "builds.md"):
        assert isolated_in(doc.read_text(encoding="utf-8")) == isolated, doc.name
