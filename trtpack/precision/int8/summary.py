"""What an INT8 conversion reports: its calibration summary, its one-line message, and the
``--min-int8-share`` gate on the model it would ship (``int8.Int8Conversion`` calls them)."""

from __future__ import annotations

from trtpack.errors import AccuracyError
from trtpack.precision.calibration.data import CalibrationData
from trtpack.precision.conversion import format_metric
from trtpack.precision.graph import LowPrecisionCounts
from trtpack.precision.metrics import (
    CalibrationSummary,
    MethodChoice,
    SmoothQuantSummary,
    SplitSummary,
)


def calibration_summary(cal: CalibrationData, method: str,
                        smoothed: SmoothQuantSummary | None,
                        choice: MethodChoice | None = None) -> CalibrationSummary:
    """The calibration data's sources and split sizes, the method (with ``auto``: the one
    chosen, and ``choice``), SmoothQuant's summary."""
    return CalibrationSummary(
        source=cal.source, path=str(cal.path) if cal.path else None,
        samples=cal.samples, batches=len(cal.feeds), search_samples=cal.search_samples,
        holdout_samples=cal.held_out_samples, strata=cal.strata, method=method,
        smoothquant=smoothed, check_samples=cal.check_samples,
        prefix_samples=sum(len(t) for t in cal.prefix_texts), choice=choice)


def check_int8_share(stats: LowPrecisionCounts, min_share: float) -> None:
    """``AccuracyError`` when the searched model keeps under ``min_share`` of its weight
    layers INT8: Conv, MatMul and Gemm counted together (``compute_nodes``), as the CPU
    path counts them (a convolutional model's Conv are its INT8 work)."""
    share = stats["share"]
    if stats["compute_nodes"] and share < min_share:
        raise AccuracyError(
            f"int8: the best configuration that passed keeps only {share:.0%} of "
            f"Conv/MatMul/Gemm nodes INT8 ({stats['low_precision_nodes']}/"
            f"{stats['compute_nodes']}), under --min-int8-share "
            f"{min_share:.0%}: not shipping INT8 (use --precision fp16, "
            "more or better calibration text, or a lower --min-int8-share)")


def int8_message(stats: LowPrecisionCounts, method: str, cal: CalibrationData,
                 worst: float | None, held: SplitSummary | None, fell_back: bool,
                 first_worst: float | None, check_consultations: int, kept: list[str],
                 high_precision: str, threshold: float | None = None,
                 choice: MethodChoice | None = None) -> str:
    """The stage's one line: the share quantized, the calibration (``choice``: how ``auto``
    chose it), the worst samples, the fallback and the layers it kept (``kept``: their
    display names); ``threshold``: the gate, for the digits that show a value's side of
    it."""
    text = {"default text": "trtpack's default text", "synthetic": "SYNTHETIC inputs"}.get(
        cal.source, str(cal.path.name) if cal.path else cal.source)
    message = (f"int8: {stats['matmul_gemm_low_precision']}/{stats['matmul_gemm_nodes']} "
               f"MatMul/Gemm quantized ({stats['matmul_gemm_share']:.0%}, {method} "
               f"calibration on {text}), worst sample {format_metric(worst, threshold)}")
    if choice:
        worsts = ", ".join(f"{m} {format_metric(v, threshold)}"
                           for m, v in choice.search_worst.items())
        message += f"; auto calibration chose {choice.chosen} (search worst {worsts})"
    if held:
        message += (f", held-out worst {format_metric(held.worst, threshold)} "
                    f"(mean {format_metric(held.mean, threshold)})")
        if held.worst_text:
            message += f" on \"{held.worst_text}\""
    if fell_back:
        message += f" (fallback; was {format_metric(first_worst, threshold)})"
    if check_consultations:
        message += f"; check split consulted {check_consultations}x"
    if kept:
        shown = ", ".join(kept[:6])
        more = f" and {len(kept) - 6} more" if len(kept) > 6 else ""
        message += f"; kept in {high_precision}: {shown}{more}"
    return message
