"""GPU tests: every test here is marked ``gpu`` and is skipped, with the reason, on a machine
without an NVIDIA GPU, a TensorRT that imports (10.12+), or polygraphy. They run in the
NGC container on self-hosted GPU runners (.github/workflows/gpu.yml, ``make test-gpu``).
With ``TRTPACK_REQUIRE_GPU=1`` (set by that workflow) a missing GPU or TensorRT is an error
instead of a skip, so a misconfigured runner cannot pass by skipping everything."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

from trtpack.machine import gpus, packages
from trtpack.machine.targets import Target, local_gpu_target


@functools.cache
def missing() -> str | None:
    """Why the GPU tests cannot run here, or None."""
    reasons = []
    local = gpus.detect_gpu()
    if local is None:
        reasons.append("no NVIDIA GPU (nvidia-smi/NVML found none)")
    probe = packages.probe_tensorrt()
    if not probe.ok:
        reasons.append(f"TensorRT not usable: {probe.error}")
    elif probe.version and packages.parse_version(probe.version)[:2] < packages.MIN_TENSORRT:
        reasons.append(f"TensorRT {probe.version} is older than 10.12")
    if not packages.module_installed("polygraphy"):
        reasons.append("polygraphy is not installed")
    return "; ".join(reasons) or None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    ours = [i for i in items if Path(str(i.fspath)).is_relative_to(here)]
    for item in ours:
        item.add_marker(pytest.mark.gpu)
    if ours and (reason := missing()) is not None:
        if os.environ.get("TRTPACK_REQUIRE_GPU") == "1":
            raise pytest.UsageError(f"TRTPACK_REQUIRE_GPU=1 but {reason}")
        skip = pytest.mark.skip(reason=f"GPU test skipped: {reason}")
        for item in ours:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def local_gpu() -> gpus.LocalGpu:
    found = gpus.detect_gpu()
    assert found is not None
    return found


@pytest.fixture(scope="session")
def local_target(local_gpu: gpus.LocalGpu) -> Target:
    return local_gpu_target(local_gpu.name, local_gpu.compute_capability)


@pytest.fixture(scope="session")
def gpu_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh cache for the session: the first engine build is a timing-cache miss."""
    return tmp_path_factory.mktemp("trtpack-gpu-cache")
