"""``model.plan.json``: where an engine comes from and where it can run.

Written beside every ``model.plan``: the versions of trtpack, TensorRT, CUDA and the
driver, the GPU that built it, the profiles, precision and builder options, the sha256 of
the ONNX and of the plan, and the engine's real I/O (read from the deserialized engine at
build time, so later steps need no TensorRT to know it). ``runs_here`` decides from it
whether an engine can run on a given machine.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypedDict

from trtpack.engine.builder import BuilderOptions
from trtpack.engine.triton_release import (
    TritonServing,
    TritonServingRecord,
    tensorrt_loads,
    triton_serving,
)
from trtpack.json_values import JsonObject, record_from_json
from trtpack.machine.targets import AMPERE, same_device_model
from trtpack.model_io import ModelIO, TensorIO
from trtpack.onnx_tools.files import data_path, sha256_file

PLAN_FILENAME = "model.plan"
"""A TensorRT engine's file name, in a build's engine stage and in the model repository."""
PROVENANCE_SCHEMA = 1

VARIES_BETWEEN_BUILDS = ("plan_sha256", "plan_bytes", "built_at", "build_seconds",
                         "timing_cache", "trtexec", "driver_version", "cuda_driver_version")
"""Fields that may differ between two builds of the same ONNX, profiles, options, GPU
family and TensorRT: TensorRT picks tactics by timing them, so engines are not
bit-reproducible (another plan sha256 and size), and the time, the timing cache's state,
the output paths in the trtexec command and the machine's driver may differ. Every other
field is the same for the same inputs; ``trtpack merge`` compares those."""


class TensorRecord(TypedDict):
    """One engine I/O tensor as recorded (``TensorIO``)."""

    name: str
    dtype: str
    shape: list[int]
    batch: bool


def provenance_path(plan: Path) -> Path:
    """``model.plan`` -> ``model.plan.json``."""
    return plan.with_name(plan.name + ".json")


@dataclass
class EngineProvenance:
    trtpack_version: str
    tensorrt_version: str
    gpu_name: str
    compute_capability: str  # "8.6"
    target: str
    precision: str
    profiles: list[dict[str, dict[str, list[int]]]]  # ShapeProfile.to_dict() per profile
    build_options: BuilderOptions
    onnx_sha256: str
    plan_sha256: str
    plan_bytes: int
    inputs: list[TensorRecord] = field(default_factory=list)
    outputs: list[TensorRecord] = field(default_factory=list)
    cuda_runtime_version: str | None = None
    cuda_driver_version: str | None = None
    driver_version: str | None = None
    onnx_file: str = ""
    onnx_data_sha256: str | None = None
    built_at: str = ""
    build_seconds: float | None = None
    timing_cache: JsonObject = field(default_factory=dict)  # the engine stage's record
    trtexec: str = ""
    # which Triton serves it (at build time; {} in files written before it was recorded)
    triton: TritonServingRecord = field(default_factory=TritonServingRecord)
    schema: int = PROVENANCE_SCHEMA
    varies_between_builds: list[str] = field(default_factory=lambda: list(VARIES_BETWEEN_BUILDS))

    @property
    def hardware_compatibility(self) -> str:
        return str(self.build_options.get("hardware_compatibility", "none"))

    @property
    def version_compatible(self) -> bool:
        return bool(self.build_options.get("version_compatible", False))

    def triton_serving(self) -> TritonServing:
        """Which Triton serves this engine, from trtpack's current table."""
        return triton_serving(self.tensorrt_version, self.version_compatible)

    @property
    def cc(self) -> tuple[int, int]:
        major, _, minor = self.compute_capability.partition(".")
        if not (major.isascii() and major.isdigit() and (minor == "" or (
                minor.isascii() and minor.isdigit()))):
            raise ValueError(f"compute_capability '{self.compute_capability[:20]}' is not "
                             "MAJOR.MINOR")
        return int(major), int(minor or 0)

    def model_io(self) -> ModelIO:
        """The engine's I/O as recorded at build time."""

        def tensor(d: object, where: str) -> TensorIO:  # as read from the file: checked
            if not isinstance(d, dict) or not isinstance(d.get("name"), str) \
                    or not isinstance(d.get("dtype"), str) \
                    or not isinstance(d.get("shape"), list) \
                    or not all(type(n) is int for n in d["shape"]):
                raise ValueError(f"{where} is not {{name, dtype, shape: [int, ...], batch}}")
            return TensorIO(d["name"], d["dtype"], tuple(d["shape"]), bool(d.get("batch")))

        return ModelIO(tuple(tensor(t, f"inputs[{i}]") for i, t in enumerate(self.inputs)),
                       tuple(tensor(t, f"outputs[{i}]") for i, t in enumerate(self.outputs)))

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")

    @classmethod
    def from_dict(cls, data: object) -> EngineProvenance:
        """The provenance in ``data`` (a parsed JSON object); a ``ValueError`` naming the
        field when one is missing or of the wrong JSON type (unknown fields are ignored)."""
        return record_from_json(cls, data, "model.plan.json")

    @classmethod
    def load(cls, path: Path) -> EngineProvenance:
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))


def io_records(io: ModelIO) -> tuple[list[TensorRecord], list[TensorRecord]]:
    def record(t: TensorIO) -> TensorRecord:
        return {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "batch": t.batch_dynamic}

    return [record(t) for t in io.inputs], [record(t) for t in io.outputs]


def onnx_hashes(onnx: Path) -> tuple[str, str | None]:
    """sha256 of an ONNX file and of its external data file (``model.onnx.data``), if any."""
    data = data_path(onnx)
    return sha256_file(onnx), sha256_file(data) if data.is_file() else None


def runs_here(prov: EngineProvenance, gpu_name: str | None,
              compute_capability: tuple[int, int] | None,
              tensorrt_version: str | None) -> tuple[bool, list[str]]:
    """Whether the engine can be deserialized and run on a machine with this GPU and
    TensorRT, and if not, why (every reason, not just the first).

    The GPU as the engine's hardware compatibility needs it (the rule of
    ``machine.targets.gpu_mismatch``): ``ampere+`` any GPU of compute capability 8.0 or
    newer, ``same_compute_capability`` any GPU of its compute capability, ``none`` (TensorRT's
    ``kNONE``) the GPU model it was built on, not merely one of its compute capability (an
    A10G's engine is not an A10's, an L4's not an L40S's)."""
    reasons: list[str] = []
    if compute_capability is None:
        reasons.append("no NVIDIA GPU on this machine")
    else:
        cc = f"{compute_capability[0]}.{compute_capability[1]}"
        built = f"{prov.gpu_name} (compute capability {prov.compute_capability})"
        if prov.hardware_compatibility == "ampere+":
            if compute_capability < AMPERE:
                reasons.append(f"the engine is 'ampere+' (compute capability 8.0+); this "
                               f"machine's {gpu_name} is {cc}")
        elif compute_capability != prov.cc:
            reasons.append(f"the engine was built for {built}; this machine's GPU is "
                           f"{gpu_name} ({cc})")
        elif prov.hardware_compatibility == "none" and not same_device_model(
                prov.gpu_name, gpu_name or ""):
            reasons.append(f"the engine was built on {built} with hardware compatibility "
                           f"'none', meant for that GPU model alone (TensorRT's kNONE); this "
                           f"machine's GPU is {gpu_name} (also {cc}): build it here, or with "
                           "--portable same_compute_capability")
    if tensorrt_version is None:
        reasons.append(f"TensorRT is not installed here (the engine needs TensorRT "
                       f"{prov.tensorrt_version})")
    else:
        loads = tensorrt_loads(prov.tensorrt_version, tensorrt_version, prov.version_compatible)
        if not loads and prov.version_compatible:
            reasons.append(f"the engine is version-compatible from TensorRT "
                           f"{prov.tensorrt_version} on within its major version (and "
                           f"10.x into 11.x); this machine has {tensorrt_version}")
        elif not loads:
            reasons.append(f"the engine was built with TensorRT {prov.tensorrt_version} and "
                           f"only runs with exactly that version; this machine has "
                           f"{tensorrt_version}")
    return not reasons, reasons
