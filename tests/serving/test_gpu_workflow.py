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
ASSEMBLE_UPLOAD = "The build folder for the fleet repository"


def _workflow() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def _plan() -> list[dict[str, Any]]:
    """The engine jobs: the matrix ``trtpack fleet plan fleet.yaml`` gives gpu.yml."""
    from trtpack.api.fleet import job_matrix, load_manifest

    jobs = _workflow()["jobs"]
    assert jobs["engines"]["strategy"]["matrix"] == \
        "${{ fromJSON(needs.fleet-plan.outputs.matrix) }}"
    plan = next(s["run"] for s in jobs["fleet-plan"]["steps"] if s.get("id") == "plan")
    assert "trtpack fleet plan fleet.yaml" in plan
    return job_matrix(load_manifest(ROOT / "fleet.yaml"))["include"]


def test_each_fleet_has_one_engine_per_gpu_model_and_compute_capability() -> None:
    """Issue 45, item 2: the families whose build folders reach one fleet repository (one
    ``trtpack fleet assemble``, which merges each model's engines by ``trtpack merge``'s
    rule) have one compute capability each, and every family built finds, in some fleet
    repository, an engine built on its own GPU model: engines are built with hardware
    compatibility ``none``, meant for the GPU model they were built on (TensorRT
    ``include/NvInfer.h`` at a892d22, lines 10396-10423: ``kNONE`` vs the opt-in
    ``kSAME_COMPUTE_CAPABILITY``). Before: g6's L4 engine was merged to serve g6e's L40S."""
    from trtpack.machine.targets import families_served, resolve_target

    jobs = _workflow()["jobs"]
    (upload,) = [s for s in jobs["engines"]["steps"] if s.get("name") == ASSEMBLE_UPLOAD]
    assert upload["if"] == "${{ matrix.repository }}"  # 0: not assembled
    assert upload["with"]["name"].startswith("build-repo${{ matrix.repository }}-")
    (download,) = [s for s in jobs["merge"]["steps"] if s.get("uses", "").startswith(
        "actions/download-artifact")]
    assert download["with"]["pattern"] == "build-repo*"
    script = next(s["run"] for s in jobs["merge"]["steps"]
                  if "trtpack fleet assemble" in str(s.get("run", "")))
    assert 'builds/build-repo"$repository"-*' in script  # one repository per number
    entries = _plan()
    for model in {e["model"] for e in entries}:
        fleets: dict[int, list[str]] = {}
        mine = [e for e in entries if e["model"] == model]
        for entry in mine:
            if entry["repository"]:
                fleets.setdefault(entry["repository"], []).append(entry["instance_type"])
        assert fleets
        for fleet, merged in fleets.items():
            keyed = []
            for target in merged:
                cc = target_compute_capability(target)
                assert cc is not None, target
                keyed.append((f"{cc[0]}.{cc[1]}", target))
            assert one_engine_per_compute_capability(keyed) == [], (fleet, keyed)
            assert len(merged) >= 2, fleet  # merged: two builds or more
        merged_all = [t for merged in fleets.values() for t in merged]
        for entry in mine:
            target = resolve_target(entry["instance_type"])
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
    """The arguments of every ``trtpack build`` the convert job's fleet build runs."""
    from trtpack.api.fleet import load_manifest

    script = next(s["run"] for s in _workflow()["jobs"]["convert"]["steps"]
                  if str(s.get("name", "")).startswith("Build every model of fleet.yaml"))
    args = shlex.split(script)
    assert args[:4] == ["trtpack", "fleet", "build", "fleet.yaml"] and "--no-engine" in args
    target = args[args.index("--target") + 1]
    return [m.build_arguments(target, f"onnx/{m.name}", no_engine=True)[1:]
            for m in load_manifest(ROOT / "fleet.yaml").models]


def test_every_engine_is_built_from_the_one_converted_folder() -> None:
    """Convert once (issue 32, item F): the convert job builds every model of fleet.yaml
    with --no-engine on one machine (``trtpack fleet build``), and each engine job runs
    ``trtpack engine`` on exactly those folders, so the families merged share one
    ``onnx_sha256`` (``engine_builds.SAME_FIELDS``, which merging checks)."""
    jobs = _workflow()["jobs"]
    assert set(jobs["engines"]["needs"]) == {"fleet-plan", "convert"}
    builds = _convert_builds()
    assert builds and all("--no-engine" in args for args in builds)
    converted = {Path(args[args.index("--out") + 1]).name for args in builds}
    script = next(s["run"] for s in jobs["convert"]["steps"]
                  if str(s.get("name", "")).startswith("Build every model of fleet.yaml"))
    out = shlex.split(script)[shlex.split(script).index("--out") + 1]
    upload = next(s for s in jobs["convert"]["steps"]
                  if str(s.get("uses", "")).startswith("actions/upload-artifact"))
    assert upload["with"]["path"].rstrip("/") == f"{out}/builds"  # fleet build's builds/
    download = next(s for s in jobs["engines"]["steps"]
                    if str(s.get("uses", "")).startswith("actions/download-artifact"))
    assert download["with"] == {"name": upload["with"]["name"], "path": "onnx"}
    engine_step = next(s["run"] for s in jobs["engines"]["steps"]
                       if str(s.get("name", "")).startswith("Build and verify the engine"))
    assert "trtpack build" not in engine_step and 'eval "${{ matrix.engine }}"' in engine_step
    for entry in _plan():
        assert entry["model"] in converted
        assert entry["engine"].startswith(f"trtpack engine onnx/{entry['model']} --target "
                                          f"{entry['instance_type']} ")


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


IMAGE_FILES = ("pyproject.toml", "Makefile", "Dockerfile.ngc", ".github/workflows/gpu.yml")
"""What the GPU jobs build their image and install from, besides the folders the Dockerfile
copies (``COPY`` lines, read below)."""
READ_FILES = ("fleet.yaml",)
"""What the GPU jobs read as data: the fleet manifest (the plan's matrix, the convert job's
builds)."""
ENTRY_POINTS = ("trtpack/cli/app.py", "tests/conftest.py")
"""What the GPU jobs run, besides tests/gpu/: the ``trtpack`` commands (doctor, engine,
inspect, merge: the typer app) and the test suite's shared fixtures."""


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


def _module_file(name: str) -> Path | None:
    path = ROOT / Path(*name.split("."))
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _names_imported(path: Path) -> set[str]:
    """Every module name ``path`` imports, anywhere (trtpack imports heavy and optional
    modules inside functions), ``from m import n`` as both m and m.n, and every string that
    is a trtpack module's dotted name (the stage table and the worker processes name their
    modules as strings)."""
    names: set[str] = set()
    package = path.relative_to(ROOT).parent.parts
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            names.add(module)
            names.update(f"{module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                re.fullmatch(r"trtpack(\.\w+)+", node.value):
            names.add(node.value)
    return names


def gpu_job_files() -> set[str]:
    """The files the GPU jobs run: the import graph from ``ENTRY_POINTS`` and tests/gpu/
    (every package on the way, every module imported), plus ``IMAGE_FILES``, ``READ_FILES``
    (each checked to be read by a step of the workflow) and the folders
    Dockerfile.ngc copies that are not code (mk/, data/)."""
    todo = [ROOT / f for f in ENTRY_POINTS] + sorted((ROOT / "tests" / "gpu").glob("*.py"))
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _names_imported(path):
            if name.split(".")[0] not in ("trtpack", "tests"):
                continue
            parts = name.split(".")
            found = (_module_file(".".join(parts[:i])) for i in range(1, len(parts) + 1))
            todo += [f for f in found if f is not None and f not in seen]
    copied = re.findall(r"^COPY (\S+) ", (ROOT / "Dockerfile.ngc").read_text(), re.MULTILINE)
    data = {str(f.relative_to(ROOT)) for folder in copied if folder in ("mk", "data")
            for f in (ROOT / folder).rglob("*") if f.is_file()}
    return {str(p.relative_to(ROOT)) for p in seen} | set(IMAGE_FILES) | set(READ_FILES) | data


def test_a_push_to_any_file_the_gpu_jobs_run_runs_the_gpu_workflow() -> None:
    """Issue 45, item 7: GitHub runs a ``push`` workflow with ``paths`` only when a changed
    file matches one of them (workflow syntax, ``on.<push>.paths``). The files the GPU jobs
    run are derived from the import graph (not listed by hand); before, a list missed
    trtpack/verify/**, cases.py, cli/**, the export/simplify/verify/precision stages,
    pipeline/{stage,stage_runs,cache,isolate}.py, shapes.py and tests/conftest.py."""
    workflow = _workflow()
    on = workflow.get("on", workflow.get(True))  # YAML 1.1 reads the key "on" as True
    patterns = [_github_glob(p) for p in on["push"]["paths"]]
    files = gpu_job_files()
    # the graph reaches what the GPU jobs are known to run (the derivation can fail)
    assert {"trtpack/verify/compare.py", "trtpack/cases.py", "trtpack/stages/engine.py",
            "trtpack/pipeline/isolate.py", "trtpack/shapes.py", "tests/conftest.py",
            "trtpack/runtimes/tensorrt.py", "mk/triton.mk"} <= files, files
    missed = sorted(f for f in files if not any(p.fullmatch(f) for p in patterns))
    assert not missed, missed
    # and no pattern is stale: each matches some file the jobs run
    stale = [p.pattern for p in patterns if not any(p.fullmatch(f) for f in files)]
    assert not stale, stale
    steps = " ".join(str(s.get("run", "")) for job in workflow["jobs"].values()
                     for s in job["steps"])
    for read in READ_FILES:  # a file the jobs no longer read would keep triggering them
        assert (ROOT / read).is_file() and f" {read}" in steps, read


def test_the_engine_jobs_remove_their_image_whatever_happened() -> None:
    """Issue 45, item 4: every run builds ``trtpack-ngc:<sha>`` on a self-hosted runner, which
    keeps images between jobs; the job's last step removes it under ``if: always()`` (GitHub
    runs a step after a failed or cancelled one only with a status function such as
    ``always()``)."""
    workflow = _workflow()
    engines = workflow["jobs"]["engines"]
    steps = engines["steps"]
    build = next(s for s in steps if "docker build" in str(s.get("run", "")))
    assert '-t "$IMAGE"' in build["run"]
    assert workflow["env"]["IMAGE"].endswith("${{ github.sha }}")  # a new tag every run
    last = steps[-1]
    assert str(last.get("if", "")).strip() == "always()", last
    assert 'docker image rm --force "$IMAGE"' in last["run"]
