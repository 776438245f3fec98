"""The engine builds ``trtpack merge`` takes: one build folder read and checked
(``read_engine_build``), and builds checked against each other (``check_compatible``).
Every problem is a ``UserInputError`` naming the folder and the mismatch."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trtpack.engine.provenance import PLAN_FILENAME, EngineProvenance, provenance_path
from trtpack.errors import UserInputError
from trtpack.machine.targets import is_gpu_target, resolve_target
from trtpack.onnx_tools.files import sha256_file
from trtpack.out_files import REPOSITORY
from trtpack.report import REPORT, JsonValue
from trtpack.serving.config import CONFIG_FILE, ENGINE_PLATFORM, config_text, read_config
from trtpack.serving.layout import VERSION

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig


SAME_FIELDS = ("onnx_sha256", "onnx_data_sha256", "precision", "profiles", "inputs", "outputs",
               "tensorrt_version")
"""Provenance fields every merged engine must share (see ``VARIES_BETWEEN_BUILDS`` for the
ones that may differ)."""


@dataclass(frozen=True)
class EngineBuild:
    """One build folder with its engine model, checked."""

    folder: Path
    name: str
    target: str
    model_dir: Path  # model_repository/<name>
    plan: Path
    provenance: EngineProvenance
    config: ModelConfig  # the engine model's ModelConfig

    @property
    def served_cc(self) -> tuple[int, int]:
        """The compute capability this engine is filed under in ``cc_model_filenames``."""
        return served_compute_capability(self.provenance)

    @property
    def cc_key(self) -> str:
        major, minor = self.served_cc
        return f"{major}.{minor}"


def served_compute_capability(prov: EngineProvenance) -> tuple[int, int]:
    """The GPU family an engine was built *for*: the building GPU's compute capability, but
    for an ``ampere+`` (hardware-compatible) engine, which any Ampere-or-newer GPU may build,
    the compute capability of its target (an A10G engine built on an A100 serves 8.6)."""
    if prov.hardware_compatibility == "ampere+":
        target = target_compute_capability(prov.target)
        if target is not None:
            return target
    return prov.cc


def target_compute_capability(target: str) -> tuple[int, int] | None:
    """A target's compute capability: from the family table, or ``smXY`` (a local GPU
    outside it); None when neither."""
    try:
        gpu = resolve_target(target).gpu
    except UserInputError:
        gpu = None
    if gpu is not None:
        return gpu.compute_capability
    digits = target.removeprefix("sm")
    if target.startswith("sm") and digits.isdigit() and len(digits) >= 2:
        return int(digits[:-1]), int(digits[-1])
    return None


def one_engine_per_compute_capability(keyed: Sequence[tuple[str, str]]) -> list[str]:
    """The rule ``merge`` applies: Triton's ``cc_model_filenames`` maps a compute capability
    to one file, so two engines for one compute capability cannot be merged. ``keyed`` is
    (compute capability "8.6", who) pairs; returns one problem per clash (empty: mergeable)."""
    seen: dict[str, str] = {}
    problems = []
    for cc, who in keyed:
        if cc in seen:
            problems.append(
                f"{who} has an engine for compute capability {cc}, as {seen[cc]} does: "
                "Triton's cc_model_filenames holds one engine per compute capability, and an "
                "engine built with hardware compatibility 'none' is meant for the GPU model it "
                "was built on (TensorRT's kNONE): merge each GPU model into its own repository, "
                "or build these engines with --portable same_compute_capability (one of them "
                "then serves every GPU of that compute capability)")
        else:
            seen[cc] = who
    return problems


def engines_to_file(builds: Sequence[EngineBuild]) -> tuple[list[EngineBuild], list[str]]:
    """The builds whose engines go into ``cc_model_filenames``, and a note for each one left
    out: of two builds of one compute capability the later is left out only when both were
    built with ``same_compute_capability`` (the first one's engine serves its GPU too);
    otherwise both stay and ``one_engine_per_compute_capability`` refuses them."""
    filed: list[EngineBuild] = []
    notes: list[str] = []
    first: dict[str, EngineBuild] = {}
    for build in builds:
        earlier = first.setdefault(build.cc_key, build)
        shared = {earlier.provenance.hardware_compatibility,
                  build.provenance.hardware_compatibility} == {"same_compute_capability"}
        if earlier is not build and shared:
            notes.append(f"{build.folder} ({build.target}, {build.provenance.gpu_name}) is not "
                         f"merged: {earlier.folder}'s engine ({earlier.provenance.gpu_name}) "
                         f"serves compute capability {build.cc_key} through "
                         "same_compute_capability")
            continue
        filed.append(build)
    return filed, notes


def build_error(folder: Path, problem: str) -> UserInputError:
    """``problem`` of the build folder ``folder``: a sentence when it starts with a verb
    ("is a CPU-only build"), else after a colon."""
    verb = problem.split(" ", 1)[0] in ("is", "has", "serves")
    return UserInputError(f"build folder '{folder}' {problem}" if verb
                          else f"build folder '{folder}': {problem}")


def read_engine_build(folder: Path) -> EngineBuild:
    """A build folder and its TensorRT model, or a ``UserInputError`` saying what it lacks."""
    if not folder.is_dir():
        raise build_error(folder, "is not a folder")
    report_path = folder / REPORT
    if not report_path.is_file():
        raise build_error(folder, f"is not a trtpack build folder (no {REPORT})")
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
        name, target = str(report["model"]), str(report["target"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise build_error(folder, f"{REPORT} is not a trtpack build report ({e})") from None
    if not is_gpu_target(target):
        raise build_error(folder, "is a CPU-only build (--target cpu): it has no TensorRT engine")
    model_dir = folder / REPOSITORY / name
    if not (model_dir / CONFIG_FILE).is_file():
        raise build_error(folder, f"has no {REPOSITORY}/{name}/config.pbtxt")
    config = read_config(model_dir / CONFIG_FILE)
    if config.platform != ENGINE_PLATFORM:
        served_by = config.platform or config.backend
        raise build_error(folder, f"model '{name}' is served by {served_by}, not a TensorRT "
                                  "engine (a --no-engine build?)")
    plan = model_dir / VERSION / (config.default_model_filename or PLAN_FILENAME)
    if not plan.is_file():
        raise build_error(folder, f"has no engine {plan.relative_to(folder)}")
    prov_file = provenance_path(plan)
    if not prov_file.is_file():
        raise build_error(folder, f"{prov_file.relative_to(folder)} is missing: where the engine "
                                  "was built, and for which GPU, is unknown")
    try:
        prov = EngineProvenance.load(prov_file)
        prov.cc  # noqa: B018  (parses the compute capability)
        prov.model_io()
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise build_error(folder, f"{prov_file.relative_to(folder)} is not a valid trtpack "
                                  f"provenance file ({type(e).__name__}: {e})") from None
    return EngineBuild(folder, name, target, model_dir, plan, prov, config)


def model_names(build: EngineBuild) -> set[str]:
    repo = build.folder / REPOSITORY
    return {p.name for p in repo.iterdir() if (p / CONFIG_FILE).is_file()}


def tree_files(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root``."""
    return {str(p.relative_to(root)): sha256_file(p)
            for p in sorted(root.rglob("*")) if p.is_file()}


def check_compatible(builds: Sequence[EngineBuild]) -> None:
    """Every build against the first: same model, ONNX, precision, profiles, I/O, TensorRT,
    Triton config and other models; one engine per compute capability (``engines_to_file``)."""
    first = builds[0]
    clashes = one_engine_per_compute_capability(
        [(b.cc_key, f"{b.folder} ({b.provenance.gpu_name})") for b in engines_to_file(builds)[0]])
    if clashes:
        raise UserInputError(clashes[0])
    for build in builds:
        if build is first:
            continue
        if build.name != first.name:
            raise build_error(build.folder, f"is model '{build.name}', {first.folder} is "
                                            f"'{first.name}'")
        for name in SAME_FIELDS:
            mine, theirs = getattr(build.provenance, name), getattr(first.provenance, name)
            if mine != theirs:
                label = name.replace("_", " ")
                verb = "differ" if label.endswith("s") else "differs"
                raise build_error(build.folder, f"{label} {verb} from {first.folder}: "
                                                f"{_short(mine)} vs {_short(theirs)}")
        ours, reference = _comparable_config(build.config), _comparable_config(first.config)
        if ours != reference:
            raise build_error(build.folder, f"its Triton config of '{build.name}' differs from "
                                            f"{first.folder}'s (other triton: settings?)")
        others = model_names(build) - {build.name}
        if others != model_names(first) - {first.name}:
            raise build_error(build.folder, f"serves the models {sorted(others)}, {first.folder} "
                                            f"serves {sorted(model_names(first) - {first.name})} "
                                            "(--serve / --fallback-cpu differ?)")
        for model in sorted(others):
            if tree_files(build.folder / REPOSITORY / model) != \
                    tree_files(first.folder / REPOSITORY / model):
                raise build_error(build.folder,
                                  f"its model '{model}' differs from {first.folder}'s")


def _short(value: JsonValue) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 60 else text[:57] + "..."


def _comparable_config(config: ModelConfig) -> str:
    copy = type(config)()
    copy.CopyFrom(config)
    copy.ClearField("default_model_filename")
    copy.ClearField("cc_model_filenames")
    return config_text(copy)
