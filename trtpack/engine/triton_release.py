"""Which Triton serves an engine: the TensorRT its server must have, the NGC Triton releases
known to ship it, and the ``--backend-config`` a version-compatible engine needs.

A plan deserializes only in the TensorRT version that built it, or (version-compatible
engines) a newer one of its major version, or 11.x for a 10.x engine. Triton's TensorRT
backend loads version-compatible engines only when the server starts with
``--backend-config=tensorrt,version-compatible=true`` (``tensorrt_backend``'s README, "The
``version-compatible`` flag ... The default value is false"). Provenance, the model
repository's README, ``SAGEMAKER.md`` and ``trtpack doctor`` say it from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

from trtpack.machine.packages import parse_version

VERSION_COMPATIBLE_BACKEND_CONFIG = "--backend-config=tensorrt,version-compatible=true"
"""The tritonserver flag without which Triton refuses a version-compatible engine."""

VERSION_COMPATIBLE_ACROSS_MAJORS = {(8, 10), (10, 11)}
"""Version-compatible engines run on newer runtimes of their major version, and across these
majors only (TensorRT 11 support matrix, "Engine Portability")."""

SUPPORT_MATRIX = "https://docs.nvidia.com/deeplearning/frameworks/support-matrix/index.html"
"""Where NVIDIA lists the TensorRT version of each NGC Triton release."""


@dataclass(frozen=True)
class TritonRelease:
    """An NGC Triton release (``nvcr.io/nvidia/tritonserver:<release>-py3``) and its TensorRT."""

    release: str  # "25.10"
    tensorrt: str  # the full version its release notes list
    source: str  # where this row was read

    @property
    def tag(self) -> str:
        return f"{self.release}-py3"

    @property
    def image(self) -> str:
        return f"nvcr.io/nvidia/tritonserver:{self.tag}"


TRITON_RELEASES: tuple[TritonRelease, ...] = ()
"""The one table of NGC Triton releases and the TensorRT each ships, oldest first: only rows
read from NVIDIA's release notes or Frameworks Support Matrix (``SUPPORT_MATRIX``), each
naming its source. Empty for now: the TensorRT of the ``-py3`` Triton images that ship
TensorRT 10.12 or newer (25.x, 26.x) could not be read from a primary source where this was
written: the search tools there showed only the openings of the release-notes pages
(``rel-25-xx.html``) and PDF, whose package list is lost, never their "Container Versions"
table;
Triton's own ``docs/introduction/compatibility.md`` lists TensorRT only for the
``-trtllm-python-py3`` images, built on another base (25.10 ``-trtllm``: CUDA 12.9.1,
TensorRT 10.11.0.33; the 25.10 release notes: "based on CUDA 13.0.2.006"); the server's
GitHub release notes only point at the support matrix ("Refer to the <yy.mm> column").
So no release is named rather than a guessed one; until rows are added, the engine's
TensorRT version is what to look up in the support matrix."""


@dataclass(frozen=True)
class ServerFeature:
    """A tritonserver capability an archive relies on, and the first NGC release with it."""

    what: str
    release: str  # the first NGC Triton release (<yy.mm>) that has it
    source: str  # where that was read


MODEL_NAMESPACING = ServerFeature(
    "`--model-namespacing` (one model name in several repositories)", "23.03",
    "https://github.com/triton-inference-server/server/releases/tag/v2.32.0")
"""Triton 2.32.0's release notes: "The same model name can be used across different
repositories if the --model-namespacing flag is set" (the flag of server PR #5362; PR #5540
only added it to the SageMaker entrypoint). 2.32.0 is NGC 23.03: Triton 2.30.0 is 23.01
(server README, r23.01) and one minor version ships each month."""

CACHE_CONFIG = ServerFeature(
    "`--cache-config` (the response cache as a cache library)", "23.03",
    "https://github.com/triton-inference-server/server/releases/tag/v2.32.0")
"""The same release notes: the response cache became the ``local_cache`` library and
``--cache-config`` "the preferred method of cache configuration moving forward"."""

SAGEMAKER_ADDITIONAL_ARGS = ServerFeature(
    "`SAGEMAKER_TRITON_ADDITIONAL_ARGS` (extra tritonserver flags on SageMaker)", "23.06",
    "https://github.com/aws/deep-learning-containers/issues/3299")
"""The SageMaker entrypoint (``docker/sagemaker/serve``) appends it to the tritonserver
command; "SM Triton v23.06 onwards enable the ``SAGEMAKER_TRITON_ADDITIONAL_ARGS``" (the
SageMaker Triton maintainer in that thread, 2023-09-06)."""

ERROR_ONLY_RESPONSE = ServerFeature(
    "a python_backend whose `InferenceResponse(error=...)` needs no output tensors", "23.07",
    "https://github.com/triton-inference-server/python_backend/pull/251")
"""python_backend PR #251 ("Remove the requirement to specify output_tensors when setting an
error", June 2023); 23.07 is the first release branched after it (23.06 may have it too:
not checked), so the floor named is 23.07."""


def minimum_release(features: Sequence[ServerFeature]) -> ServerFeature | None:
    """The feature that needs the newest release (that release is the floor), if any."""
    return max(features, key=lambda f: release_key(f.release), default=None)


def release_key(release: str) -> tuple[int, ...]:
    """``"25.10"`` -> (25, 10), for ordering releases."""
    return parse_version(release)


def tensorrt_loads(built: str, runtime: str, version_compatible: bool) -> bool:
    """Whether TensorRT ``runtime`` deserializes a plan TensorRT ``built`` made."""
    built_v, runtime_v = parse_version(built), parse_version(runtime)
    if not version_compatible:
        return runtime_v == built_v
    majors = (built_v[0] if built_v else 0, runtime_v[0] if runtime_v else 0)
    return runtime_v >= built_v and (majors[0] == majors[1]
                                     or majors in VERSION_COMPATIBLE_ACROSS_MAJORS)


class TritonServingRecord(TypedDict, total=False):
    """``TritonServing`` as an engine's provenance records it (empty in a file written
    before it was recorded)."""

    tensorrt_needed: str
    triton_release: str | None
    triton_image: str | None
    triton_releases: list[str]
    backend_config: list[str]
    summary: str


@dataclass(frozen=True)
class TritonServing:
    """What serves one engine in Triton."""

    tensorrt: str
    version_compatible: bool
    releases: tuple[TritonRelease, ...]  # the table's releases whose TensorRT loads it

    @property
    def backend_config(self) -> tuple[str, ...]:
        return (VERSION_COMPATIBLE_BACKEND_CONFIG,) if self.version_compatible else ()

    @property
    def minimum_release(self) -> TritonRelease | None:
        return self.releases[0] if self.releases else None

    @property
    def tensorrt_needed(self) -> str:
        if not self.version_compatible:
            return f"TensorRT {self.tensorrt} exactly"
        major = parse_version(self.tensorrt)[:1]
        newer = [f"{a[1]}.x" for a in sorted(VERSION_COMPATIBLE_ACROSS_MAJORS) if a[:1] == major]
        return f"TensorRT {self.tensorrt} or newer within {major[0] if major else '?'}.x" + \
            (f" (or {', '.join(newer)})" if newer else "")

    def release_text(self) -> str:
        """The oldest known release that loads the engine, or where to look one up."""
        first = self.minimum_release
        if first is None:
            return (f"no NGC Triton release in trtpack's table ships it; look up TensorRT "
                    f"{self.tensorrt} in NVIDIA's Frameworks Support Matrix ({SUPPORT_MATRIX})")
        later = ", or a later release" if self.version_compatible and \
            len(self.releases) > 1 else ""
        return f"{first.image} (TensorRT {first.tensorrt}){later}"

    def summary(self) -> str:
        """One line: the TensorRT, the release (or where to look) and the flags."""
        flags = f"; start it with {' '.join(self.backend_config)}" if self.backend_config \
            else ""
        return f"served by a Triton with {self.tensorrt_needed}: {self.release_text()}{flags}"

    def to_dict(self) -> TritonServingRecord:
        first = self.minimum_release
        return {
            "tensorrt_needed": self.tensorrt_needed,
            "triton_release": first.release if first else None,
            "triton_image": first.image if first else None,
            "triton_releases": [r.release for r in self.releases],
            "backend_config": list(self.backend_config),
            "summary": self.summary(),
        }


def triton_serving(tensorrt_version: str, version_compatible: bool,
                   table: Sequence[TritonRelease] | None = None) -> TritonServing:
    """The Triton releases of ``table`` (``TRITON_RELEASES`` when not given) that load an
    engine TensorRT ``tensorrt_version`` built, oldest first, and the flags it needs."""
    rows = TRITON_RELEASES if table is None else table
    releases = tuple(sorted((r for r in rows
                             if tensorrt_loads(tensorrt_version, r.tensorrt,
                                               version_compatible)),
                            key=lambda r: release_key(r.release)))
    return TritonServing(tensorrt_version, version_compatible, releases)
