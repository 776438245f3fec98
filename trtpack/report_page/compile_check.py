"""report.html's compile-check section: what TensorRT-RTX compiled on this machine's CPU, in
the words every view uses (``engine.tensorrt_rtx.record_lines``), kept apart from an engine
built and verified on a GPU (the provenance section's)."""

from __future__ import annotations

import html

from trtpack.engine.tensorrt_rtx import COMPILE_CHECK_STAGE, record_lines
from trtpack.report import BuildReport


def compile_check_section(report: BuildReport) -> str:
    """The section, or nothing when the build ran no compile check."""
    stage = report.stage(COMPILE_CHECK_STAGE)
    if stage is None or stage.status != "ok":
        return ""
    first, *rest = record_lines(stage.metrics)
    items = "".join(f"<li>{html.escape(line)}</li>" for line in rest)
    return (f"<section id='compile-check'><h2>Compile check (not run)</h2>"
            f"<p><b>{html.escape(first)}</b></p><ul>{items}</ul></section>")
