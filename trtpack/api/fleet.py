"""A fleet manifest: the models a platform serves (recipes, model folders, PyTorch sources,
ONNX files), each with its precision and profiles, and the instance types to serve them on;
and the job matrix CI runs for it (``trtpack fleet plan``: GitHub Actions' ``strategy.matrix``
through ``fromJSON``, one job per model and instance type). ``docs/fleet.md`` shows the file.

    instance_types: [g4dn, g5, p4d]          # families or instance types (trtpack targets)
    models:
      - source: minilm                       # a recipe, folder, FILE.py:FN, .pt/.pt2, .onnx
        precision: fp16
        profiles: ["1x8:4x32:8x128"]
      - name: tiny                            # default: the source's file stem or recipe
        source: tiny-bert
        random_weights: true
        instance_types: [g5]                  # this model only on these"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtpack.errors import UserInputError
from trtpack.machine.targets import is_gpu_target, resolve_target
from trtpack.sources.recipe import PRECISIONS

# GitHub Actions runs at most 256 jobs from one matrix
MAX_JOBS = 256
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_MODEL_KEYS = {"name", "source", "precision", "profiles", "random_weights", "instance_types"}


@dataclass(frozen=True)
class FleetModel:
    """One model of the fleet, as ``trtpack build`` takes it."""

    name: str
    source: str
    precision: str | None = None  # None: the recipe's
    profiles: tuple[str, ...] = ()  # none: the recipe's
    random_weights: bool = False
    instance_types: tuple[str, ...] = ()  # the families it is served on

    def build_arguments(self, target: str, out: str, no_engine: bool | None = None
                        ) -> list[str]:
        """``trtpack build`` arguments for this model on ``target`` (``cpu``, or a GPU
        family: by default the convert job's ``--no-engine`` build)."""
        args = ["build", self.source, "--target", target, "--out", out]
        if no_engine if no_engine is not None else is_gpu_target(target):
            args.append("--no-engine")
        if self.precision is not None:
            args += ["--precision", self.precision]
        for profile in self.profiles:
            args += ["--profile", profile]
        if self.random_weights:
            args.append("--random-weights")
        return args


@dataclass(frozen=True)
class FleetManifest:
    path: Path
    models: tuple[FleetModel, ...]
    instance_types: tuple[str, ...]


def load_manifest(path: Path) -> FleetManifest:
    """The manifest at ``path``, checked: every model has a source and a name of its own,
    a known precision, profiles as strings, and known instance types."""
    import yaml

    where = str(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UserInputError(f"fleet manifest '{where}' does not exist") from None
    except (OSError, yaml.YAMLError) as e:
        raise UserInputError(f"fleet manifest '{where}' is not readable YAML: "
                             f"{str(e).splitlines()[0]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("models"), list) \
            or not data["models"]:
        raise UserInputError(f"{where}: needs a 'models' list (and 'instance_types')")
    extra = set(data) - {"models", "instance_types"}
    if extra:
        raise UserInputError(f"{where}: unknown key '{sorted(extra)[0]}' (models, "
                             "instance_types)")
    fleet_types = _instance_types(data.get("instance_types", []), where)
    models: list[FleetModel] = []
    for n, entry in enumerate(data["models"], 1):
        models.append(_model(entry, f"{where}: model {n}", fleet_types))
    names = [m.name for m in models]
    for name in names:
        if names.count(name) > 1:
            raise UserInputError(f"{where}: two models are named '{name}': give each a "
                                 "name of its own (name: ...)")
    if not any(m.instance_types for m in models):
        raise UserInputError(f"{where}: no instance types: list them (instance_types: "
                             "[g5, ...]; trtpack targets shows them)")
    return FleetManifest(path, tuple(models), fleet_types)


def _instance_types(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserInputError(f"{where}: instance_types is a list of names, like [g5, p4d]")
    families = []
    for name in value:
        target = resolve_target(name)  # an unknown one: exit 2 naming the known ones
        if not target.is_gpu:
            raise UserInputError(f"{where}: instance type '{name}' is not a GPU family; "
                                 "the fleet's CPU build is trtpack fleet build --target cpu")
        if target.name not in families:
            families.append(target.name)
    return tuple(families)


def _model(entry: Any, where: str, fleet_types: tuple[str, ...]) -> FleetModel:
    if isinstance(entry, str):
        entry = {"source": entry}
    if not isinstance(entry, dict) or not isinstance(entry.get("source"), str) \
            or not entry["source"].strip():
        raise UserInputError(f"{where}: needs a source (a recipe, folder or file)")
    extra = set(entry) - _MODEL_KEYS
    if extra:
        raise UserInputError(f"{where}: unknown key '{sorted(extra)[0]}' "
                             f"({', '.join(sorted(_MODEL_KEYS))})")
    source = entry["source"].strip()
    name = str(entry.get("name") or Path(source.split(":")[0]).stem or source)
    if not _NAME.match(name):
        raise UserInputError(f"{where}: name '{name}' must be letters, digits, '.', '_' "
                             "or '-' (it names the job and the output folder)")
    precision = entry.get("precision")
    if precision is not None and str(precision).lower() not in PRECISIONS:
        raise UserInputError(f"{where} ({name}): precision '{precision}' is not one of "
                             f"{', '.join(PRECISIONS)}")
    profiles = entry.get("profiles", [])
    if isinstance(profiles, str):
        profiles = [profiles]
    if not isinstance(profiles, list) or not all(isinstance(p, str) for p in profiles):
        raise UserInputError(f"{where} ({name}): profiles is a list of MIN:OPT:MAX strings")
    own_types = _instance_types(entry["instance_types"], f"{where} ({name})") \
        if "instance_types" in entry else fleet_types
    return FleetModel(name, source, None if precision is None else str(precision).lower(),
                      tuple(profiles), bool(entry.get("random_weights", False)), own_types)


def job_matrix(manifest: FleetManifest) -> dict[str, list[dict[str, str | int | bool]]]:
    """GitHub Actions' ``strategy.matrix`` for the manifest: ``include`` holds one job per
    (model, instance type), each with the ``trtpack build`` command of its convert step (a
    ``--no-engine`` build, shared through the remote cache by every job of the model), the
    ``trtpack engine`` command that builds the family's engine from ``onnx/<model>`` (the
    convert-once folder ``trtpack fleet build --no-engine`` writes under ``builds/``), the
    fleet ``repository`` its engine is assembled into (``machine.targets.fleet_repositories``:
    one engine per GPU model and compute capability in each; 0: another family's engine
    serves its GPU), and ``gpu_tests`` on the first job of each family. Over ``MAX_JOBS``
    jobs is refused (GitHub's limit)."""
    from trtpack.machine.targets import fleet_repositories, resolve_target

    families = [resolve_target(f) for m in manifest.models for f in m.instance_types]
    unique = list({t.name: t for t in families}.values())
    repository = {t.name: k for k, repo in enumerate(fleet_repositories("none", unique), 1)
                  for t in repo}
    jobs: list[dict[str, str | int | bool]] = []
    tested: set[str] = set()
    for model in manifest.models:
        for family in model.instance_types:
            convert = " ".join(_quoted(a) for a in model.build_arguments(
                family, f"onnx/{model.name}"))
            jobs.append({"model": model.name, "instance_type": family,
                         "convert": f"trtpack {convert}",
                         "engine": f"trtpack engine onnx/{model.name} --target {family} "
                                   f"--out out/{model.name}-{family}",
                         "repository": repository.get(family, 0),
                         "gpu_tests": family not in tested})
            tested.add(family)
    if len(jobs) > MAX_JOBS:
        raise UserInputError(
            f"{manifest.path}: {len(jobs)} jobs ({len(manifest.models)} models x their "
            f"instance types), over GitHub Actions' {MAX_JOBS} per matrix: split the "
            "manifest")
    return {"include": jobs}


def matrix_json(manifest: FleetManifest) -> str:
    """``job_matrix`` on one line (a step output ``fromJSON`` reads)."""
    return json.dumps(job_matrix(manifest), separators=(",", ":"))


def _quoted(arg: str) -> str:
    import shlex

    return shlex.quote(arg)
