"""Functions in ``trtpack/serving/`` stay short enough to read: none over 80 lines, and the
repository writer (the one entry point every build goes through) at most 60."""

from __future__ import annotations

import ast
from pathlib import Path

SERVING = Path(__file__).resolve().parents[2] / "trtpack" / "serving"
LIMIT = 80
LIMITS = {"write_model_repository": 60}


def _lengths() -> dict[str, int]:
    found = {}
    for path in sorted(SERVING.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                found[f"{path.relative_to(SERVING)}:{node.name}"] = \
                    node.end_lineno - node.lineno + 1
    return found


def test_no_serving_function_is_too_long() -> None:
    lengths = _lengths()
    assert any(k.endswith(":write_model_repository") for k in lengths)
    too_long = {k: n for k, n in lengths.items()
                if n > LIMITS.get(k.rsplit(":", 1)[1], LIMIT)}
    assert not too_long, f"functions over their line limit: {too_long}"
