"""The files stages hand each other: one typed record, a field per artifact. Each stage reads
the fields it needs from ``StageContext.artifacts`` and returns the ones it made in its
``StageOutcome.artifacts``; the pipeline merges them in stage order. Which model is served
is decided here, once (``Artifacts.served_model``, ``Artifacts.cpu_fallback_model``); the
package stage records what it served in report.json, and a finished build is read back from
that record (``pipeline.build_folder.served_model_file``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path


@dataclass(frozen=True)
class Artifacts:
    """Each field is set by the stage named in its comment (``None`` until then). The field
    order is the order a stage's artifacts are listed in report.json."""

    # export (or import, for an ONNX source): model.onnx + model.onnx.data; simplify
    # replaces it with the simplified model
    onnx: Path | None = None
    reference: Path | None = None  # export/import: reference.npz, inputs + reference outputs
    tokenizer: Path | None = None  # export/import: tokenizer/, when the recipe has one
    model_config: Path | None = None  # export/import: the model's config.json
    fp32_outputs: Path | None = None  # verify: the same cases' ONNX Runtime FP32 outputs
    # cpu_model (--target cpu, --fallback-cpu): the FP32 graph fused for ONNX Runtime, and
    # what ONNX Runtime serves on the CPU (that, the INT8 form or the Q/DQ graph)
    cpu_fp32_onnx: Path | None = None
    cpu_onnx: Path | None = None
    # cpu_model, a convolutional model's static INT8 candidate when FP32 is served instead
    # (it failed its gates or gained nothing): kept so that its reported figures can be checked
    cpu_int8_candidate: Path | None = None
    # precision (or cpu_model, when its first INT8 form failed and the Q/DQ search ran
    # there): the FP16 / INT8 ONNX, and the recipe overlay of the nodes kept in high precision
    precision_onnx: Path | None = None
    recipe_overlay: Path | None = None
    # engine: model.plan, model.plan.json, the equivalent trtexec command
    engine: Path | None = None
    engine_provenance: Path | None = None
    engine_trtexec: Path | None = None

    def served_model(self, gpu: bool) -> Path:
        """The model Triton serves: the engine; on a CPU target the CPU model; else the
        precision ONNX, else the FP32 ONNX. Before the engine exists this is the ONNX the
        engine is built from."""
        cpu = None if gpu else self.cpu_onnx
        served = self.engine or cpu or self.precision_onnx or self.onnx
        if served is None:
            raise ValueError("no model: the export (or import) stage has not run")
        return served

    def cpu_fallback_model(self) -> Path | None:
        """The ONNX ``--fallback-cpu`` serves on ONNX Runtime's CPU: the CPU model, else the
        FP32 ONNX."""
        return self.cpu_onnx or self.onnx

    def named(self) -> dict[str, Path]:
        """The artifacts set, by field name (what the stage cache and report.json record)."""
        return {name: path for name, path in asdict(self).items() if path is not None}

    @classmethod
    def from_named(cls, paths: Mapping[str, Path]) -> Artifacts:
        return cls(**paths)

    def merged(self, later: Artifacts) -> Artifacts:
        """These artifacts with the ones ``later`` set in their place."""
        return replace(self, **later.named())

    def moved(self, folder: Path, to: Path) -> Artifacts:
        """The paths inside ``folder`` as the same paths inside ``to``."""
        return Artifacts.from_named({name: to / path.relative_to(folder)
                                     for name, path in self.named().items()})
