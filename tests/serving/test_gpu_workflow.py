"""The GPU workflow (.github/workflows/gpu.yml) against ``trtpack merge``'s rule, read from the
file itself: the families whose build folders reach the merge job must have one compute
capability each (what ``engine_builds.check_compatible`` demands), every family must find an
engine in the merged model, and the profiles its builds ask for must be ones Triton's
TensorRT backend serves at every batch for every sequence length they take
(``serving.triton_rules``)."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from trtpack.api.plan import check_triton_profiles
from trtpack.serving.engine_builds import (
    one_engine_per_compute_capability,
    target_compute_capability,
)
from trtpack.serving.triton_rules import engine_max_batch_size, served_lengths
from trtpack.shapes import parse_profiles
from trtpack.sources.resolve import resolve_model

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "gpu.yml"
MERGE_UPLOAD = "The minilm fp16 build folder for the merge"


def _workflow() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def _matrix_entries(job: dict[str, Any]) -> list[dict[str, Any]]:
    matrix = job["strategy"]["matrix"]
    entries = [dict(e) for e in matrix.get("include", [])]
    entries += [{"target": t} for t in matrix.get("target", [])]
    return entries


def _uploads_for_merge(step: dict[str, Any], entry: dict[str, Any]) -> bool:
    """Evaluate the upload step's ``if`` for one matrix entry (the forms this file uses)."""
    condition = str(step.get("if", "true")).strip()
    condition = condition.removeprefix("${{").removesuffix("}}").strip()
    if condition in ("true", "success()", "always()"):
        return True
    if condition.startswith("matrix."):
        return bool(entry.get(condition.removeprefix("matrix.")))
    raise AssertionError(f"unexpected condition on '{MERGE_UPLOAD}': {condition}")


def _fleet_of(step: dict[str, Any], entry: dict[str, Any]) -> str | None:
    """The fleet repository an entry's upload goes to (None: not uploaded), from the upload
    step's ``if`` and artifact name."""
    if not _uploads_for_merge(step, entry):
        return None
    name = str(step["with"]["name"])
    return name.replace("${{ matrix.fleet }}", str(entry.get("fleet"))).split("-")[3]


def test_each_fleet_has_one_engine_per_gpu_model_and_compute_capability() -> None:
    """Issue 45, item 2: the families whose build folders reach one ``trtpack merge`` have
    one compute capability each (merge's own rule), and every family built finds, in some
    fleet repository, an engine built on its own GPU model: engines are built with hardware
    compatibility ``none``, meant for the GPU model they were built on (TensorRT
    ``include/NvInfer.h`` at a892d22, lines 10396-10423: ``kNONE`` vs the opt-in
    ``kSAME_COMPUTE_CAPABILITY``). Before: g6's L4 engine was merged to serve g6e's L40S."""
    from trtpack.machine.targets import families_served, resolve_target

    jobs = _workflow()["jobs"]
    engines = jobs["engines"]
    (upload,) = [s for s in engines["steps"] if s.get("name") == MERGE_UPLOAD]
    assert upload["with"]["name"].startswith("build-minilm-fp16-fleet")
    (download,) = [s for s in jobs["merge"]["steps"] if s.get("uses", "").startswith(
        "actions/download-artifact")]
    assert download["with"]["pattern"] == "build-minilm-fp16-fleet*"
    merge_script = next(s["run"] for s in jobs["merge"]["steps"]
                        if "trtpack merge" in str(s.get("run", "")))
    assert 'builds/build-minilm-fp16-fleet"$fleet"-*' in merge_script  # one merge per fleet
    entries = _matrix_entries(engines)
    fleets: dict[str, list[str]] = {}
    for entry in entries:
        fleet = _fleet_of(upload, entry)
        if fleet is not None:
            fleets.setdefault(fleet, []).append(entry["target"])
    assert fleets
    for fleet, merged in fleets.items():
        keyed = []
        for target in merged:
            cc = target_compute_capability(target)
            assert cc is not None, target
            keyed.append((f"{cc[0]}.{cc[1]}", target))
        assert one_engine_per_compute_capability(keyed) == [], (fleet, keyed)
        assert len(merged) >= 2, fleet  # merge needs two builds
    merged_all = [t for merged in fleets.values() for t in merged]
    for entry in entries:
        target = resolve_target(entry["target"])
        assert target.gpu is not None
        served_by = [m for m in merged_all
                     if target in families_served("none", _device_name(m),
                                                  target.gpu.compute_capability)]
        assert served_by, f"{target.name}'s GPU ({target.gpu.name}) gets no engine of its own"


def _device_name(target: str) -> str:
    """The device name the driver reports for a family's GPU (``NVIDIA <name>``)."""
    from trtpack.machine.targets import resolve_target

    gpu = resolve_target(target).gpu
    assert gpu is not None
    return f"NVIDIA {gpu.name}"


def _convert_builds() -> list[list[str]]:
    """The arguments of every ``trtpack build`` of the convert job."""
    script = next(s["run"] for s in _workflow()["jobs"]["convert"]["steps"]
                  if str(s.get("name", "")).startswith("Build every model up to the engine"))
    return [shlex.split(cmd.replace("\\\n", " ")) for cmd in script.split("trtpack build ")[1:]]


def test_every_engine_is_built_from_the_one_converted_folder() -> None:
    """Convert once (issue 32, item F): the convert job builds every model with
    --no-engine on one machine, and each engine job runs ``trtpack engine`` on exactly those
    folders, so the families merged share one ``onnx_sha256`` (``engine_builds.SAME_FIELDS``,
    which ``trtpack merge`` checks)."""
    jobs = _workflow()["jobs"]
    assert jobs["engines"]["needs"] == "convert"
    converted = {Path(args[args.index("--out") + 1]).name for args in _convert_builds()
                 if "--no-engine" in args}
    assert converted and all("--no-engine" in args for args in _convert_builds())
    script = next(s["run"] for s in jobs["engines"]["steps"]
                  if str(s.get("name", "")).startswith("Build and verify the engines"))
    assert "trtpack build" not in script
    loop = next(line for line in script.splitlines() if line.strip().startswith("for build in"))
    assert set(loop.split(" in ", 1)[1].rstrip("; do").split()) == converted
    assert 'trtpack engine "/onnx/$build" --target "$target"' in script
    upload = next(s for s in jobs["engines"]["steps"] if s.get("name") == MERGE_UPLOAD)
    assert any(line.strip().startswith("out/minilm-fp16/") for line in
               upload["with"]["path"].splitlines())
    assert "minilm-fp16" in converted


def test_the_workflow_profiles_are_ones_triton_can_serve() -> None:
    builds = _convert_builds()
    assert builds
    for args in builds:
        recipe = resolve_model(args[0])
        profiles = parse_profiles([args[i + 1] for i, a in enumerate(args)
                                   if a == "--profile"], recipe.input_specs())
        check_triton_profiles(profiles, recipe, "tensor")  # trtpack build's refusal
        # every sequence length a profile takes is served at every batch Triton may form
        # from requests of that length (1..max_batch_size): no batch of short texts fails
        ids = recipe.inputs[0].name
        taken = sorted({n for p in profiles for n in range(p.shapes[ids].min[1],
                                                           p.shapes[ids].max[1] + 1)})
        assert served_lengths(profiles, ids, engine_max_batch_size(profiles)) == taken, args


GPU_PATH_FILES = ("pyproject.toml", "Makefile", "mk/triton.mk", "Dockerfile.ngc",
                  ".github/workflows/gpu.yml", "trtpack/runtimes/polygraphy_setup.py",
                  "trtpack/serving/triton_rules.py", "trtpack/serving/merge.py",
                  "trtpack/serving/engine_builds.py", "trtpack/precision/fp16/conversion.py",
                  "trtpack/precision/int8/conversion.py", "trtpack/pipeline/engine_from_build.py",
                  "tests/gpu/test_engine_gpu.py")
"""The files issue 32 (item H) named, and what ``trtpack engine`` added."""
ENGINE_ROOMS = ("trtpack.engine", "trtpack.runtimes.tensorrt", "trtpack.runtimes.polygraphy_setup")


def _github_glob(pattern: str) -> re.Pattern[str]:
    """GitHub's filter patterns ("Filter pattern cheat sheet" of the workflow syntax docs):
    ``*`` matches any character but ``/``, ``**`` any character including ``/``, ``?`` one
    character."""
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + ".", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def _engine_room_users() -> list[str]:
    """Every module that imports the engine room or the TensorRT runtime: what the GPU jobs
    run (the engine stage, packaging, merge, inspect, doctor)."""
    users = []
    for path in sorted((ROOT / "trtpack").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if any(n.startswith(ENGINE_ROOMS) for n in names):
                users.append(str(path.relative_to(ROOT)))
                break
    return users


def test_a_push_to_any_file_of_the_gpu_path_runs_the_gpu_workflow() -> None:
    """Item H: GitHub runs a ``push`` workflow with ``paths`` only when a changed file
    matches one of them (workflow syntax, ``on.<push>.paths``); the GPU path's files must
    all match."""
    workflow = _workflow()
    on = workflow.get("on", workflow.get(True))  # YAML 1.1 reads the key "on" as True
    patterns = [_github_glob(p) for p in on["push"]["paths"]]
    files = [*GPU_PATH_FILES, *_engine_room_users()]
    assert all((ROOT / f).is_file() for f in files), [f for f in files
                                                     if not (ROOT / f).is_file()]
    missed = [f for f in files if not any(p.fullmatch(f) for p in patterns)]
    assert not missed, missed
