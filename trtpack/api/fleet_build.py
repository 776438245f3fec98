"""``trtpack fleet build``: every model of a fleet manifest built on this machine (for the CPU,
or ``--no-engine`` for a GPU family) through the same stage cache (local, and the bucket of
``--cache-url`` / ``TRTPACK_CACHE_URL``), side by side where the memory estimate of each
build (``pipeline.memory_check``, the pre-check every build makes) says they fit together,
then one Triton repository holding every model (``serving.assemble``):

    OUT/
      fleet.json               the manifest, each model's build (seconds, exit) and models
      model_repository/        every model of every build
      builds/<name>/           each model's build folder (report.json, artifacts/, logs)
      builds/<name>.log        its ``trtpack build`` output

Each model is a ``trtpack build`` process of its own (a failure or a memory refusal is that
build's, with its own exit code and error line). Everything is written under a temporary
folder beside OUT and renamed into place at the end: an interrupted or failed fleet build
leaves no OUT (and no partial repository); the stage cache keeps what the builds stored."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trtpack.api.fleet import FleetManifest, FleetModel
from trtpack.errors import TrtpackError, UserInputError
from trtpack.options import BuildRequest
from trtpack.processes import kill_group, python_module_command
from trtpack.resources import available_memory

FLEET_REPORT = "fleet.json"
BUILDS = "builds"

Progress = Callable[[str], None]


class FleetBuildError(TrtpackError):
    """A model's build failed: the fleet build ends with that build's exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class PlannedBuild:
    model: FleetModel
    estimate: int | None  # the build's peak bytes, as the memory pre-check estimates them


@dataclass(frozen=True)
class BuiltModel:
    name: str
    seconds: float
    estimate: int | None
    served: tuple[str, ...]


@dataclass(frozen=True)
class FleetBuildResult:
    out_dir: Path
    models: tuple[BuiltModel, ...]
    most_at_once: int  # the most builds that ran side by side

    @property
    def repository(self) -> Path:
        from trtpack.out_files import REPOSITORY

        return self.out_dir / REPOSITORY


def model_request(model: FleetModel, target: str, no_engine: bool,
                  cache_dir: Path | None = None, use_cache: bool = True) -> BuildRequest:
    """The ``trtpack build`` request of ``model`` (what its process will be asked)."""
    return BuildRequest(model=model.source, profiles=model.profiles, precision=model.precision,
                        target=target, random_weights=model.random_weights,
                        build_engine=not no_engine, cache_dir=cache_dir, use_cache=use_cache)


def plan_builds(manifest: FleetManifest, target: str, no_engine: bool,
                cache_dir: Path | None = None, use_cache: bool = True,
                skip_memory_check: bool = False) -> list[PlannedBuild]:
    """Every model's build checked as ``trtpack build`` checks it (a bad source, profile or
    precision: the ``UserInputError`` of that model) and no two served under one name, all
    before anything runs; then each build's memory estimated: the most any stage of it is
    expected to hold at its largest profile corner (stored in the stage cache, where the
    build's own pre-check finds it)."""
    from trtpack.api import resolve_options
    from trtpack.pipeline.memory_check import estimate_in_child, lower_bounds, meta_traceable

    plans = []
    served: dict[str, str] = {}
    for model in manifest.models:
        try:
            plan, _ = resolve_options(model_request(model, target, no_engine, cache_dir,
                                                    use_cache))
        except UserInputError as e:
            raise type(e)(f"{manifest.path}: model '{model.name}': {e}",
                          hint=e.hint) from None
        other = served.setdefault(plan.recipe.name, model.name)
        if other != model.name:  # one repository serves one model per name
            raise UserInputError(f"{manifest.path}: models '{other}' and '{model.name}' are "
                                 f"both served as '{plan.recipe.name}': one repository serves "
                                 "one model per name; build them as separate fleets")
        plans.append(plan)
    planned = []
    for model, plan in zip(manifest.models, plans, strict=True):
        estimate: int | None = None
        if not skip_memory_check:
            found = estimate_in_child(plan) if meta_traceable(plan) else lower_bounds(plan)
            if not isinstance(found, str) and found:
                estimate = max(e.largest[1] for e in found)
        planned.append(PlannedBuild(model, estimate))
    return planned


def _error_line(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()
             if line.strip()] if log.is_file() else []
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["no output"])[-1].removeprefix("error:").strip()


@dataclass
class _Running:
    build: PlannedBuild
    process: subprocess.Popen[bytes]
    started: float


def fleet_build(manifest: FleetManifest, out: Path, *, target: str = "cpu",
                no_engine: bool = False, jobs: int | None = None,
                cache_dir: Path | None = None, cache_url: str | None = None,
                use_cache: bool = True, skip_memory_check: bool = False,
                progress: Progress | None = None) -> FleetBuildResult:
    """Build every model of ``manifest`` into one repository under ``out`` (new or empty).
    ``jobs``: the most builds at once (default: this machine's CPUs); fewer when their memory
    estimates do not fit in the memory available together (a build whose estimate is
    unknown runs alone)."""
    from trtpack.serving.assemble import assemble_builds

    say = progress or (lambda message: None)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserInputError(f"--out {out} exists and is not empty")
    jobs = jobs or os.cpu_count() or 1
    if jobs < 1:
        raise UserInputError(f"--jobs must be 1 or more, not {jobs}")
    planned = plan_builds(manifest, target, no_engine, cache_dir, use_cache, skip_memory_check)
    memory = None if skip_memory_check else available_memory()
    room = memory.bytes if memory is not None else None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.fleet-", dir=out.parent))
    running: list[_Running] = []
    built: dict[str, tuple[float, int | None]] = {}
    most = 0
    try:
        (tmp / BUILDS).mkdir()
        waiting = list(planned)
        while waiting or running:
            for run in list(running):
                code = run.process.poll()
                if code is None:
                    continue
                running.remove(run)
                name = run.build.model.name
                seconds = time.monotonic() - run.started
                if code != 0:
                    why = _error_line(tmp / BUILDS / f"{name}.log")
                    raise FleetBuildError(f"model '{name}' failed (exit {code}): {why}",
                                          code if code in (1, 2, 3, 4) else 4)
                built[name] = (seconds, run.build.estimate)
                say(f"built {name} in {seconds:.1f} s ({len(built)}/{len(planned)})")
            while waiting and len(running) < jobs and _fits(waiting[0], running, room):
                build = waiting.pop(0)
                running.append(_start(build, tmp, target, no_engine, cache_dir, cache_url,
                                      use_cache))
                most = max(most, len(running))
                estimate = "memory not estimated" if build.estimate is None else \
                    f"estimate {build.estimate / 2**30:.1f} GB"
                say(f"building {build.model.name} ({estimate}; {len(running)} running, "
                    f"{len(waiting)} waiting)")
            time.sleep(0.1)
        say(f"assembling {len(planned)} model(s) into one repository")
        folders = [tmp / BUILDS / m.model.name for m in planned]
        assembled = assemble_builds(folders, tmp / "assembled")
        assembled.repository.rename(tmp / assembled.repository.name)
        shutil.rmtree(tmp / "assembled")
        models = tuple(BuiltModel(p.model.name,
                                  round(built[p.model.name][0], 3), p.estimate, a.served)
                       for p, a in zip(planned, assembled.models, strict=True))
        (tmp / FLEET_REPORT).write_text(json.dumps({
            "manifest": str(manifest.path.resolve()), "target": target,
            "no_engine": no_engine, "jobs": jobs, "most_at_once": most,
            "memory_available": room, "models": [{
                "name": m.name, "seconds": m.seconds, "memory_estimate": m.estimate,
                "served": list(m.served)} for m in models]}, indent=2) + "\n",
            encoding="utf-8")
        if out.exists():
            out.rmdir()  # empty (checked above)
        tmp.rename(out)
    except BaseException:
        for run in running:  # Ctrl-C, SIGTERM, a failed build: the others end too
            kill_group(run.process.pid)
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                run.process.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return FleetBuildResult(out, models, most)


def _fits(build: PlannedBuild, running: list[_Running], room: int | None) -> bool:
    """Whether ``build`` may start beside ``running``: alone always; beside others when every
    estimate is known and they add up to no more than the memory available."""
    if not running:
        return True
    if room is None or build.estimate is None \
            or any(r.build.estimate is None for r in running):
        return False
    return build.estimate + sum(r.build.estimate or 0 for r in running) <= room


def _start(build: PlannedBuild, tmp: Path, target: str, no_engine: bool,
           cache_dir: Path | None, cache_url: str | None, use_cache: bool) -> _Running:
    model = build.model
    args = model.build_arguments(target, str(tmp / BUILDS / model.name), no_engine=no_engine)
    if cache_dir is not None:
        args += ["--cache-dir", str(cache_dir)]
    if cache_url is not None:
        args += ["--cache-url", cache_url]
    if not use_cache:
        args.append("--no-cache")
    # the fleet checked every build's memory against them all together; each build checks
    # its own estimate again against what is available when it starts
    log = (tmp / BUILDS / f"{model.name}.log").open("wb")
    try:
        process = subprocess.Popen(python_module_command("trtpack.cli", *args),
                                   stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        log.close()
    return _Running(build, process, time.monotonic())
