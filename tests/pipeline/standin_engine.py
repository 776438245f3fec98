"""TEST ONLY -- a STAND-IN for TensorRT, which cannot be installed on these machines.

``use_standin_engine`` replaces the few TensorRT-facing functions the real engine stage
calls (``trtpack.stages.engine``: the GPU check, build, load, I/O, run) with ONNX Runtime on
the engine stage's own ONNX, and the GPU with one of the target's compute capability. The
engine stage's own code still runs: provenance, the engine-vs-onnx verification against the
recorded FP32 references, trtexec.sh, and then the package stage and ``trtpack merge``. What
it proves is the convert-once FLOW and that ``merge`` accepts its output; it proves nothing
about a TensorRT engine: its ``model.plan`` is a text file saying so, and its outputs are
ONNX Runtime's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trtpack.cases import Case
from trtpack.machine.gpus import LocalGpu
from trtpack.machine.local_targets import EnvironmentReport
from trtpack.machine.targets import Target
from trtpack.model_io import EngineTensor
from trtpack.runtimes.tensorrt import BuildResult

STANDIN_TENSORRT = "10.13.3.9"  # a version string for the provenance: no TensorRT ran
PLAN_HEADER = b"STAND-IN ENGINE (tests/pipeline/standin_engine.py): not a TensorRT plan\n"
ORT_TO_TRT = {"tensor(float)": "FLOAT", "tensor(int64)": "INT64", "tensor(int32)": "INT32",
              "tensor(float16)": "HALF", "tensor(bool)": "BOOL"}


def _environment(target: Target, *_: Any, **__: Any) -> EnvironmentReport:
    assert target.gpu is not None
    gpu = LocalGpu(f"stand-in for {target.gpu.name}", target.gpu.compute_capability, "0.0")
    return EnvironmentReport(target.name, gpu, (gpu,), STANDIN_TENSORRT)


def _build(onnx: Path, plan: Path, profiles: Sequence[Any], settings: Any,
           timing_cache: Path | None, log: Any) -> BuildResult:
    plan.write_bytes(PLAN_HEADER + str(onnx.resolve()).encode() + b"\n")
    return BuildResult(0.0, plan.stat().st_size, 0, 0)


def _load(plan: Path, log: Any = None) -> Any:
    import onnxruntime as ort

    header, onnx = plan.read_bytes().split(b"\n")[:2]
    assert header + b"\n" == PLAN_HEADER
    return ort.InferenceSession(onnx.decode(), providers=["CPUExecutionProvider"])


def _tensors(session: Any) -> list[EngineTensor]:
    def shape(arg: Any) -> tuple[int, ...]:
        return tuple(d if isinstance(d, int) else -1 for d in arg.shape)

    return ([EngineTensor(a.name, "input", ORT_TO_TRT[a.type], shape(a))
             for a in session.get_inputs()]
            + [EngineTensor(a.name, "output", ORT_TO_TRT[a.type], shape(a))
               for a in session.get_outputs()])


def _run(session: Any, cases: Sequence[Case], log: Any = None) -> list[dict[str, np.ndarray]]:
    names = [a.name for a in session.get_inputs()]
    outputs = [a.name for a in session.get_outputs()]
    return [dict(zip(outputs, session.run(outputs, {n: c.inputs[n] for n in names}),
                     strict=True)) for c in cases]


def use_standin_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Swap TensorRT and the GPU for the stand-in (undone when the test ends)."""
    import trtpack.machine.packages as packages
    import trtpack.pipeline.engine_from_build as from_build
    import trtpack.runtimes.polygraphy_setup as polygraphy_setup
    import trtpack.runtimes.tensorrt as tensorrt_api
    import trtpack.stages.engine as engine_stage

    monkeypatch.setattr(from_build, "check_engine_environment", _environment)
    monkeypatch.setattr(engine_stage, "check_engine_environment", _environment)
    monkeypatch.setattr(packages, "tensorrt_version", lambda: STANDIN_TENSORRT)
    monkeypatch.setattr(tensorrt_api, "tensorrt_version", lambda: STANDIN_TENSORRT)
    monkeypatch.setattr(tensorrt_api, "build_engine", _build)
    monkeypatch.setattr(tensorrt_api, "load_engine", _load)
    monkeypatch.setattr(tensorrt_api, "engine_tensors", _tensors)
    monkeypatch.setattr(tensorrt_api, "run_cases", _run)
    monkeypatch.setattr(polygraphy_setup, "cuda_versions", lambda: ("stand-in", "stand-in"))
