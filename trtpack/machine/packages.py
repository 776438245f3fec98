"""The Python packages trtpack uses (the one table) and TensorRT: which are installed, their
versions, and a probe that imports TensorRT in a subprocess, so a broken installation is
reported instead of crashing the caller. Found with ``importlib.util.find_spec`` and
``importlib.metadata``; nothing here imports them."""

from __future__ import annotations

import functools
import importlib.util
import re
import subprocess
from dataclasses import dataclass
from importlib import metadata
from typing import Literal

from trtpack.processes import python_code_command

MIN_TENSORRT = (10, 12)
"""The oldest TensorRT the engine stage supports (strongly typed networks, tiling level)."""

TENSORRT_DISTRIBUTIONS = ("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt-cu13-bindings",
                          "tensorrt-cu12-bindings")
"""Names the TensorRT Python bindings are installed under (NGC containers use ``tensorrt``)."""

TENSORRT_INSTALL = (
    "pip install 'trtpack[tensorrt-cu12]' (CUDA 12 driver) or 'trtpack[tensorrt-cu13]' (CUDA "
    "13): PyPI's tensorrt packages fetch TensorRT's libraries from NVIDIA's index at install "
    "time; or run in an NGC container that ships TensorRT (Dockerfile.ngc)"
)
"""How to get TensorRT: the exit-3 hint, ``trtpack doctor`` and the docs (GPU and TensorRT)
say this."""

TENSORRT_RTX_MODULE = "tensorrt_rtx"
TENSORRT_RTX_DISTRIBUTIONS = ("tensorrt-rtx-cu12", "tensorrt-rtx", "tensorrt-rtx-cu13")
"""TensorRT for RTX (the compile check's builder, without a GPU): its import name and the
names it is installed under."""
TENSORRT_RTX_INSTALL = "pip install 'trtpack[tensorrt-rtx]'; make run installs it"
USE_TENSORRT_RTX = "POLYGRAPHY_USE_TENSORRT_RTX"
"""The variable polygraphy reads when it is imported (``polygraphy/config.py``): its TensorRT
loaders then use ``tensorrt_rtx`` (``polygraphy/mod/trt_importer.py``)."""


def tensorrt_rtx_version() -> str | None:
    """TensorRT-RTX's version from the installed distribution's metadata (no import)."""
    if not module_installed(TENSORRT_RTX_MODULE):
        return None
    return distribution_version(*TENSORRT_RTX_DISTRIBUTIONS)


# --- packages -------------------------------------------------------------------------------

NeededFor = Literal["build", "modelopt", "engine", "serving", "report"]


@dataclass(frozen=True)
class Package:
    """A Python package trtpack uses: its pip name, import name, and what it is for.

    ``needed_for``: ``build`` packages are checked before every build (exit 3 when one is
    missing), ``modelopt`` ones before an fp16/int8 build; ``shown``: a row of ``trtpack
    doctor``; ``recorded``: its version is in the build report (and the stage cache keys).
    """

    name: str
    module: str
    needed_for: NeededFor
    purpose: str = ""
    shown: bool = True
    recorded: bool = True
    distributions: tuple[str, ...] = ()  # where installed under other names than ``name``

    def version(self) -> str | None:
        if self.name == "tensorrt":
            return tensorrt_version()
        return distribution_version(*(self.distributions or (self.name,)))


PACKAGES: tuple[Package, ...] = (
    Package("torch", "torch", "build", "export (PyTorch → ONNX)"),
    Package("transformers", "transformers", "build", "loading Hugging Face models"),
    Package("onnx", "onnx", "build", "every ONNX stage"),
    Package("onnxruntime", "onnxruntime", "build", "verification on CPU, --target cpu serving"),
    Package("onnxscript", "onnxscript", "report", shown=False),
    Package("onnx-ir", "onnx_ir", "report", shown=False),
    Package("onnxsim", "onnxsim", "build", "simplify"),
    Package("polygraphy", "polygraphy", "build", "comparison, TensorRT engine build"),
    Package("nvidia-modelopt", "modelopt", "modelopt", "--precision fp16 / int8"),
    # ModelOpt's ONNX path without its [onnx] extra: modelopt.onnx imports these at import time
    Package("onnxslim", "onnxslim", "modelopt", shown=False),
    Package("onnx-graphsurgeon", "onnx_graphsurgeon", "modelopt", shown=False),
    Package("ml_dtypes", "ml_dtypes", "modelopt", shown=False, recorded=False),
    Package("lief", "lief", "modelopt", shown=False, recorded=False),
    Package("cppimport", "cppimport", "modelopt", shown=False, recorded=False),
    # the FP16 conversion when AutoCast cannot convert a graph
    # (trtpack.precision.fp16.onnxconverter_fallback)
    Package("onnxconverter-common", "onnxconverter_common", "modelopt", shown=False),
    Package("tokenizers", "tokenizers", "report", shown=False),
    Package("tensorrt", "tensorrt", "engine",
            "TensorRT engines (pip install 'trtpack[tensorrt-cu12]', or NGC)",
            distributions=TENSORRT_DISTRIBUTIONS),
    # not recorded: only the compile check's cache key holds its version (its fingerprint)
    Package("tensorrt-rtx-cu12", TENSORRT_RTX_MODULE, "report",
            "compile check without a GPU (--no-engine builds for a GPU)", recorded=False,
            distributions=TENSORRT_RTX_DISTRIBUTIONS),
    Package("tritonclient", "tritonclient", "serving", "Triton config schema", recorded=False),
)


def required_modules(needed_for: NeededFor) -> dict[str, str]:
    """Import name -> pip package of the packages ``needed_for`` one purpose (for
    ``errors.require_modules``: nothing is imported)."""
    return {p.module: p.name for p in PACKAGES if p.needed_for == needed_for}


def recorded_versions() -> dict[str, str | None]:
    """The version of every package a build report records (None: not installed)."""
    return dict(_recorded_versions())


@functools.cache
def _recorded_versions() -> dict[str, str | None]:
    """Looked up once per process (a build asks four times: its report, the stage keys and
    the memory estimate's key, each a metadata lookup per package): what a process has
    imported does not change while it runs."""
    return {p.name: p.version() if p.name == "tensorrt" else distribution_version(p.name)
            for p in PACKAGES if p.recorded}


def module_installed(module: str) -> bool:
    """``module`` can be found (it is not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def distribution_version(*names: str) -> str | None:
    """The version of the first of ``names`` that is installed."""
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def parse_version(text: str) -> tuple[int, ...]:
    """``"10.13.0.35"`` -> ``(10, 13, 0, 35)``; stops at the first part that is not a number."""
    parts: list[int] = []
    for piece in text.split("."):
        match = re.match(r"\d+", piece)
        if match is None:
            break
        parts.append(int(match[0]))
        if match[0] != piece:
            break
    return tuple(parts)


def tensorrt_available() -> bool:
    """The ``tensorrt`` module can be found (not that it imports: see ``probe_tensorrt``)."""
    return module_installed("tensorrt")


def tensorrt_version() -> str | None:
    """TensorRT's version from the installed distribution's metadata (no import)."""
    if not tensorrt_available():
        return None
    return distribution_version(*TENSORRT_DISTRIBUTIONS)


@dataclass(frozen=True)
class TensorRTProbe:
    """The result of importing TensorRT in a subprocess."""

    ok: bool
    version: str | None
    error: str | None = None


def probe_tensorrt(timeout: float = 120) -> TensorRTProbe:
    """Import ``tensorrt`` in a fresh interpreter: its real version, or why it fails."""
    if not tensorrt_available():
        return TensorRTProbe(False, None, "the Python package 'tensorrt' is not installed")
    code = "import tensorrt; print(tensorrt.__version__)"
    try:
        done = subprocess.run(python_code_command(code), capture_output=True, text=True,
                              timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return TensorRTProbe(False, None, f"importing tensorrt failed: {e}")
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
        return TensorRTProbe(False, tensorrt_version(),
                             f"'import tensorrt' fails: {lines[-1] if lines else 'no output'}")
    return TensorRTProbe(True, done.stdout.strip() or tensorrt_version())
