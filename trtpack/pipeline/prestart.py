"""A build's first stage process, started as the ``trtpack build`` command starts.

Before it starts the process of its first stage (``isolate.StageProcess``), a build imports
its command line, resolves the recipe, checks the memory the profiles need and plans its
stages, and that process then spends seconds importing torch and transformers (the export)
before it can begin (the figures: benchmarks/README.md, "Figures behind design choices").
``prestart`` starts that process first, before the command line is even imported, so its
imports run beside all of that. It needs no options to import: they come with
``StageProcess.prepare`` once the build has planned.

Which stage: the export, unless MODEL names an ``.onnx`` file (the import stage); and only
when the stage cache holds no entry of that stage at all (or ``--no-cache``): a rebuild
starts no process it would not use. The build takes the process (``take``) when it plans
that stage; one it does not take (MODEL was a recipe file naming an ONNX model) is ended
then (``end_untaken``), and one whose stage the build finds in a cache (a second runner's
remote cache: its local one is empty) is ended as soon as it is found (``end``), before the
download its imports would compete with.

This module imports nothing heavy: ``trtpack.cli.main`` calls it before anything else.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from trtpack.pipeline.stage_client import served_process
from trtpack.processes import (
    ChildProcess,
    kill_group,
    python_module_command,
    server_folder,
)

ISOLATE_MODULE = "trtpack.pipeline.isolate"  # the stage process's entry point
NO_PRESTART_ENV = "TRTPACK_NO_PRESTART"
"""Set to 1: no process is started ahead; the build starts its first stage's when it plans
(a command expected to stop at a usage error: tests of one have no use for it)."""


@dataclass
class StartedProcess:
    """A stage's process, started and importing: the pipes to it, the file its output went
    to from the start (``output``: a prestarted one's is temporary) and its stage log, once
    the build has named it (``StageProcess.prepare``); the process moves its output there
    when it reads that."""

    process: ChildProcess
    jobs: Connection  # build -> stage: the plan, then the job
    messages: Connection  # stage -> build: progress, then the outcome
    output: Path
    stage_log: Path | None = None

    def stop(self) -> None:
        """End the process and everything it started, close the pipes, and keep what it
        wrote: a temporary output it had not moved yet (it died importing, or the build
        ended first) goes into the stage log, or is removed when there is none."""
        if self.process.poll() is None:
            kill_group(self.process.pid)
        self.process.wait()
        kill_group(self.process.pid)  # anything it started that is still running
        self.jobs.close()
        self.messages.close()
        # no stage log: nothing to keep; else what the log does not hold yet goes there
        moved = self.stage_log is None or (self.output != self.stage_log
                                           and move_output(self.output, self.stage_log))
        if moved:
            self.output.unlink(missing_ok=True)


def move_output(output: Path, stage_log: Path) -> bool:
    """Append what ``output`` holds to ``stage_log``: whether it is there now (nothing to
    move is there too)."""
    try:
        written = output.read_bytes()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        with open(stage_log, "ab") as log:
            log.write(written)
    except OSError:
        return False
    return True


def start_stage_process(stage: str, log_path: Path,
                        environment: Sequence[tuple[str, str]] = ()) -> StartedProcess:
    """``python -m trtpack.pipeline.isolate`` for the stage named ``stage``, in a session
    (process group) of its own, its output appended to ``log_path``; ``environment``: the
    variables its process has from its start (``Stage.environment``). Forked from the stage
    server's template when one is named and serves it (``stage_client``), else started."""
    served = None if environment else _served(stage, log_path)
    if served is not None:
        return served
    jobs_r, jobs_w = os.pipe()
    messages_r, messages_w = os.pipe()
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            python_module_command(ISOLATE_MODULE, str(jobs_r), str(messages_w), stage,
                                  str(log_path)),
            pass_fds=(jobs_r, messages_w), start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            env={**os.environ, **dict(environment)} if environment else None,
        )
    os.close(jobs_r)
    os.close(messages_w)
    return StartedProcess(process, Connection(jobs_w, readable=False),
                          Connection(messages_r, writable=False), log_path)


def _served(stage: str, log_path: Path) -> StartedProcess | None:
    """The stage's process from the stage server, or None (none named, or it refused)."""
    if server_folder() is None:
        return None
    jobs_r, jobs_w = os.pipe()
    messages_r, messages_w = os.pipe()
    try:
        with open(log_path, "ab") as log:
            process = served_process(stage, log_path, jobs_r, messages_w, log.fileno())
    finally:
        os.close(jobs_r)
        os.close(messages_w)
    if process is None:
        os.close(jobs_w)
        os.close(messages_r)
        return None
    return StartedProcess(process, Connection(jobs_w, readable=False),
                          Connection(messages_r, writable=False), log_path)


_PRESTARTED: dict[str, StartedProcess] = {}


def first_stage(argv: list[str]) -> str | None:
    """The stage a ``trtpack`` command line (without the program name) starts with, when it
    is ``build MODEL ...`` and not asking for help: ``import`` for an ONNX file, else
    ``export``."""
    if len(argv) < 2 or argv[0] != "build" or argv[1].startswith("-"):
        return None
    if any(a in ("--help", "-h") for a in argv[1:]):
        return None
    return "import" if argv[1].lower().endswith(".onnx") else "export"


def option_value(argv: list[str], flag: str) -> str | None:
    """The value of ``flag`` on a command line (``--flag VALUE`` or ``--flag=VALUE``)."""
    for index, arg in enumerate(argv):
        if arg == flag and index + 1 < len(argv):
            return argv[index + 1]
        if arg.startswith(flag + "="):
            return arg[len(flag) + 1:]
    return None


def may_reuse(argv: list[str], stage: str) -> bool:
    """Whether the build may find ``stage`` in its stage cache: the cache it names holds any
    entry of that stage (a rebuild; then the process would only be ended at the plan, and
    its imports take a core from a rebuild that takes under a second)."""
    from trtpack.machine.paths import default_cache_dir
    from trtpack.pipeline.cache import StageCache

    if "--no-cache" in argv:
        return False
    folder = option_value(argv, "--cache-dir")
    return StageCache(Path(folder) if folder else default_cache_dir()).holds_any(stage)


def prestart(argv: list[str]) -> None:
    """Start the first stage's process of the build ``argv`` asks for (see the module)."""
    stage = first_stage(argv)
    if stage is None or stage in _PRESTARTED or os.environ.get(NO_PRESTART_ENV, "0") != "0" \
            or may_reuse(argv, stage):
        return
    try:
        handle, name = tempfile.mkstemp(prefix=f"trtpack-{stage}-", suffix=".log")
    except OSError:  # no temporary folder: the build starts the process itself, later
        return
    os.close(handle)
    try:
        _PRESTARTED[stage] = start_stage_process(stage, Path(name))
    except OSError:
        Path(name).unlink(missing_ok=True)


def take(stage: str) -> StartedProcess | None:
    """The process prestarted for ``stage``, now the build's (None: there is none)."""
    return _PRESTARTED.pop(stage, None)


def end(stage: str) -> None:
    """End the process prestarted for ``stage``, if any: the build found that stage in its
    cache (locally, or in the remote cache before downloading it), so nothing will take it,
    and its imports would take a core from what the build does instead."""
    started = _PRESTARTED.pop(stage, None)
    if started is not None:
        started.stop()


def end_untaken() -> None:
    """End the prestarted processes no build took, and remove their output files."""
    while _PRESTARTED:
        _, started = _PRESTARTED.popitem()
        started.stop()
