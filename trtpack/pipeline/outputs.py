"""What a build writes beside its stages' folders: the artifact records of report.json (with
sha256), ``recipe.yaml`` (the recipe as built) and ``report.html``."""

from __future__ import annotations

from pathlib import Path

from trtpack.onnx_tools.files import data_path
from trtpack.report import REPORT, Artifact, BuildReport
from trtpack.sources.recipe import Recipe
from trtpack.stages.artifacts import Artifacts


def artifact_records(artifacts: Artifacts, stage_dir: Path, root: Path
                     ) -> list[Artifact]:
    """Artifacts of this stage (files only; a folder lists its files), with sha256. A file
    that two artifact names point at (the CPU model's ``cpu_onnx`` is its ``cpu_fp32_onnx``
    when FP32 is served) is listed once, under the first name."""
    records: list[Artifact] = []
    listed: set[Path] = set()

    def add(label: str, f: Path) -> None:
        if f not in listed:
            listed.add(f)
            records.append(Artifact.of(label, f, root))

    for name, path in artifacts.named().items():
        if not path.is_relative_to(stage_dir):
            continue
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            label = name if f == path else f"{name}/{f.relative_to(path)}"
            add(label, f)
            # data files next to an ONNX model are listed with it
            data = data_path(f)
            if f.suffix == ".onnx" and data.is_file() and data not in files:
                add(f"{label}.data", data)
    return records


def write_recipe(path: Path, recipe: Recipe) -> None:
    """The recipe the build used, overrides applied (``trtpack bench`` loads the model
    from it)."""
    import yaml

    path.write_text("# the recipe of this build, every default and --set applied\n"
                    + yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False),
                    encoding="utf-8")


def write_report_page(out: Path, report: BuildReport) -> None:
    """``OUT/report.html``; a page that cannot be drawn never fails the build (the reason
    goes into the report's warnings)."""
    from trtpack.report_page.html import write_report_html

    try:
        write_report_html(out, report)
    except Exception as e:  # matplotlib missing or a chart it cannot draw
        report.warnings.append(f"report.html not written: {type(e).__name__}: {e}")
        report.save(out / REPORT)
