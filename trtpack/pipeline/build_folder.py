"""A ``trtpack build`` output folder: what a build writes beside its stages' folders (the
artifact records of report.json with sha256, ``recipe.yaml``, ``report.html``), and a
finished one as ``trtpack bench`` and ``trtpack report`` read it back (its report, the
served model, the FP32 ONNX and the recorded inputs). The folder's names, which of its files
are trtpack's and putting a build at OUT are ``trtpack.out_files``'."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtpack.engine.provenance import PLAN_FILENAME
from trtpack.errors import UserInputError
from trtpack.json_values import json_list, json_object, json_text
from trtpack.machine.targets import is_gpu_target
from trtpack.onnx_tools.files import data_path
from trtpack.out_files import RECIPE_FILE, REPOSITORY
from trtpack.report import REPORT, Artifact, BuildReport, StageResult
from trtpack.serving.config import ONNX_FILENAME
from trtpack.serving.layout import VERSION
from trtpack.sources.recipe import Recipe
from trtpack.stages.artifacts import Artifacts
from trtpack.stages.package import SERVED

PACKAGE_STAGE = "package"


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


def write_recipe(path: Path, recipe: Recipe, sample_inputs: Path | None = None) -> None:
    """The recipe the build used, overrides applied (``trtpack bench`` loads the model
    from it); a comment names the ``--sample-inputs`` file it was verified on."""
    import yaml

    samples = f"# verified on the samples of --sample-inputs {sample_inputs}\n" \
        if sample_inputs is not None else ""
    path.write_text("# the recipe of this build, every default and --set applied\n" + samples
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


@dataclass(frozen=True)
class BuildFolder:
    """What bench needs from ``trtpack build``'s output folder."""

    root: Path
    report: BuildReport
    served_model: Path  # model.onnx or model.plan in the repository
    fp32_onnx: Path
    reference: Path  # the recorded inputs (the export's, or the import's for an ONNX MODEL)
    # the FP32 graph fused for ONNX Runtime on the CPU (trtpack.stages.cpu_model), when built
    cpu_fp32_onnx: Path | None = None

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
    artifacts = recorded_artifacts(report, out)
    fp32_onnx, reference = artifacts.onnx, artifacts.reference
    missing = [] if fp32_onnx is not None and fp32_onnx.is_file() else ["the FP32 ONNX"]
    if reference is None or not reference.is_file():
        missing.append("the recorded inputs (reference.npz)")
    served = served_model_file(report, out)
    if served is None or not served.is_file():
        missing.append(f"{REPOSITORY}/{report.model}/{VERSION}/{ONNX_FILENAME} or {PLAN_FILENAME}")
    if missing:
        raise UserInputError(f"'{out}' is not a complete trtpack build: missing "
                             + ", ".join(missing))
    assert served is not None and fp32_onnx is not None and reference is not None
    cpu = artifacts.cpu_fp32_onnx
    return BuildFolder(out, report, served, fp32_onnx, reference,
                       cpu if cpu is not None and cpu.is_file() else None)


def served_model_file(report: BuildReport, root: Path, role: str = "model") -> Path | None:
    """The file the build at ``root`` serves in ``role`` (``model``, or ``cpu_fallback``) as
    its package stage recorded it in report.json (``stages.package.served_records``); None
    when it served none. A report written before that record: the model's file derived once
    from the recorded artifacts (``Artifacts.served_model``)."""
    package = report.stage(PACKAGE_STAGE)
    if package is not None and SERVED in package.metrics:
        where = f"stages.package.{SERVED}"
        for i, value in enumerate(json_list(package.metrics[SERVED], where)):
            entry = json_object(value, f"{where}[{i}]")
            if entry.get("role") == role:
                return root / json_text(entry.get("file"), f"{where}[{i}].file")
        return None
    artifacts = recorded_artifacts(report, root)
    if package is None or role != "model" or artifacts.onnx is None:
        return None
    model = artifacts.served_model(gpu=is_gpu_target(report.target))
    return root / REPOSITORY / report.model / VERSION / (
        PLAN_FILENAME if model.suffix == ".plan" else ONNX_FILENAME)


def recorded_artifacts(report: BuildReport, root: Path) -> Artifacts:
    """The artifacts the stages of the build at ``root`` handed on, from its report."""
    artifacts = Artifacts()
    for result in report.stages:
        artifacts = artifacts.merged(stage_artifacts(result, root))
    return artifacts


def stage_artifacts(result: StageResult, root: Path) -> Artifacts:
    """The artifacts one stage handed on, from its report's records (a folder's files are
    recorded as ``name/relative path``, an ONNX's weights as ``name.data`` beside it)."""
    names = {a.name for a in result.artifacts}
    paths: dict[str, Path] = {}
    for record in result.artifacts:
        if record.name.endswith(".data") and record.name.removesuffix(".data") in names:
            continue  # the weights beside an ONNX: the ONNX's name stands for both
        name, _, inside = record.name.partition("/")
        path = root / record.path
        paths[name] = Path(str(path).removesuffix("/" + inside)) if inside else path
    return Artifacts.from_named(paths)


def load_build_recipe(build: BuildFolder) -> Recipe:
    """The recipe the build used (``recipe.yaml``, written with its overrides applied)."""
    return load_recipe_of(build.root, build.report.model)


def load_recipe_of(root: Path, model: str) -> Recipe:
    """The recipe of the build folder ``root`` (``recipe.yaml``), else ``model``'s."""
    import yaml

    from trtpack.sources.resolve import resolve_model

    if (root / RECIPE_FILE).is_file():
        return Recipe.model_validate(yaml.safe_load((root / RECIPE_FILE).read_text()))
    return resolve_model(model)  # a build from before recipe.yaml was written
