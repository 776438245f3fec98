"""A timing cache TensorRT cannot read is a refused cache, not a crash (issue 45, item 6).

TensorRT's Python binding returns ``IBuilderConfig::createTimingCache``'s pointer as is
(``python/src/infer/pyCore.cpp``, lines 250-255 at a892d22), so a blob TensorRT cannot read
comes back as None (TensorRT's own trtexec checks for it: "TimingCache creation failed",
``samples/common/sampleEngines.cpp``), and ``set_timing_cache(None, ...)`` raises. The
bindings here are TensorRT-RTX's (``tensorrt_rtx``, the builder that runs without a GPU):
its ``set_timing_cache`` is a real pybind11 binding that raises the same TypeError on None,
but its timing-cache calls are no-ops (TensorRT-RTX 1.2+: "Timing cache operations are no-ops
in TensorRT-RTX"), so its ``create_timing_cache`` returns a cache for any blob, damaged ones
included (measured, 1.7.1.116). The refusal itself is therefore a labelled stand-in: a real
TensorRT-RTX builder config whose ``create_timing_cache`` answers None for the damaged blob,
as TensorRT's does.
"""

from __future__ import annotations

import warnings
from types import ModuleType
from typing import Any

import pytest

from trtpack.runtimes.tensorrt import ConfigWithTimingCache

DAMAGED = b"ptrtd" + bytes(40)  # a timing cache's magic, then nothing TensorRT can read


def _rtx() -> ModuleType:
    return pytest.importorskip("tensorrt_rtx", reason="TensorRT-RTX is in the all extras")


class CannotReadDamagedBlobs:
    """STAND-IN (labelled, not TensorRT): a real TensorRT-RTX ``IBuilderConfig`` whose
    ``create_timing_cache`` returns None for ``DAMAGED``, as TensorRT's binding does for a
    blob TensorRT cannot read; everything else is the real config."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def create_timing_cache(self, blob: bytes) -> Any:
        return None if blob == DAMAGED else self.real.create_timing_cache(blob)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _builder(trt: ModuleType) -> tuple[Any, Any]:
    builder = trt.Builder(trt.Logger(trt.Logger.ERROR))
    return builder, builder.create_network(0)


def test_the_real_binding_raises_on_a_cache_that_is_none() -> None:
    """What the code before the fix did with None: the real binding refuses it."""
    trt = _rtx()
    builder, _ = _builder(trt)
    with pytest.raises(TypeError, match="incompatible function arguments"):
        builder.create_builder_config().set_timing_cache(None, ignore_mismatch=False)


def test_a_cache_tensorrt_cannot_read_is_refused_and_replaced() -> None:
    trt = _rtx()
    builder, network = _builder(trt)
    config = ConfigWithTimingCache(
        lambda b, n: CannotReadDamagedBlobs(b.create_builder_config()), DAMAGED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # RTX: timing caches are no-ops
        made = config(builder, network)
        assert config.accepted is False  # refused, and the build goes on with an empty one
        assert made.get_timing_cache() is not None
        assert isinstance(config.serialized(), bytes)


def test_tensorrt_rtx_itself_accepts_any_blob() -> None:
    """Why the refusal above is a stand-in: TensorRT-RTX's timing-cache calls are no-ops, so
    the real config takes the damaged blob. When this fails, TensorRT-RTX reads timing caches
    again and the stand-in can go."""
    trt = _rtx()
    builder, network = _builder(trt)
    config = ConfigWithTimingCache(lambda b, n: b.create_builder_config(), DAMAGED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        config(builder, network)
    assert config.accepted is True
