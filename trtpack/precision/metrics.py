"""The precision stage's results, typed. ``as_dict`` gives the report's ``metrics`` (the same
keys as report.json has always had: the report page, bench and the tests read them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import cast

from trtpack.precision.graph import LowPrecisionCounts
from trtpack.report import JsonObject, JsonValue, VerificationRow


@dataclass
class AttemptSummary:
    """How one converted model fared: its worst per-sample metric at the profile corners
    (and, INT8, on the search split), the largest elementwise difference."""

    worst_metric: float | None
    search_worst_metric: float | None
    max_abs_diff: float | None
    failed_checks: int
    search_passed: bool
    passed: bool


@dataclass
class SplitSummary:
    """Worst and mean per-sample metric of a calibration split, and the worst sample's
    text."""

    samples: int
    worst: float | None
    mean: float
    worst_text: str | None
    passed: bool
    failed_batches: int

    @classmethod
    def of(cls, rows: Sequence[VerificationRow]) -> SplitSummary | None:
        scored = [r for r in rows if r.metric_value is not None]
        if not scored:
            return None
        worst = min(scored, key=lambda r: r.metric_value or 0.0)
        total = sum(r.samples or 1 for r in scored)
        mean = sum((r.metric_mean if r.metric_mean is not None else r.metric_value or 0.0)
                   * (r.samples or 1) for r in scored) / total
        return cls(total, worst.metric_value, round(mean, 6), worst.worst_text,
                   all(r.passed for r in rows), sum(not r.passed for r in rows))


@dataclass
class SmoothQuantSummary:
    alpha: float
    activations: int  # activations smoothed


@dataclass
class MethodChoice:
    """``--calibration-method auto``: the method chosen (``max`` or ``mse``) and each
    method's first model's worst sample on the search split (what chose it; higher is
    better, a tie keeps ``max``)."""

    chosen: str
    search_worst: dict[str, float | None]


@dataclass
class CalibrationSummary:
    source: str
    path: str | None
    samples: int
    batches: int
    search_samples: int
    holdout_samples: int  # report.json's key (the held-out split's samples)
    strata: dict[str, dict[str, int]]
    method: str
    smoothquant: SmoothQuantSummary | None  # when smoothed
    check_samples: int = 0
    prefix_samples: int = 0  # short prefixes of calibration lines the search decided on
    choice: MethodChoice | None = None  # --calibration-method auto: how ``method`` was chosen


@dataclass
class SensitivityRow:
    """The damage when only this node group is INT8, and whether the search kept it."""

    layers: list[str]
    nodes: list[str]
    damage: float
    worst: float | None
    kept_quantized: bool


@dataclass
class SearchRound:
    round: int
    margin: float
    quantized_groups: int
    excluded_nodes: int
    summary: AttemptSummary
    check_passed: bool | None = None  # the check split, consulted (None: not consulted)

    def as_dict(self) -> JsonObject:
        found = {k: v for k, v in asdict(self).items() if k != "summary"}
        return {**found, **asdict(self.summary)}


@dataclass
class FallbackSummary:
    """What the fallback did: ``mode`` and ``rounds`` always, the rest when it searched."""

    mode: str
    rounds: int
    evaluations: int | None = None
    seconds: float | None = None
    node_groups: int | None = None
    sensitivity: list[SensitivityRow] = field(default_factory=list)
    history: list[SearchRound] = field(default_factory=list)
    # times the check split was consulted (the held-out split never is: it certifies)
    check_consultations: int = 0
    decision_samples: int = 0  # samples the search decided on (calibration, search, prefixes)

    def as_dict(self) -> JsonObject:
        if self.evaluations is None:
            return {"mode": self.mode, "rounds": self.rounds,
                    "check_consultations": self.check_consultations}
        return {"mode": self.mode, "rounds": self.rounds, "evaluations": self.evaluations,
                "check_consultations": self.check_consultations,
                "decision_samples": self.decision_samples,
                "seconds": self.seconds, "node_groups": self.node_groups,
                "sensitivity": [asdict(r) for r in self.sensitivity],
                "history": [r.as_dict() for r in self.history]}


@dataclass
class PrecisionMetrics:
    """What both conversions report."""

    excluded_nodes: list[str]
    excluded_by_fallback: list[str]
    excluded_node_hints: dict[str, str]
    low_precision: LowPrecisionCounts
    before: AttemptSummary
    after: AttemptSummary
    fallback: FallbackSummary
    conversions: int = 0
    conversion_seconds: float = 0.0


@dataclass
class Fp16Metrics(PrecisionMetrics):
    keep_io_types: bool = True
    kept_fp32_out_of_range: list[str] = field(default_factory=list)
    converter: str = "ModelOpt AutoCast"  # or onnxconverter-common's, when AutoCast failed
    autocast_failure: str | None = None  # why AutoCast could not convert the graph
    kept_fp32_reasons: dict[str, str] = field(default_factory=dict)  # node -> why FP32

    def as_dict(self) -> JsonObject:
        return {"precision": "fp16", "keep_io_types": self.keep_io_types,
                "converter": self.converter, "autocast_failure": self.autocast_failure,
                "kept_fp32_reasons": self.kept_fp32_reasons,
                "excluded_nodes": self.excluded_nodes,
                "excluded_by_fallback": self.excluded_by_fallback,
                "excluded_node_hints": self.excluded_node_hints,
                "kept_fp32_out_of_range": self.kept_fp32_out_of_range,
                **_shared(self)}


@dataclass
class Int8Metrics(PrecisionMetrics):
    calibration: CalibrationSummary | None = None
    splits: dict[str, SplitSummary | None] = field(default_factory=dict)
    quantize_op_types: list[str] | str = "modelopt default"
    high_precision: str = "fp32"
    kept_layers: list[str] = field(default_factory=list)  # module path (op type) of each
    # who made the Q/DQ: "trtpack" (precision.int8.qdq) or "ModelOpt"
    quantizer: str = "trtpack"

    def as_dict(self) -> JsonObject:
        return {"precision": "int8", "quantizer": self.quantizer,
                "calibration": asdict(self.calibration) if self.calibration else None,
                "splits": {k: asdict(v) if v else {} for k, v in self.splits.items()},
                "quantize_op_types": self.quantize_op_types,
                "high_precision": self.high_precision,
                "excluded_nodes": self.excluded_nodes,
                "excluded_by_fallback": self.excluded_by_fallback,
                "excluded_node_hints": self.excluded_node_hints,
                "kept_layers": self.kept_layers,
                **_shared(self)}


def _shared(m: PrecisionMetrics) -> JsonObject:
    # LowPrecisionCounts: a TypedDict of JSON values, which mypy does not read as a Mapping
    low_precision = cast(JsonValue, m.low_precision)
    return {"low_precision": low_precision, "before": asdict(m.before),
            "after": asdict(m.after), "fallback": m.fallback.as_dict(),
            "conversions": m.conversions, "conversion_seconds": m.conversion_seconds}
