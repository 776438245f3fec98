"""A finished ``trtpack build`` output folder, as ``trtpack bench`` and ``trtpack report``
read it: its report, the served model, the FP32 ONNX and the recorded inputs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtpack.errors import UserInputError
from trtpack.pipeline.outputs import RECIPE_FILE
from trtpack.report import REPORT, BuildReport
from trtpack.serving.layout import REPOSITORY

# the recorded inputs: the export stage's, or the import stage's for an ONNX file given as MODEL
REFERENCES = (Path("artifacts") / "export" / "reference.npz",
              Path("artifacts") / "import" / "reference.npz")
FP32_ONNX = Path("artifacts") / "simplify" / "model.onnx"
# the FP32 graph fused for ONNX Runtime on the CPU (trtpack.stages.cpu_model), when built
CPU_FP32_ONNX = Path("artifacts") / "cpu_model" / "fp32" / "model.onnx"


@dataclass(frozen=True)
class BuildFolder:
    """What bench needs from ``trtpack build``'s output folder."""

    root: Path
    report: BuildReport
    served_model: Path  # model.onnx or model.plan in the repository
    fp32_onnx: Path
    reference: Path

    @property
    def cpu_fp32_onnx(self) -> Path | None:
        path = self.root / CPU_FP32_ONNX
        return path if path.is_file() else None

    @property
    def is_engine(self) -> bool:
        return self.served_model.suffix == ".plan"

    @property
    def recipe_path(self) -> Path:
        return self.root / RECIPE_FILE


def load_build_report(out: Path) -> BuildReport:
    """The report of the trtpack build folder ``out`` (finished or not);
    ``UserInputError`` (exit 2) when ``out`` is not one."""
    report_path = out / REPORT
    if not report_path.is_file():
        raise UserInputError(f"'{out}' is not a trtpack build folder: it has no {REPORT}")
    try:
        return BuildReport.load(report_path)
    except (ValueError, TypeError, KeyError) as e:
        raise UserInputError(f"'{report_path}' is not a trtpack report ({e})") from None


def open_build(out: Path) -> BuildFolder:
    """Check that ``out`` is a finished trtpack build; ``UserInputError`` (exit 2) if not."""
    if not out.is_dir():
        raise UserInputError(f"'{out}' is not a folder (give the --out of a trtpack build)")
    report = load_build_report(out)
    if report.status != "ok":
        raise UserInputError(f"'{out}' is a build that did not finish ({report.status})")
    reference = next((out / p for p in REFERENCES if (out / p).is_file()), None)
    missing = [str(p) for p in (FP32_ONNX,) if not (out / p).is_file()]
    if reference is None:
        missing.append(f"{REFERENCES[0]} (or {REFERENCES[1]})")
    repo = out / REPOSITORY / report.model / "1"
    served = next((repo / f for f in ("model.plan", "model.onnx") if (repo / f).is_file()), None)
    if served is None:
        missing.append(f"{REPOSITORY}/{report.model}/1/model.onnx or model.plan")
    if missing:
        raise UserInputError(f"'{out}' is not a complete trtpack build: missing "
                             + ", ".join(missing))
    assert served is not None and reference is not None
    return BuildFolder(out, report, served, out / FP32_ONNX, reference)


def load_build_recipe(build: BuildFolder) -> Any:
    """The recipe the build used (``recipe.yaml``, written with its overrides applied)."""
    return load_recipe_of(build.root, build.report.model)


def load_recipe_of(root: Path, model: str) -> Any:
    """The recipe of the build folder ``root`` (``recipe.yaml``), else ``model``'s."""
    import yaml

    from trtpack.sources.recipe import Recipe
    from trtpack.sources.resolve import resolve_model

    if (root / RECIPE_FILE).is_file():
        return Recipe.model_validate(yaml.safe_load((root / RECIPE_FILE).read_text()))
    return resolve_model(model)  # a build from before recipe.yaml was written
