"""Compile an engine without keeping or running it: the engine stage's loaders
(``tensorrt.engine_loaders``: polygraphy's ``NetworkFromOnnxPath`` and ``CreateConfig``
with the same profiles and settings) handed to the TensorRT module polygraphy picks —
TensorRT for RTX in the compile check's process, where ``POLYGRAPHY_USE_TENSORRT_RTX=1`` is
set before polygraphy is imported — with the compute capability to compile for set on the
builder config. Nothing is deserialized or run (that needs a GPU).

What it returns is read from the builder's own objects: the network's inputs (names,
types, shapes) from the parsed network, the profiles from the ``IOptimizationProfile``
objects ``CreateConfig`` set; a refusal is ``CompileRefused`` with the parser's node, its
op type and message, or the builder's message.
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trtpack.runtimes.polygraphy_setup import polygraphy_logging
from trtpack.runtimes.tensorrt import BuilderSettings, engine_loaders, tensorrt_module
from trtpack.shapes import TrtProfile

if TYPE_CHECKING:  # for annotations only
    import tensorrt as trt  # no stubs: mypy cannot see it


@dataclass(frozen=True)
class NetworkInput:
    """An input of the parsed network: its name, type and declared shape (-1 dynamic)."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Compiled:
    """What the builder accepted and made (the plan itself is not kept)."""

    builder_version: str
    inputs: tuple[NetworkInput, ...]
    # per optimization profile: input -> (min, opt, max), read back from the builder's profiles
    profiles: tuple[dict[str, tuple[tuple[int, ...], ...]], ...]
    compute_capabilities: tuple[str, ...]  # as set on the builder config ("SM86")
    engine_bytes: int
    engine_sha256: str
    parse_seconds: float
    build_seconds: float  # build_serialized_network alone


class CompileRefused(Exception):
    """The parser or the builder refused the network: ``node``/``op`` where the parser
    names them, and its (or the builder's) own message."""

    def __init__(self, phase: str, message: str, node: str | None = None,
                 op: str | None = None) -> None:
        super().__init__(message)
        self.phase = phase
        self.message = message
        self.node = node
        self.op = op

    def line(self) -> str:
        where = f"node '{self.node}' (op {self.op}): " if self.node or self.op else ""
        return f"{self.phase} refused: {where}{self.message}"


class _CapturedErrors(logging.Handler):
    """The ERROR records polygraphy forwards from TensorRT's logger during one call."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class _RecordingBuilder:
    """The builder as ``CreateConfig`` sees it, keeping the optimization profiles it makes
    (they are read back after the build: ``IBuilderConfig`` has no getter for them)."""

    def __init__(self, builder: trt.Builder) -> None:
        self._builder = builder
        self.profiles: list[trt.IOptimizationProfile] = []

    def create_optimization_profile(self) -> trt.IOptimizationProfile:
        profile = self._builder.create_optimization_profile()
        self.profiles.append(profile)
        return profile

    def __getattr__(self, name: str) -> object:
        return getattr(self._builder, name)


# what TensorRT-RTX logs beside a refusal on a machine without a GPU, not the refusal itself
_NO_GPU = re.compile(r"CUDA driver version is insufficient|cudaError|\[!\]")
_WHERE = re.compile(r"\s*In \w+ at /\S+\)?$")  # "In validate at /_src/...cpp:4054"


def _builder_words(messages: Sequence[str]) -> str:
    """The builder's first error message in its own words, without the severity prefix and
    its source location."""
    for message in messages:
        if _NO_GPU.search(message):
            continue
        text = message.strip().removeprefix("[E]").strip()
        text = _WHERE.sub(")", text) if text.endswith(")") else text
        return text
    return ""


def _parser_refusal(trt_module: object, onnx: Path, strongly_typed: bool) -> CompileRefused:
    """Parse ``onnx`` again with the parser alone to read its first error as data (node
    name, op type, description); polygraphy's loader only logs them."""
    trt = trt_module
    logger = trt.Logger(trt.Logger.ERROR)  # type: ignore[attr-defined]
    builder = trt.Builder(logger)  # type: ignore[attr-defined]
    flags = 0
    if strongly_typed and hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):  # type: ignore[attr-defined]
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)  # type: ignore[attr-defined]
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)  # type: ignore[attr-defined]
    ok = parser.parse_from_file(str(onnx))
    if parser.num_errors:
        error = parser.get_error(0)
        return CompileRefused("parse", str(error.desc()).strip(),
                              str(error.node_name()) or None, str(error.node_operator()) or None)
    return CompileRefused("parse", "the ONNX parser failed without an error" if not ok
                          else "the ONNX parser refused the file")


def _read_profiles(recorded: Sequence[trt.IOptimizationProfile], inputs: Sequence[NetworkInput]
                   ) -> tuple[dict[str, tuple[tuple[int, ...], ...]], ...]:
    result = []
    for profile in recorded:
        shapes = {}
        for tensor in inputs:
            corners = profile.get_shape(tensor.name)
            if corners:
                shapes[tensor.name] = tuple(tuple(int(d) for d in dims) for dims in corners)
        result.append(shapes)
    return tuple(result)


def compile_engine(onnx: Path, profiles: Sequence[TrtProfile], settings: BuilderSettings,
                   compute_capability: str, log: logging.Logger) -> Compiled:
    """Parse ``onnx`` and build a serialized engine with one optimization profile per
    entry of ``profiles`` and the engine stage's ``settings``, for ``compute_capability``
    (a ``ComputeCapability`` member name, ``"SM86"``); ``CompileRefused`` when the parser or
    the builder refuses."""
    from polygraphy.exception import PolygraphyException

    trt = tensorrt_module()
    captured = _CapturedErrors()
    with polygraphy_logging(log):
        logging.getLogger("Polygraphy").addHandler(captured)
        network_loader, create_config = engine_loaders(onnx, profiles, settings)
        started = time.perf_counter()
        try:
            builder, network, parser = network_loader()
        except PolygraphyException:
            raise _parser_refusal(trt, onnx, bool(settings.network_kwargs())) from None
        parse_seconds = time.perf_counter() - started
        inputs = tuple(
            NetworkInput(t.name, t.dtype.name, tuple(int(d) for d in t.shape))
            for t in (network.get_input(i) for i in range(network.num_inputs)))
        recording = _RecordingBuilder(builder)
        try:
            config = create_config(recording, network)
        except PolygraphyException as e:
            raise CompileRefused("profile", _builder_words(captured.messages) or str(e)) from None
        config.num_compute_capabilities = 1
        if not config.set_compute_capability(getattr(trt.ComputeCapability, compute_capability),
                                             0):
            raise CompileRefused("build", f"the builder refused compute capability "
                                          f"{compute_capability}")
        captured.messages.clear()
        started = time.perf_counter()
        serialized = builder.build_serialized_network(network, config)
        build_seconds = time.perf_counter() - started
        del parser
    if serialized is None:
        raise CompileRefused("build", _builder_words(captured.messages)
                             or "build_serialized_network returned no engine")
    with memoryview(serialized) as plan:
        digest = hashlib.sha256(plan).hexdigest()
        size = plan.nbytes
    return Compiled(
        builder_version=str(trt.__version__), inputs=inputs,
        profiles=_read_profiles(recording.profiles, inputs),
        compute_capabilities=tuple(
            str(config.get_compute_capability(i).name)
            for i in range(config.num_compute_capabilities)),
        engine_bytes=size, engine_sha256=digest,
        parse_seconds=parse_seconds, build_seconds=build_seconds)
