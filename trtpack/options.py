"""What one build is asked to do, resolved and validated: ``BuildOptions`` (``api`` makes it,
the pipeline and every stage read it)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from trtpack.machine.targets import Target
from trtpack.shapes import ShapeProfile
from trtpack.sources.recipe import Recipe

Serve = Literal["tensor", "text"]
Fallback = Literal["auto", "off"]


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("TRTPACK_CACHE_DIR", str(Path(base) / "trtpack")))


@dataclass(frozen=True)
class BuildOptions:
    """Everything one build needs, resolved and validated (``api.resolve_options`` makes it)."""

    recipe: Recipe
    profiles: tuple[ShapeProfile, ...]
    precision: str
    target: Target
    out_dir: Path
    opset: int
    random_weights: bool = False
    build_engine: bool = True
    calibration: Path | None = None
    fallback: Fallback = "auto"
    serve: Serve = "tensor"
    fallback_cpu: bool = False
    cache_dir: Path = field(default_factory=default_cache_dir)
    use_cache: bool = True
    seed: int = 0
    timing_cache: Path | None = None  # --timing-cache DIR: a TensorRT timing-cache folder to share
    calibration_method: str | None = None  # None: the recipe's int8.calibration_method
    min_int8_share: float = 0.5  # INT8 ships only when this share of MatMul/Gemm stays INT8
    force: bool = False  # --force: build into an --out that holds files trtpack did not write
    # --precision auto (CPU): built as int8, then the CPU model stage times the FP32 and INT8
    # forms and serves the fastest that passes (trtpack.precision.cpu.auto_choice)
    auto_precision: bool = False
    sample_inputs: Path | None = None  # --sample-inputs FILE.npz: real inputs for verification
    # a PyTorch source's identity: its files' contents (``sources.torch_sources.SourceFiles``)
    source_files: str | None = None

    @property
    def name(self) -> str:
        return self.recipe.name
