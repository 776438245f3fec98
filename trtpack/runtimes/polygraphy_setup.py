"""Polygraphy around the TensorRT calls, with no TensorRT import: its logger routed to a
``logging.Logger``, its ``Profile`` objects, the CUDA versions its CUDA wrapper reads, and the
keyword arguments trtpack gives its loaders (TensorRT enums by member name).

``runtimes.tensorrt`` (the only ``tensorrt`` importer) uses them; polygraphy is imported
inside the functions.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, TypedDict

from trtpack.shapes import TrtProfile

if TYPE_CHECKING:
    from polygraphy.backend.trt import Profile


class NetworkKwargs(TypedDict, total=False):
    """Keyword arguments for polygraphy's ``NetworkFromOnnxPath`` (besides the path)."""

    strongly_typed: bool


class ConfigKwargs(TypedDict, total=False):
    """Keyword arguments for polygraphy's ``CreateConfig`` (besides profiles and the timing
    cache), TensorRT enums by member name (``"AMPERE_PLUS"``)."""

    tf32: bool
    builder_optimization_level: int
    memory_pool_limits: dict[str, int]  # MemoryPoolType member -> bytes
    hardware_compatibility_level: str  # HardwareCompatibilityLevel member
    version_compatible: bool
    tiling_optimization_level: str  # TilingOptimizationLevel member


@contextlib.contextmanager
def polygraphy_logging(log: logging.Logger, severity: str = "INFO") -> Iterator[None]:
    """Route polygraphy's logger (and TensorRT's, which polygraphy forwards) to ``log``."""
    from polygraphy.logger import G_LOGGER

    saved_python = G_LOGGER.use_python_logging_system
    saved_severity = G_LOGGER.module_severity
    saved_colors = G_LOGGER.colors
    G_LOGGER.use_python_logging_system = True
    # colours off: without the 'colored' package polygraphy's first coloured message print()s
    # "[W] 'colored' module is not installed" to stdout, routed or not
    G_LOGGER.colors = False
    G_LOGGER.module_severity = getattr(G_LOGGER, severity)
    target = logging.getLogger("Polygraphy")
    saved = list(target.handlers), target.propagate, target.level
    target.handlers = list(log.handlers)
    target.propagate = False
    target.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        target.handlers, target.propagate = saved[0], saved[1]
        target.setLevel(saved[2])
        G_LOGGER.module_severity = saved_severity
        G_LOGGER.use_python_logging_system = saved_python
        G_LOGGER.colors = saved_colors


def cuda_versions() -> tuple[str | None, str | None]:
    """(CUDA runtime version, CUDA driver version) from libcudart, as polygraphy loads it."""

    def fmt(v: int) -> str:
        return f"{v // 1000}.{(v % 1000) // 10}"

    try:
        from polygraphy import cuda

        handle = cuda.wrapper().handle
        runtime, driver = ctypes.c_int(0), ctypes.c_int(0)
        handle.cudaRuntimeGetVersion(ctypes.byref(runtime))
        handle.cudaDriverGetVersion(ctypes.byref(driver))
        return (fmt(runtime.value) if runtime.value else None,
                fmt(driver.value) if driver.value else None)
    except Exception:  # provenance is best effort here; the build itself needs CUDA anyway
        return None, None


def polygraphy_profiles(profiles: Sequence[TrtProfile]) -> list[Profile]:
    """polygraphy ``Profile`` objects (plain mappings until ``CreateConfig`` turns them into
    ``IOptimizationProfile`` with ``set_shape``); building them needs no TensorRT."""
    from polygraphy.backend.trt import Profile

    result = []
    for shapes in profiles:
        profile = Profile()
        for name, (mn, opt, mx) in shapes.items():
            profile.add(name, min=list(mn), opt=list(opt), max=list(mx))
        result.append(profile)
    return result
