"""Which ONNX opsets each TensorRT's ONNX parser reads, as NVIDIA states it, and the check of
trtpack's pinned opset against the TensorRT versions it supports.

onnx-tensorrt's ``docs/operators.md`` opens with "TensorRT <version> supports operators in
the inclusive range of opset 9 to opset <N>"; the rows below are the ones read, each with
where. A version between two rows is held to the older row's N (a lower bound: the range
has only grown from release to release in that file's history).
"""

from __future__ import annotations

from dataclasses import dataclass

from trtpack.machine.packages import MIN_TENSORRT, parse_version


@dataclass(frozen=True)
class ParserOpsets:
    tensorrt: tuple[int, int]
    max_opset: int
    source: str


PARSER_OPSETS: tuple[ParserOpsets, ...] = (
    ParserOpsets((10, 0), 20, "onnx/onnx-tensorrt docs/operators.md at eb43908 (10.0 GA) and "
                              "96e7811 (10.1 GA): 'TensorRT 10.0 supports operators in the "
                              "inclusive range of opset 9 to opset 20'"),
    ParserOpsets((10, 15), 24, "onnx/onnx-tensorrt docs/operators.md of the 10.15 GA release "
                               "(2026-02-02): 'TensorRT 10.15 supports operators in the "
                               "inclusive range of opset 9 to opset 24'"),
    ParserOpsets((11, 5), 25, "TensorRT 11.5 release notes (2026-11-18): the ONNX parser "
                              "reads opset 25 / ONNX 1.22"),
)
"""Oldest first; one home for these facts."""


def max_parsed_opset(tensorrt_version: str | tuple[int, ...]) -> int | None:
    """The highest opset TensorRT ``tensorrt_version``'s parser is known to read (the row of
    the newest listed version not newer than it), or None when it is older than every row."""
    version = parse_version(tensorrt_version) if isinstance(tensorrt_version, str) \
        else tuple(tensorrt_version)
    known = [row for row in PARSER_OPSETS if row.tensorrt <= version[:2]]
    return known[-1].max_opset if known else None


def opset_warning(opset: int, tensorrt_version: str | None) -> str | None:
    """A warning when ``opset`` is above what the TensorRT that will parse it (the installed
    one, else the oldest trtpack supports) is known to read, or None."""
    version = tensorrt_version or ".".join(str(v) for v in MIN_TENSORRT)
    limit = max_parsed_opset(version)
    if limit is None or opset <= limit:
        return None
    which = f"TensorRT {version}" if tensorrt_version else \
        f"TensorRT {version} (the oldest trtpack supports)"
    return (f"--opset {opset}: {which} is known to parse ONNX opsets up to {limit} "
            "(onnx-tensorrt's operator table); its parser may refuse this model: use --opset "
            f"{limit} or lower unless the engine's TensorRT is newer")
