"""The stages of a build, in order, and when each one applies, is skipped, cached, gated or
isolated. A stage is a module with ``fingerprint(plan)`` and ``run(ctx)``
(``trtpack.stages``); stage modules are imported only when they run."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

from trtpack.engine.tensorrt_rtx import COMPILE_CHECK_STAGE
from trtpack.machine.packages import (
    TENSORRT_RTX_INSTALL,
    TENSORRT_RTX_MODULE,
    USE_TENSORRT_RTX,
    module_installed,
)
from trtpack.options import BuildPlan
from trtpack.precision.cpu.int8 import search_on_demand

ArtifactReads = tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Stage:
    """A pipeline step: the module holding ``run(ctx)`` and ``fingerprint(options)``."""

    name: str
    module: str
    skip_reason: Callable[[BuildPlan], str | None] = lambda o: None
    cacheable: bool = True
    gated: bool = True  # a failed verification row stops the build
    # Run in a process of its own: what the stage allocates (a whole PyTorch model) is
    # returned to the system when it ends, and a crash in a native library cannot take the
    # build down.
    isolated: bool = False
    # What an isolated stage's process imports ahead of time: it starts up to two stages
    # ahead and imports these while the stages before it run, so the stage does not wait.
    # (Not for in-process stages: an import thread in the build's own process can deadlock
    # the interpreter's exit when Ctrl-C lands in the middle of an import.) ``module:function``
    # imports the module and calls its function (``isolate.import_quietly``).
    warm_modules: tuple[str, ...] = ()
    # How many later isolated stages' processes warm up while this one runs.
    warm_beside: int = 2
    # An isolated stage whose module has ``head_start(ctx)``: its process starts that part of
    # its work (on the artifacts made so far) while the stage before it runs, and ``run``
    # takes it up (the CPU model fuses its graph while verify checks the ONNX model).
    head_start: bool = False
    # Environment variables an isolated stage's process has from its start, before anything
    # is imported (the compile check's polygraphy picks TensorRT-RTX when it is imported)
    environment: tuple[tuple[str, str], ...] = ()
    # False: the stage is not part of this build at all (not listed in the report)
    applies: Callable[[BuildPlan], bool] = lambda o: True
    # The earlier stages' artifacts (``Artifacts`` fields) the stage reads when it runs: groups
    # of alternatives, each met by the latest stage that made one of its fields. None: any of
    # them. What an entry in the remote cache must be downloaded for (``StageRuns.plan``).
    reads: Callable[[BuildPlan], ArtifactReads | None] = lambda o: None

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)


def _precision_skip(o: BuildPlan) -> str | None:
    if o.precision == "fp32":
        return "fp32: nothing to convert"
    if search_on_demand(o):
        return ("target cpu: cpu_model makes and gates the CPU INT8 model (the Q/DQ search "
                "runs there only if a transformer's first CPU INT8 form fails its gates)")
    return None


def _engine_skip(o: BuildPlan) -> str | None:
    if not o.target.is_gpu:
        return "target cpu: ONNX Runtime serves the ONNX model"
    if not o.build_engine:
        return "--no-engine"
    return None


def _compile_check_applies(o: BuildPlan) -> bool:
    """A GPU build whose engine no local TensorRT builds here (``--no-engine``: the convert
    job of the fleet flow, the folder ``trtpack engine`` takes)."""
    return o.target.is_gpu and not o.build_engine


def _compile_check_skip(o: BuildPlan) -> str | None:
    if not o.compile_check:
        return "--no-compile-check"
    if not module_installed(TENSORRT_RTX_MODULE):
        return f"TensorRT-RTX is not installed ({TENSORRT_RTX_INSTALL})"
    return None


def _cpu_served(o: BuildPlan) -> bool:
    return not o.target.is_gpu or o.fallback_cpu


def _onnx_in(o: BuildPlan) -> bool:
    return o.recipe.source.onnx is not None


def _served_reads(o: BuildPlan) -> tuple[str, ...]:
    """``Artifacts.served_model``'s fields, in its order of preference."""
    return ("engine", "precision_onnx", "onnx") if o.target.is_gpu \
        else ("cpu_onnx", "precision_onnx", "onnx")


def _package_reads(o: BuildPlan) -> ArtifactReads:
    groups = [_served_reads(o), ("tokenizer",), ("model_config",), ("reference",)]
    if o.fallback_cpu:
        groups.append(("cpu_onnx", "onnx"))
    return tuple(groups)


# what PyTorch export needs before it can start: torch, transformers and their model code
# transformers.modeling_utils without scipy (pytorch.models.import_model_code)
_TORCH = ("torch", "transformers", "trtpack.pytorch.models:import_model_code", "onnx",
          "onnxscript")

STAGES: tuple[Stage, ...] = (
    # ONNX in: the user's ONNX is imported, and is the reference; there is no export
    Stage("import", "trtpack.stages.import_onnx", isolated=True, applies=_onnx_in,
          warm_modules=("onnx", "onnxruntime")),
    # warm_beside=1: the export holds the whole PyTorch model, the build's memory peak (each
    # warming process holds 80-140 MB of imports); verify's process starts with the simplify,
    # or, for a small model, once the exporter works on one core (StageRuns.warm_on_spare_core)
    Stage("export", "trtpack.stages.export", isolated=True, applies=lambda o: not _onnx_in(o),
          warm_modules=_TORCH, warm_beside=1),
    Stage("simplify", "trtpack.stages.simplify", isolated=True,
          warm_modules=("onnx", "onnxruntime")),  # and onnxsim, in its preload
    # isolated: ONNX Runtime's memory for the FP32 model goes back before precision starts
    Stage("verify", "trtpack.stages.verify", isolated=True,
          warm_modules=("onnx", "onnxruntime", "polygraphy.comparator")),  # what it uses
    # isolated: a Ctrl-C landing while its ONNX Runtime threads run can crash the build's own
    # process (SIGSEGV); in a process of its own it is simply ended
    Stage("precision", "trtpack.stages.precision", _precision_skip, isolated=True,
          warm_modules=("onnx", "onnxruntime", "polygraphy.comparator")),
    # the model ONNX Runtime serves on the CPU (--target cpu, --fallback-cpu): fused, and
    # INT8 on its integer kernels; the engine keeps the TensorRT-shaped graph
    Stage("cpu_model", "trtpack.stages.cpu_model", isolated=True, applies=_cpu_served,
          head_start=True,
          warm_modules=("onnx", "onnxruntime", "onnxruntime.transformers.optimizer",
                        "onnxruntime.quantization", "polygraphy.comparator")),
    # the engine stage's network and builder config compiled by TensorRT for RTX on this
    # machine's CPU (no GPU, nothing run; the plan is not kept). Isolated: its process imports
    # polygraphy with POLYGRAPHY_USE_TENSORRT_RTX=1, and TensorRT-RTX's memory goes back after
    Stage(COMPILE_CHECK_STAGE, "trtpack.stages.compile_check", _compile_check_skip, isolated=True,
          applies=_compile_check_applies, environment=((USE_TENSORRT_RTX, "1"),),
          reads=lambda o: (_served_reads(o),),
          warm_modules=("onnx", "polygraphy.backend.trt")),
    Stage("engine", "trtpack.stages.engine", _engine_skip),
    Stage("package", "trtpack.stages.package", cacheable=False, reads=_package_reads),
)
