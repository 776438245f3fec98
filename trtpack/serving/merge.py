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
folder and the mismatch, raised before anything is written. An engine built with hardware
compatibility ``none`` is meant for its own GPU model, so two GPU models of one compute
capability (g6's L4, g6e's L40S) need two repositories, unless both engines were built with
``same_compute_capability``: then the first serves both and the other is left out (a
warning). ``config.pbtxt`` says, in comments, which GPUs each engine is meant for. Nothing
here runs an engine: the merge handles files and configs.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trtpack.engine.provenance import provenance_path
from trtpack.errors import UserInputError
from trtpack.machine.targets import engine_serves
from trtpack.onnx_tools.files import link_or_copy
from trtpack.out_files import ARTIFACTS, REPOSITORY, made_in_place_of
from trtpack.report import JsonObject
from trtpack.serving.config import CONFIG_FILE, check_config, read_config, write_config
from trtpack.serving.engine_builds import (
    EngineBuild,
    build_error,
    check_compatible,
    engines_to_file,
    model_names,
    read_engine_build,
    tree_files,
)
from trtpack.serving.layout import VERSION

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig


MERGE_REPORT = "merge.json"
CPU_SUFFIX = "_cpu"
def engine_filename(compute_capability: tuple[int, int]) -> str:
    """``(8, 6)`` -> ``model.sm86.plan``."""
    return f"model.sm{compute_capability[0]}{compute_capability[1]}.plan"


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


def merged_config(builds: Sequence[EngineBuild]) -> ModelConfig:
    """The first build's engine config with one ``cc_model_filenames`` entry per engine, in
    Triton's schema. ``default_model_filename`` is cleared: Triton then looks for
    ``model.plan``, which is absent, so a GPU family without an engine fails to load
    instead of loading an engine built for another GPU."""
    config = type(builds[0].config)()
    config.CopyFrom(builds[0].config)
    config.ClearField("default_model_filename")
    for build in sorted(builds, key=lambda b: b.served_cc):
        config.cc_model_filenames[build.cc_key] = engine_filename(build.served_cc)
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
    builds, left_out = engines_to_file(builds)
    first = builds[0]
    name = first.name
    others = sorted(model_names(first) - {name})
    cpu_source: Path | None = None
    warnings: list[str] = list(left_out)
    if fallback_cpu and f"{name}{CPU_SUFFIX}" not in others:
        cpu_source = first.folder / ARTIFACTS / "simplify" / "model.onnx"
        if not cpu_source.is_file():
            raise build_error(first.folder, f"--fallback-cpu needs the FP32 ONNX {cpu_source.name} "
                                            "in artifacts/simplify/, which is missing")
        if any(m.endswith("_ensemble") for m in others):
            warnings.append(f"no {name}{CPU_SUFFIX}_ensemble: build with --fallback-cpu to "
                            "get a text ensemble over the CPU model")
    config = merged_config(builds)

    tmp = out.with_name(f".{out.name}.merging")
    if tmp.exists():
        shutil.rmtree(tmp)
    with made_in_place_of(tmp, out):  # out is empty or absent (checked above)
        repo = tmp / REPOSITORY
        version_dir = repo / name / VERSION
        version_dir.mkdir(parents=True)
        engines: dict[str, str] = {}
        for build in builds:
            filename = engine_filename(build.served_cc)
            link_or_copy(build.plan, version_dir / filename)
            link_or_copy(provenance_path(build.plan), version_dir / f"{filename}.json")
            engines[build.cc_key] = filename
        write_config(repo / name / CONFIG_FILE, config, notes=[
            f"{engine_filename(b.served_cc)} is meant for "
            + engine_serves(b.provenance.hardware_compatibility, b.provenance.gpu_name,
                            b.served_cc) for b in sorted(builds, key=lambda b: b.served_cc)])
        read_config(repo / name / CONFIG_FILE)  # parses back with Triton's schema
        for model in others:
            for rel in tree_files(first.folder / REPOSITORY / model):
                link_or_copy(first.folder / REPOSITORY / model / rel, repo / model / rel)
        models = [name, *others]
        if cpu_source is not None:
            models.append(_write_cpu_model(repo, name, cpu_source, first))
        result = MergeResult(out, name, engines, {b.cc_key: b.target for b in builds},
                             sorted(models), warnings)
        (tmp / MERGE_REPORT).write_text(json.dumps(_merge_record(result, builds), indent=2)
                                        + "\n", encoding="utf-8")
    return result


def _write_cpu_model(repo: Path, name: str, onnx: Path, build: EngineBuild) -> str:
    """``<name>_cpu``: the FP32 ONNX on ONNX Runtime with CPU instances, its config from the
    ONNX's real I/O and the engine config's batching and instance settings."""
    from trtpack.model_io import model_io_from_onnx
    from trtpack.serving.config import onnx_model_config
    from trtpack.serving.layout import copy_onnx
    from trtpack.shapes import ShapeProfile
    from trtpack.sources.recipe import TritonSettings

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
    write_config(repo / cpu_name / CONFIG_FILE, config)
    return cpu_name


def _merge_record(result: MergeResult, builds: Sequence[EngineBuild]) -> JsonObject:
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
        } for b in sorted(builds, key=lambda b: b.served_cc)],
        "onnx_sha256": builds[0].provenance.onnx_sha256,
        "precision": builds[0].provenance.precision,
        "warnings": result.warnings,
    }
