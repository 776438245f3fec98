"""Stage results and the build report, saved as ``OUT/report.json`` (JSON round-trip)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias

from trtpack.onnx_tools.files import sha256_file

REPORT = "report.json"  # every build folder's report, beside model_repository/

JsonValue: TypeAlias = (str | int | float | bool | Sequence["JsonValue"]
                        | Mapping[str, "JsonValue"] | None)
"""A value JSON (and YAML's safe subset) holds: report.json's records, stage fingerprints."""

JsonObject: TypeAlias = dict[str, JsonValue]
"""A JSON object as trtpack builds one (a report record, a fingerprint)."""

StageStatus = Literal["ok", "failed", "skipped"]


def int8_weight_layers(metrics: Mapping[str, Any]) -> str | None:
    """A CPU model stage's ``"on integer kernels/all"`` count of its weight layers (Conv,
    MatMul, Gemm with a constant weight), from this report's key or an older report's
    ``int8_weight_matmuls`` (which held the same count under a MatMul-only name)."""
    value = metrics.get("int8_weight_layers", metrics.get("int8_weight_matmuls"))
    return value if isinstance(value, str) else None


def shown_metric(value: float, threshold: float | None = None, digits: int = 4) -> str:
    """``value`` with ``digits`` decimals, or with as many more (up to 12) as it takes to show
    on which side of ``threshold`` it lies: 0.99999987 against 0.9999999 is not "1.0000"."""
    text = f"{value:.{digits}f}"
    if threshold is None or value != value:  # NaN
        return text
    below = value < threshold
    for more in range(digits, 13):
        text = f"{value:.{more}f}"
        if (float(text) < threshold) == below:
            return text
    return repr(value)


@dataclass
class Artifact:
    name: str
    path: str
    size: int
    sha256: str

    @classmethod
    def of(cls, name: str, path: Path, root: Path | None = None) -> Artifact:
        shown = path.relative_to(root) if root is not None and path.is_relative_to(root) else path
        return cls(name, str(shown), path.stat().st_size, sha256_file(path))


@dataclass
class VerificationRow:
    """One output compared at one shape: the numbers and whether the gate passed."""

    check: str  # e.g. "onnx-vs-torch", "fp16-vs-fp32"
    profile: int
    corner: str  # min / opt / max
    shapes: str
    output: str
    max_abs_diff: float
    max_rel_diff: float
    metric: str  # cosine / pooled_cosine / top1 / none
    metric_value: float | None
    passed: bool
    reason: str = ""
    # per-sample gates: metric_value is the worst sample's value, metric_mean the mean over
    # the case's samples, worst_sample its index in the case and worst_text its text (trimmed)
    metric_mean: float | None = None
    samples: int | None = None
    worst_sample: int | None = None
    worst_text: str | None = None
    threshold: float | None = None  # the gate's lowest passing metric value (None: not gated)

    def metric_text(self) -> str:
        """``cosine 0.99999987 < 0.9999999`` for a failed gate (the threshold beside it and
        the digits that show the failure), ``cosine 0.9998`` for a passed one."""
        if self.metric_value is None:
            return ""
        shown = shown_metric(self.metric_value, self.threshold, digits=6)
        if self.threshold is not None and self.metric_value < self.threshold:
            return f"{self.metric} {shown} < {self.threshold}"
        return f"{self.metric} {shown}"


@dataclass
class StageResult:
    name: str
    status: StageStatus
    seconds: float = 0.0
    peak_memory_mb: float | None = None
    cached: bool = False
    # a stage reused from the cache: the seconds it took when it ran (``seconds`` is the reuse)
    ran_seconds: float | None = None
    message: str = ""
    artifacts: list[Artifact] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    log_path: str | None = None


@dataclass
class BuildReport:
    model: str
    precision: str
    target: str
    profiles: list[str]
    out_dir: str
    status: Literal["ok", "failed", "accuracy_failed"] = "ok"
    stages: list[StageResult] = field(default_factory=list)
    verification: list[VerificationRow] = field(default_factory=list)
    versions: dict[str, str | None] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    total_seconds: float = 0.0
    peak_memory_mb: float | None = None
    error: str | None = None
    benchmark: dict[str, Any] | None = None  # trtpack bench: latency rows, served throughput

    def stage(self, name: str) -> StageResult | None:
        return next((s for s in self.stages if s.name == name), None)

    def name_served_precision(self) -> None:
        """``precision`` (the report's title) becomes what the CPU model stage serves: under
        ``--precision auto`` the candidate it chose (its metrics' ``auto.winner``), not the
        one the precision stages built; for ``--target cpu``, ``fp32`` where it declined a
        convolutional model's INT8 candidate (``int8_fp32_reason``)."""
        stage = self.stage("cpu_model")
        auto = stage.metrics.get("auto") if stage is not None else None
        if isinstance(auto, dict) and isinstance(auto.get("winner"), str):
            self.precision = auto["winner"]
        elif stage is not None and self.target == "cpu" \
                and stage.metrics.get("int8_fp32_reason"):
            self.precision = "fp32"  # the INT8 candidate was declined: FP32 is served

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=str)

    def save(self, path: Path) -> None:
        path.write_text(self.to_json() + "\n", encoding="utf-8")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BuildReport:
        data = dict(data)
        stages = [
            StageResult(**{**s, "artifacts": [Artifact(**a) for a in s.get("artifacts", [])]})
            for s in data.pop("stages", [])
        ]
        rows = [VerificationRow(**r) for r in data.pop("verification", [])]
        return cls(**data, stages=stages, verification=rows)

    @classmethod
    def load(cls, path: Path) -> BuildReport:
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))
