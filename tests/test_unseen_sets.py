"""The benchmark's unseen text sets (benchmarks/unseen/): disjoint from each other and from
every calibration text the benchmark builds with, never read by a build option, and
unchanged since their sha256 was published in benchmarks/README.md."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import trtpack

REPO = Path(__file__).resolve().parents[1]
UNSEEN = REPO / "benchmarks" / "unseen"
PACKAGE = Path(trtpack.__file__).resolve().parent


def normalized(line: str) -> str:
    """A line as the comparisons see it: lower case, punctuation as spaces, single spaces
    ("Thanks, anyway!" and "thanks anyway" are the same line)."""
    return " ".join(re.sub(r"[^\w\s]", " ", line.lower()).split())


def _lines(path: Path) -> set[str]:
    return {normalized(s) for s in path.read_text(encoding="utf-8").splitlines() if s.strip()}


def _unseen_files() -> list[Path]:
    files = sorted(UNSEEN.glob("*.txt"))
    assert len(files) >= 3
    return files


def test_unseen_sets_match_their_published_sha256() -> None:
    readme = (REPO / "benchmarks" / "README.md").read_text(encoding="utf-8")
    for path in _unseen_files():
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        row = re.search(rf"`unseen/{re.escape(path.name)}`.*`([0-9a-f]{{64}})`", readme)
        assert row is not None, f"{path.name} is not listed in benchmarks/README.md"
        assert row.group(1) == digest, f"{path.name} changed after it was published"


def test_lines_compare_without_case_and_punctuation() -> None:
    assert normalized("Thank you very much!") == normalized("thank you  very much")
    assert normalized("Can't wait!") == normalized("can t wait")
    assert normalized("Thank you very much!") != normalized("Thank you so much!")


def test_unseen_sets_are_disjoint_and_hold_short_lines() -> None:
    sets = [_lines(p) for p in _unseen_files()]
    for i, a in enumerate(sets):
        assert len(a) >= 30
        assert any(len(s.split()) <= 2 for s in a)
        for b in sets[i + 1:]:
            assert not a & b


def test_every_published_set_is_measured() -> None:
    """The sets the README publishes are on disk, the latest fresh one (issue 36's second,
    committed before that round's method changes) among them."""
    names = {p.name for p in _unseen_files()}
    assert {"chat.txt", "news_tech.txt", "reviews_long.txt", "fresh_everyday.txt",
            "fresh_late.txt"} <= names


def test_no_calibration_text_holds_an_unseen_line() -> None:
    unseen = set().union(*(_lines(p) for p in _unseen_files()))
    calibration = [*sorted((REPO / "benchmarks" / "calibration").glob("*.txt")),
                   *sorted(PACKAGE.rglob("*.txt"))]
    assert calibration
    for path in calibration:
        assert not unseen & _lines(path), path


def test_the_latest_fresh_set_shares_no_line_with_the_repository_texts() -> None:
    """fresh_late.txt against data/calibration/ too (everyday-50 calibrates the slow INT8 test;
    the older sets predate this check: everyday-50 holds "Sounds good to me!" of
    fresh_everyday, heldout.txt "Yes." of chat)."""
    fresh = _lines(UNSEEN / "fresh_late.txt")
    for path in sorted((REPO / "data" / "calibration").glob("*.txt")):
        assert not fresh & _lines(path), path


def test_the_package_never_names_the_unseen_folder() -> None:
    """No build option can read the sets: no module or package file of trtpack names them."""
    for path in PACKAGE.rglob("*"):
        if path.is_file() and path.suffix in (".py", ".yaml", ".txt", ".json"):
            text = path.read_text(encoding="utf-8", errors="replace")
            assert "benchmarks/unseen" not in text and "unseen/" not in text, path
