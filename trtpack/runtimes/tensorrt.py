"""The only module that imports TensorRT: build, deserialize, read I/O, run.

Engines are built through polygraphy's TensorRT loaders (``NetworkFromOnnxPath``,
``CreateConfig``, ``Profile``, ``EngineBytesFromNetwork``; the timing cache is trtpack's) and
run with its ``TrtRunner``.
TensorRT and polygraphy's TensorRT backend are imported inside the functions, TensorRT as
the module polygraphy picks (``tensorrt_module``: ``tensorrt_rtx`` in the compile check's
process); the values
passed to them come from ``trtpack.engine.builder`` (plain data, tested on CPU).
Polygraphy's and TensorRT's log messages go to the given ``logging.Logger``, never stdout
(``polygraphy_setup``: the logging, the profiles, the CUDA versions, without TensorRT).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

import numpy as np

from trtpack.cases import Case
from trtpack.model_io import EngineTensor, numpy_dtype
from trtpack.onnx_tools.files import sha256_file
from trtpack.runtimes.polygraphy_setup import (
    ConfigKwargs,
    NetworkKwargs,
    polygraphy_logging,
    polygraphy_profiles,
)
from trtpack.runtimes.runner import InactiveRunnerError, ModelRunner
from trtpack.shapes import TrtProfile

if TYPE_CHECKING:  # for annotations only (tests read them: TensorRT names this module uses)
    import tensorrt as trt  # no stubs: mypy cannot see it; tests/runtimes checks the names
    from polygraphy.backend.trt import CreateConfig, NetworkFromOnnxPath

class BuilderSettings(Protocol):
    """The builder options of one build (``engine.builder.BuilderSettings``): keyword
    arguments for polygraphy's ``CreateConfig`` and network loader, TensorRT enums by name."""

    def config_kwargs(self) -> ConfigKwargs: ...

    def network_kwargs(self) -> NetworkKwargs: ...

    def to_dict(self) -> Mapping[str, object]: ...


def tensorrt_module() -> ModuleType:
    """The TensorRT module polygraphy's loaders use (``polygraphy.mod.trt_importer``):
    ``tensorrt``, or ``tensorrt_rtx`` in a process where ``POLYGRAPHY_USE_TENSORRT_RTX=1`` was
    set before polygraphy was imported (the compile check's). Every TensorRT name this module
    and ``tensorrt_rtx`` (the compile check) take comes from it, so the objects they make
    and polygraphy's are of one library."""
    from polygraphy.mod.trt_importer import lazy_import_trt

    module: ModuleType = lazy_import_trt()
    return module


class TimingCacheMaker:
    """A builder config kept with its builder, to make and combine timing caches with
    (``IBuilderConfig.create_timing_cache``; ``engine.timing_caches.combine_caches``)."""

    def __init__(self) -> None:
        trt = tensorrt_module()
        self.builder = trt.Builder(trt.Logger(trt.Logger.ERROR))
        self.config = self.builder.create_builder_config()

    def create_timing_cache(self, serialized_timing_cache: bytes) -> trt.ITimingCache:
        return self.config.create_timing_cache(serialized_timing_cache)


def tensorrt_version() -> str:
    trt = tensorrt_module()
    return str(trt.__version__)


def _enum(trt: ModuleType, enum_name: str, member: str) -> object:
    """The member ``member`` of TensorRT's enum ``enum_name`` (passed on to polygraphy)."""
    enum = getattr(trt, enum_name, None)
    if enum is None or not hasattr(enum, member):
        raise RuntimeError(f"this TensorRT ({trt.__version__}) has no {enum_name}.{member}")
    return getattr(enum, member)


def resolve_config_kwargs(trt: ModuleType, kwargs: ConfigKwargs) -> dict[str, object]:
    """Replace TensorRT enum member names in ``BuilderSettings.config_kwargs()`` by members
    (the keyword arguments polygraphy's ``CreateConfig`` is called with)."""
    resolved: dict[str, object] = dict(kwargs)
    if "memory_pool_limits" in kwargs:
        resolved["memory_pool_limits"] = {
            _enum(trt, "MemoryPoolType", pool): size
            for pool, size in kwargs["memory_pool_limits"].items()
        }
    if "hardware_compatibility_level" in kwargs:
        resolved["hardware_compatibility_level"] = _enum(
            trt, "HardwareCompatibilityLevel", kwargs["hardware_compatibility_level"])
    if "tiling_optimization_level" in kwargs:
        resolved["tiling_optimization_level"] = _enum(
            trt, "TilingOptimizationLevel", kwargs["tiling_optimization_level"])
    return resolved


@dataclass(frozen=True)
class BuildResult:
    seconds: float
    plan_bytes: int
    timing_cache_bytes_before: int
    timing_cache_bytes_after: int
    timing_cache_sha256_before: str | None = None
    timing_cache_sha256_after: str | None = None
    timing_cache_rejected: bool = False  # TensorRT refused the file (another device's)


class ConfigWithTimingCache:
    """polygraphy's ``CreateConfig`` (which sets an empty timing cache), then the timing cache
    file set by trtpack, whose result is checked.

    polygraphy's own ``load_timing_cache`` ignores what ``IBuilderConfig.set_timing_cache``
    returns (False: TensorRT refused a cache timed on another device, and the build times
    everything again without saying so), and its ``save_timing_cache`` combines the file into
    the new cache with ``ignore_mismatch=True``, so one file ends up mixing devices. Here a
    refused cache (one ``set_timing_cache`` refuses, or a damaged one ``create_timing_cache``
    cannot read) is reported (``accepted`` False) and replaced by the build's own."""

    def __init__(self, create_config: Callable[[trt.Builder, trt.INetworkDefinition],
                                               trt.IBuilderConfig],
                 cache: bytes | None) -> None:
        self.create_config = create_config
        self.cache = cache
        self.config: trt.IBuilderConfig | None = None  # once built
        self.accepted: bool | None = None  # None: no cache was offered

    def __call__(self, builder: trt.Builder, network: trt.INetworkDefinition
                 ) -> trt.IBuilderConfig:
        config = self.create_config(builder, network)
        self.config = config
        if self.cache:
            # TensorRT's binding returns createTimingCache's pointer as is (python/src/infer/
            # pyCore.cpp, lines 250-255 at a892d22): None for a blob TensorRT cannot read,
            # which set_timing_cache refuses with a TypeError; that is a refused cache too
            loaded = config.create_timing_cache(self.cache)
            self.accepted = loaded is not None and \
                bool(config.set_timing_cache(loaded, ignore_mismatch=False))
            if not self.accepted:
                config.set_timing_cache(config.create_timing_cache(b""), ignore_mismatch=False)
        return config

    def serialized(self) -> bytes:
        """The timing cache after the build (the accepted file's entries and the new ones)."""
        if self.config is None:
            raise RuntimeError("the timing cache is read after the build")
        with self.config.get_timing_cache().serialize() as buffer:
            return bytes(buffer)


def engine_loaders(onnx: Path, profiles: Sequence[TrtProfile], settings: BuilderSettings
                   ) -> tuple[NetworkFromOnnxPath, CreateConfig]:
    """polygraphy's network loader and ``CreateConfig`` for one build (nothing runs yet; the
    timing cache is ``ConfigWithTimingCache``'s).

    Call it inside ``polygraphy_logging``: ``CreateConfig`` logs when it is constructed
    ("TF32 is disabled ..." since trtpack passes ``tf32=False``), and polygraphy's logger
    writes to stdout unless it is routed, which would break ``trtpack build --json``.
    """
    from polygraphy.backend.trt import CreateConfig, NetworkFromOnnxPath

    trt = tensorrt_module()

    config = CreateConfig(
        profiles=polygraphy_profiles(profiles),
        **resolve_config_kwargs(trt, settings.config_kwargs()),
    )
    network = NetworkFromOnnxPath(str(onnx), **settings.network_kwargs())
    return network, config


def build_engine(onnx: Path, plan: Path, profiles: Sequence[TrtProfile],
                 settings: BuilderSettings, timing_cache: Path | None,
                 log: logging.Logger) -> BuildResult:
    """Build a strongly typed engine from ``onnx`` with one optimization profile per entry
    of ``profiles`` and write it to ``plan``; start from ``timing_cache`` and write it back
    with this build's timings (replacing it when TensorRT refused it)."""
    from polygraphy.backend.trt import EngineBytesFromNetwork

    before = timing_cache.stat().st_size if timing_cache and timing_cache.is_file() else 0
    sha_before = sha256_file(timing_cache) if before and timing_cache else None
    log.info("building %s with %d profile(s), %s", onnx, len(profiles), settings.to_dict())
    started = time.perf_counter()
    with polygraphy_logging(log):
        network, create_config = engine_loaders(onnx, profiles, settings)
        config = ConfigWithTimingCache(create_config,
                                       timing_cache.read_bytes() if before and timing_cache
                                       else None)
        serialized = EngineBytesFromNetwork(network, config=config)()
    seconds = time.perf_counter() - started
    if config.accepted is False:
        log.warning("TensorRT refused the timing cache %s (timed on another device or "
                    "TensorRT); it is replaced by this build's", timing_cache)
    with open(plan, "wb") as f:
        f.write(serialized)
    if timing_cache is not None:
        timing_cache.parent.mkdir(parents=True, exist_ok=True)
        partial = timing_cache.with_name(timing_cache.name + f".{os.getpid()}.partial")
        partial.write_bytes(config.serialized())
        partial.replace(timing_cache)  # whole or not at all, also for builds side by side
    after = timing_cache.stat().st_size if timing_cache and timing_cache.is_file() else 0
    sha_after = sha256_file(timing_cache) if after and timing_cache else None
    return BuildResult(seconds, plan.stat().st_size, before, after, sha_before, sha_after,
                       config.accepted is False)


def load_engine(plan: Path, log: logging.Logger | None = None) -> trt.ICudaEngine:
    """Deserialize an engine (``tensorrt.ICudaEngine``)."""
    from polygraphy.backend.trt import EngineFromBytes

    with polygraphy_logging(log or logging.getLogger("trtpack.tensorrt")):
        return EngineFromBytes(plan.read_bytes())()


def engine_tensors(engine: trt.ICudaEngine) -> list[EngineTensor]:
    """The I/O tensors of a deserialized engine, through the TensorRT 10/11 tensor API."""
    trt = tensorrt_module()

    tensors = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        dtype = engine.get_tensor_dtype(name).name
        shape = tuple(int(d) for d in engine.get_tensor_shape(name))
        tensors.append(EngineTensor(name, "input" if is_input else "output", dtype, shape))
    return tensors


def engine_profile_count(engine: trt.ICudaEngine) -> int:
    return int(engine.num_optimization_profiles)


class _PolygraphyRunner(Protocol):
    """What trtpack uses of polygraphy's ``TrtRunner`` (polygraphy ships no types)."""

    def activate(self) -> None: ...

    def deactivate(self) -> None: ...

    def infer(self, feed_dict: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]: ...


class TensorRTRunner(ModelRunner):
    """A deserialized engine in one optimization profile behind the runner interface:
    ``activate`` makes polygraphy's ``TrtRunner`` (an execution context) with polygraphy's and
    TensorRT's messages routed to ``log``; ``infer`` casts the feed to the engine's input
    types (int64 token ids stay int64 when the engine takes INT64; inputs the engine does not
    have are left out) and returns host copies of the outputs."""

    name = "tensorrt"

    def __init__(self, engine: trt.ICudaEngine, profile: int = 0,
                 log: logging.Logger | None = None) -> None:
        self.engine = engine
        self.profile = profile
        self.log = log or logging.getLogger("trtpack.tensorrt")
        tensors = engine_tensors(engine)
        self.input_types = {t.name: numpy_dtype(t.dtype, t.name) for t in tensors
                            if t.mode == "input"}
        self._outputs = tuple(t.name for t in tensors if t.mode == "output")
        self._active: contextlib.ExitStack | None = None
        self._runner: _PolygraphyRunner | None = None

    def activate(self) -> None:
        from polygraphy.backend.trt import TrtRunner

        with contextlib.ExitStack() as stack:
            stack.enter_context(polygraphy_logging(self.log, "WARNING"))
            self._runner = stack.enter_context(
                TrtRunner(self.engine, optimization_profile=self.profile))
            self._active = stack.pop_all()

    def deactivate(self) -> None:
        active, self._active, self._runner = self._active, None, None
        if active is not None:
            active.close()

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(self.input_types)

    @property
    def output_names(self) -> tuple[str, ...]:
        return self._outputs

    def feed(self, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``values`` cast to the engine's input types; inputs it does not have left out."""
        return {name: np.ascontiguousarray(values[name].astype(dtype))
                for name, dtype in self.input_types.items()}

    def infer_fed(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs for a feed ``feed()`` made, as polygraphy returns them (its host
        buffers, reused by the next run)."""
        if self._runner is None:
            raise InactiveRunnerError(self)
        return dict(self._runner.infer(feed))

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: np.array(v) for k, v in self.infer_fed(self.feed(feeds)).items()}


def run_cases(engine: trt.ICudaEngine, cases: Sequence[Case], log: logging.Logger | None = None
              ) -> list[dict[str, np.ndarray]]:
    """Run the engine on each case's inputs, in the case's optimization profile
    (``TensorRTRunner``: inputs cast to the engine's types, unknown inputs left out)."""
    outputs: list[dict[str, np.ndarray]] = [{} for _ in cases]
    by_profile: dict[int, list[int]] = {}
    for i, case in enumerate(cases):
        by_profile.setdefault(case.profile, []).append(i)
    for profile, indices in sorted(by_profile.items()):
        with TensorRTRunner(engine, profile, log) as runner:
            for i in indices:
                outputs[i] = runner.infer(cases[i].inputs)
    return outputs


class EngineInfer:
    """A callable that runs one feed through an engine in one optimization profile and
    returns when the outputs are on the host (what ``engine_runner`` yields): the feed is
    prepared apart (``feed``), so that a timed call runs the engine alone."""

    def __init__(self, runner: TensorRTRunner) -> None:
        self.runner = runner

    def feed(self, values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``values`` cast to the engine's input types; inputs it does not have left out."""
        return self.runner.feed(values)

    def __call__(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.runner.infer_fed(feed)


@contextlib.contextmanager
def engine_runner(engine: trt.ICudaEngine, profile: int, log: logging.Logger | None = None
                  ) -> Iterator[EngineInfer]:
    """``TensorRTRunner`` on ``engine`` in ``profile``, as ``run_cases`` uses it (for the
    benchmark: the same runtime path as verification). Not yet run on a GPU."""
    with TensorRTRunner(engine, profile, log) as runner:
        yield EngineInfer(runner)
