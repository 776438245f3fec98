"""``trtpack merge``: one Triton model for a fleet of GPU families.

A TensorRT engine runs only on the GPU family (compute capability) it was built for, so a
fleet of g4dn (T4, 7.5), g5 (A10G, 8.6) and p4d (A100, 8.0) needs one engine per family.
Triton's ``cc_model_filenames`` maps a compute capability to a file of the version folder,
so one model directory can hold them all and each server loads the one for its GPU:

    OUT/
      merge.json                          the source folders, engines and their sha256
      model_repository/<name>/config.pbtxt    cc_model_filenames {"7.5": model.sm75.plan, ...}
      model_repository/<name>/1/model.sm75.plan (+ model.sm75.plan.json, its provenance)
      model_repository/<name>/1/model.sm86.plan ...
      model_repository/<name>_tokenizer/ ...   the other models of the builds (--serve text
                                               ensembles, <name>_cpu), which call <name>
                                               by name and so keep working

Each BUILD_DIR is the ``--out`` of ``trtpack build`` for one GPU target. The builds must be
of the same ONNX (sha256), precision, profiles, engine I/O, TensorRT version and Triton
settings, one per compute capability; anything else is a ``UserInputError`` naming the
folder and the mismatch, raised before anything is written. Nothing here runs an engine:
the merge handles files and configs.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtpack.engine.provenance import EngineProvenance, provenance_path
from trtpack.engine.triton_config import PLATFORM
from trtpack.errors import UserInputError
from trtpack.onnx_files import link_or_copy
from trtpack.report import REPORT
from trtpack.serving.config import check_config, config_text, read_config, write_config
from trtpack.serving.repository import REPOSITORY, VERSION

MERGE_REPORT = "merge.json"
CPU_SUFFIX = "_cpu"
SAME_FIELDS = ("onnx_sha256", "onnx_data_sha256", "precision", "profiles", "inputs", "outputs",
               "tensorrt_version")
"""Provenance fields every merged engine must share (see ``VARIES_BETWEEN_BUILDS`` for the
ones that may differ)."""


def engine_filename(compute_capability: tuple[int, int]) -> str:
    """``(8, 6)`` -> ``model.sm86.plan``."""
    return f"model.sm{compute_capability[0]}{compute_capability[1]}.plan"


@dataclass(frozen=True)
class EngineBuild:
    """One build folder with its engine model, checked."""

    folder: Path
    name: str
    target: str
    model_dir: Path  # model_repository/<name>
    plan: Path
    provenance: EngineProvenance
    config: Any  # the engine model's ModelConfig

    @property
    def cc_key(self) -> str:
        major, minor = self.provenance.cc
        return f"{major}.{minor}"


@dataclass
class MergeResult:
    out_dir: Path
    name: str
    engines: dict[str, str]  # compute capability ("8.6") -> file in the version folder
    targets: dict[str, str]  # compute capability -> target of the build
    models: list[str]  # every model of the merged repository
    warnings: list[str] = field(default_factory=list)

    @property
    def repository(self) -> Path:
        return self.out_dir / REPOSITORY


def _fail(folder: Path, problem: str) -> UserInputError:
    return UserInputError(f"{folder}: {problem}")


def read_engine_build(folder: Path) -> EngineBuild:
    """A build folder and its TensorRT model, or a ``UserInputError`` saying what it lacks."""
    if not folder.is_dir():
        raise _fail(folder, "is not a folder")
    report_path = folder / REPORT
    if not report_path.is_file():
        raise _fail(folder, f"is not a trtpack build folder (no {REPORT})")
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
        name, target = str(report["model"]), str(report["target"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise _fail(folder, f"{REPORT} is not a trtpack build report ({e})") from None
    if target == "cpu":
        raise _fail(folder, "is a CPU-only build (--target cpu): it has no TensorRT engine")
    model_dir = folder / REPOSITORY / name
    if not (model_dir / "config.pbtxt").is_file():
        raise _fail(folder, f"has no {REPOSITORY}/{name}/config.pbtxt")
    config = read_config(model_dir / "config.pbtxt")
    if config.platform != PLATFORM:
        raise _fail(folder, f"model '{name}' is served by {config.platform or config.backend}, "
                            "not a TensorRT engine (a --no-engine build?)")
    plan = model_dir / VERSION / (config.default_model_filename or "model.plan")
    if not plan.is_file():
        raise _fail(folder, f"has no engine {plan.relative_to(folder)}")
    prov_file = provenance_path(plan)
    if not prov_file.is_file():
        raise _fail(folder, f"{prov_file.relative_to(folder)} is missing: where the engine "
                            "was built, and for which GPU, is unknown")
    try:
        prov = EngineProvenance.load(prov_file)
        prov.cc  # noqa: B018  (parses the compute capability)
        prov.model_io()
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise _fail(folder, f"{prov_file.relative_to(folder)} is not a valid trtpack "
                            f"provenance file ({type(e).__name__}: {e})") from None
    return EngineBuild(folder, name, target, model_dir, plan, prov, config)


def _model_names(build: EngineBuild) -> set[str]:
    repo = build.folder / REPOSITORY
    return {p.name for p in repo.iterdir() if (p / "config.pbtxt").is_file()}


def _tree_files(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root``."""
    from trtpack.onnx_files import sha256_file

    return {str(p.relative_to(root)): sha256_file(p)
            for p in sorted(root.rglob("*")) if p.is_file()}


def check_compatible(builds: Sequence[EngineBuild]) -> None:
    """Every build against the first: same model, ONNX, precision, profiles, I/O, TensorRT,
    Triton config and other models; one engine per compute capability."""
    first = builds[0]
    seen: dict[str, Path] = {}
    for build in builds:
        if build.cc_key in seen:
            raise _fail(build.folder, f"has an engine for compute capability {build.cc_key} "
                                      f"({build.provenance.gpu_name}), as {seen[build.cc_key]} "
                                      "does: one engine per GPU family")
        seen[build.cc_key] = build.folder
        if build is first:
            continue
        if build.name != first.name:
            raise _fail(build.folder, f"is model '{build.name}', {first.folder} is "
                                      f"'{first.name}'")
        for name in SAME_FIELDS:
            mine, theirs = getattr(build.provenance, name), getattr(first.provenance, name)
            if mine != theirs:
                label = name.replace("_", " ")
                verb = "differ" if label.endswith("s") else "differs"
                raise _fail(build.folder, f"{label} {verb} from {first.folder}: "
                                          f"{_short(mine)} vs {_short(theirs)}")
        ours, reference = _comparable_config(build.config), _comparable_config(first.config)
        if ours != reference:
            raise _fail(build.folder, f"its Triton config of '{build.name}' differs from "
                                      f"{first.folder}'s (other triton: settings?)")
        others = _model_names(build) - {build.name}
        if others != _model_names(first) - {first.name}:
            raise _fail(build.folder, f"serves the models {sorted(others)}, {first.folder} "
                                      f"serves {sorted(_model_names(first) - {first.name})} "
                                      "(--serve / --fallback-cpu differ?)")
        for model in sorted(others):
            if _tree_files(build.folder / REPOSITORY / model) != \
                    _tree_files(first.folder / REPOSITORY / model):
                raise _fail(build.folder, f"its model '{model}' differs from {first.folder}'s")


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


def _comparable_config(config: Any) -> str:
    copy = type(config)()
    copy.CopyFrom(config)
    copy.ClearField("default_model_filename")
    copy.ClearField("cc_model_filenames")
    return config_text(copy)


def merged_config(builds: Sequence[EngineBuild]) -> Any:
    """The first build's engine config with one ``cc_model_filenames`` entry per engine, in
    Triton's schema. ``default_model_filename`` is cleared: Triton then looks for
    ``model.plan``, which is absent, so a GPU family without an engine fails to load
    instead of loading an engine built for another GPU."""
    config = type(builds[0].config)()
    config.CopyFrom(builds[0].config)
    config.ClearField("default_model_filename")
    for build in sorted(builds, key=lambda b: b.provenance.cc):
        config.cc_model_filenames[build.cc_key] = engine_filename(build.provenance.cc)
    problems = check_config(config, builds[0].provenance.model_io())
    if problems:  # the builds' configs agreed with their engines: a bug, not user input
        raise RuntimeError("merged config does not match the engines: " + "; ".join(problems))
    return config


def _check_out(out: Path, builds_dirs: Sequence[Path]) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserInputError(f"--out {out} exists and is not empty")
    for folder in builds_dirs:
        if out.resolve() == folder.resolve() or out.resolve().is_relative_to(folder.resolve()):
            raise UserInputError(f"--out {out} is inside the build folder {folder}")


def merge_builds(build_dirs: Sequence[Path], out: Path,
                 fallback_cpu: bool = False) -> MergeResult:
    """Merge the engine builds in ``build_dirs`` into one model repository under ``out``
    (new or empty). Everything is checked before anything is written; the result is built
    under a temporary name and renamed into place."""
    if len(build_dirs) < 2:
        got = "no build folder" if not build_dirs else f"one build folder ({build_dirs[0]})"
        raise UserInputError(f"merge needs the build folders of two or more GPU targets; got "
                             f"{got}")
    _check_out(out, build_dirs)
    builds = [read_engine_build(Path(d)) for d in build_dirs]
    check_compatible(builds)
    first = builds[0]
    name = first.name
    others = sorted(_model_names(first) - {name})
    cpu_source: Path | None = None
    warnings: list[str] = []
    if fallback_cpu and f"{name}{CPU_SUFFIX}" not in others:
        cpu_source = first.folder / "artifacts" / "simplify" / "model.onnx"
        if not cpu_source.is_file():
            raise _fail(first.folder, f"--fallback-cpu needs the FP32 ONNX {cpu_source.name} "
                                      "in artifacts/simplify/, which is missing")
        if any(m.endswith("_ensemble") for m in others):
            warnings.append(f"no {name}{CPU_SUFFIX}_ensemble: build with --fallback-cpu to "
                            "get a text ensemble over the CPU model")
    config = merged_config(builds)

    tmp = out.with_name(f".{out.name}.merging")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        repo = tmp / REPOSITORY
        version_dir = repo / name / VERSION
        version_dir.mkdir(parents=True)
        engines: dict[str, str] = {}
        for build in builds:
            filename = engine_filename(build.provenance.cc)
            link_or_copy(build.plan, version_dir / filename)
            link_or_copy(provenance_path(build.plan), version_dir / f"{filename}.json")
            engines[build.cc_key] = filename
        write_config(repo / name / "config.pbtxt", config)
        read_config(repo / name / "config.pbtxt")  # parses back with Triton's schema
        for model in others:
            for rel in _tree_files(first.folder / REPOSITORY / model):
                link_or_copy(first.folder / REPOSITORY / model / rel, repo / model / rel)
        models = [name, *others]
        if cpu_source is not None:
            models.append(_write_cpu_model(repo, name, cpu_source, first))
        result = MergeResult(out, name, engines, {b.cc_key: b.target for b in builds},
                             sorted(models), warnings)
        (tmp / MERGE_REPORT).write_text(json.dumps(_merge_record(result, builds), indent=2)
                                        + "\n", encoding="utf-8")
        if out.exists():
            out.rmdir()  # empty (checked above)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result


def _write_cpu_model(repo: Path, name: str, onnx: Path, build: EngineBuild) -> str:
    """``<name>_cpu``: the FP32 ONNX on ONNX Runtime with CPU instances, its config from the
    ONNX's real I/O and the engine config's batching and instance settings."""
    from trtpack.recipe import TritonSettings
    from trtpack.serving.config import model_io_from_onnx
    from trtpack.serving.repository import copy_onnx, onnx_model_config
    from trtpack.shapes import ShapeProfile

    cpu_name = f"{name}{CPU_SUFFIX}"
    io = model_io_from_onnx(onnx)
    profiles = [ShapeProfile.from_dict(p) for p in build.provenance.profiles]
    engine = build.config
    settings = TritonSettings(
        instance_count=engine.instance_group[0].count if engine.instance_group else 1,
        max_queue_delay_us=engine.dynamic_batching.max_queue_delay_microseconds,
        warmup=len(engine.model_warmup) > 0,
    )
    config = onnx_model_config(cpu_name, io, profiles, settings, "KIND_CPU")
    problems = check_config(config, io)
    if problems:
        raise RuntimeError(f"{cpu_name} config does not match its ONNX: " + "; ".join(problems))
    copy_onnx(onnx, repo / cpu_name / VERSION)
    write_config(repo / cpu_name / "config.pbtxt", config)
    return cpu_name


def _merge_record(result: MergeResult, builds: Sequence[EngineBuild]) -> dict[str, Any]:
    from trtpack import __version__

    return {
        "trtpack_version": __version__,
        "model": result.name,
        "models": result.models,
        "engines": [{
            "compute_capability": b.cc_key, "file": result.engines[b.cc_key],
            "target": b.target, "gpu": b.provenance.gpu_name,
            "tensorrt_version": b.provenance.tensorrt_version,
            "plan_sha256": b.provenance.plan_sha256, "source": str(b.folder.resolve()),
        } for b in sorted(builds, key=lambda b: b.provenance.cc)],
        "onnx_sha256": builds[0].provenance.onnx_sha256,
        "precision": builds[0].provenance.precision,
        "warnings": result.warnings,
    }
