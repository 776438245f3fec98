"""No module of the package over 400 lines: one that grows past that splits by concept
(ARCHITECTURE.md, "Where a new thing goes")."""

from __future__ import annotations

from pathlib import Path

import trtpack

PACKAGE = Path(trtpack.__file__).parent
MAX_LINES = 400


def long_modules(root: Path, limit: int = MAX_LINES) -> dict[str, int]:
    """Each module under ``root`` over ``limit`` lines, with its line count."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > limit:
            found[str(path.relative_to(root))] = lines
    return found


def test_a_long_module_is_found(tmp_path: Path) -> None:
    (tmp_path / "short.py").write_text("x = 1\n" * 3)
    (tmp_path / "long.py").write_text("x = 1\n" * 5)
    assert long_modules(tmp_path, limit=4) == {"long.py": 5}


def test_no_module_is_over_400_lines() -> None:
    assert long_modules(PACKAGE) == {}
