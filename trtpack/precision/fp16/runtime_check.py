"""Whether ONNX Runtime runs an FP16 candidate: its error, or that it crashed (run in a
forked copy of the worker, so a segmentation fault in a kernel is an answer, not the
worker's end), and which node to keep in FP32 when a crash names none.

numpy, onnx and onnxruntime are imported inside the functions."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import onnx


CRASHED = "ONNX Runtime crashed"
"""How ``run_problem`` begins when ONNX Runtime ended its process (it names no node)."""
CHECK_TIMEOUT_S = 600.0


def run_problem(model: Path | onnx.ModelProto, feed: dict[str, np.ndarray]) -> str | None:
    """Why ONNX Runtime cannot run ``model`` (a path or a ModelProto) on ``feed``: its error
    message, ``CRASHED`` and the signal when it ends its process (a segmentation fault in a
    kernel: run in a forked copy, so the converter goes on), or None when it runs and its
    outputs are finite."""
    import tempfile

    from trtpack.processes import run_forked

    with tempfile.TemporaryDirectory(prefix="trtpack-fp16-check-") as tmp:
        written, log = Path(tmp) / "problem.txt", Path(tmp) / "log.txt"
        code = run_forked(_problem_to_file, (model, feed, written), CHECK_TIMEOUT_S, log)
        if code is None:
            return f"ONNX Runtime ran past {CHECK_TIMEOUT_S:.0f} s"
        if code < 0:
            return f"{CRASHED} (signal {-code})"
        if code != 0 or not written.is_file():
            lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
            return lines[-1].strip() if lines else f"the check ended with exit {code}"
        return written.read_text() or None


def _problem_to_file(model: Path | onnx.ModelProto, feed: dict[str, np.ndarray],
                     written: Path) -> int:
    written.write_text(_run_problem(model, feed) or "")
    return 0


def _run_problem(model: Path | onnx.ModelProto, feed: dict[str, np.ndarray]) -> str | None:
    import numpy as np

    from trtpack.runtimes.onnxruntime import cpu_session

    try:
        session = cpu_session(model, few_runs=True)
        inputs = {i.name for i in session.get_inputs()}
        outputs = session.run(None, {k: v for k, v in feed.items() if k in inputs})
    except Exception as e:  # ONNX Runtime's own errors (kernels, shapes, buffers)
        return " ".join(str(e).split()) or type(e).__name__
    if not all(np.isfinite(np.asarray(o, dtype=np.float64)).all() for o in outputs
               if np.issubdtype(np.asarray(o).dtype, np.floating)):
        return "non-finite outputs"
    return None


RECURRENT_OPS = ("GRU", "LSTM", "RNN", "Scan", "Loop")


def crash_suspect(graph: onnx.GraphProto, done: set[str]) -> str | None:
    """The next node to keep in FP32 when ONNX Runtime crashed without naming one: a
    recurrent node first, then a node reading what a node kept in FP32 makes (its FP16
    neighbour), then the first node not kept, in graph order."""
    nodes = [n for n in graph.node if n.name not in done]
    kept_outputs = {v for n in graph.node if n.name in done for v in n.output}
    for candidates in ([n for n in nodes if n.op_type in RECURRENT_OPS],
                       [n for n in nodes if kept_outputs & set(n.input)], nodes):
        if candidates:
            return str(candidates[0].name)
    return None
