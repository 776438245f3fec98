"""Runs onnxsim in a child process (a crash in its C++ code must not take the build down).

Usage: python -m trtpack.stages._simplify_worker SRC DST RESULT_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(src: str, dst: str, result_path: str) -> int:
    import onnx
    import onnxsim

    model = onnx.load(src)
    before = len(model.graph.node)
    simplified, ok = onnxsim.simplify(model, check_n=0)
    onnx.save(simplified, dst)
    Path(result_path).write_text(json.dumps(
        {"nodes_before": before, "nodes_after": len(simplified.graph.node), "check": bool(ok)}
    ))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
