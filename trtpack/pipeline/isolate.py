"""Stages in a process of their own (``Stage.isolated``).

A ``StageProcess`` starts ahead of its stage (up to two stages ahead): a fresh Python
(``python -m trtpack.pipeline.isolate``) that imports the stage's module and its heavy
packages while the stages before it run, then waits for its one job. It runs the stage,
sends progress messages and then the outcome (or what went wrong) back, and exits; what the
stage allocated goes back to the system with it. A stage that is not needed after all
(cache hit, earlier failure) finds its job pipe closed and exits.

Every stage process leads a process group of its own and dies with the build's process
(``trtpack.processes``): whatever happens to the build (an error, Ctrl-C, SIGTERM, even
SIGKILL), the stage process and everything it started end with it.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import logging
import os
import subprocess
import sys
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from types import ModuleType
from typing import TypeAlias

from trtpack.errors import (
    AccuracyError,
    MemoryRefusal,
    MissingEnvironmentError,
    StageError,
    StageKilledError,
    TrtpackError,
    UserInputError,
    no_space_cause,
)
from trtpack.options import BuildPlan
from trtpack.pipeline.prestart import StartedProcess, move_output, start_stage_process
from trtpack.pipeline.stage import STAGES, Stage
from trtpack.processes import (
    ServedProcess,
    autogroup_nice,
    die_with_parent,
    lower_this_thread,
    set_autogroup_nice,
    tell_served,
)
from trtpack.stages.artifacts import Artifacts
from trtpack.stages.base import ProgressEvent, StageContext, StageOutcome, stage_logger

# what the build sends a stage's process: the stage's name, the plan, its folder, the build
# folder, the artifacts it reads and its log
StageJob: TypeAlias = tuple[str, BuildPlan, Path, Path, Artifacts, Path]

# A process started ahead of its stage's turn (``StageRuns.start_ahead``, ``warm_on_spare_core``)
# makes its warm imports this much nicer until its job or head start comes (``import_behind``):
# Linux's autogroup scheduler shares the CPUs equally among sessions, and each stage process
# leads one, so on two cores the three processes warming beside a small model's export took
# up to half of the export's core, whose Python is the build's critical path (issue 47).
BEHIND_NICENESS = 10
BEHIND_POLL_SECONDS = 0.05  # how often the waiting thread looks for the job while importing

# the stage whose process traces a PyTorch model for the memory pre-check
# (``memory_check.check_in_export``), before its own work
MEMORY_TRACED_IN = "export"


@dataclass(frozen=True)
class HeadStart:
    """What the build sends a ``Stage.head_start`` stage's process while the stage before it
    runs: the artifacts made so far, its folder and its log."""

    artifacts: Artifacts
    stage_dir: Path
    log_path: Path


class ChildStageError(TrtpackError):
    """A user error raised by a stage in its own process, with its message and exit code."""

    def __init__(self, message: str, exit_code: int, hint: str | None) -> None:
        super().__init__(message, hint=hint)
        self.exit_code = exit_code


def child_error(message: str, exit_code: int, hint: str | None) -> TrtpackError:
    """A stage process's error as the documented type of its exit code (what
    ``trtpack.build`` callers catch: ``UserInputError``, ``MissingEnvironmentError``,
    ``AccuracyError``), else a ``ChildStageError`` with that code."""
    if exit_code == UserInputError.exit_code:
        return UserInputError(message, hint=hint)
    if exit_code == MissingEnvironmentError.exit_code:
        return MissingEnvironmentError(message, hint=hint)
    if exit_code == AccuracyError.exit_code:
        error = AccuracyError(message)
        error.hint = hint
        return error
    return ChildStageError(message, exit_code, hint)


class StageProcess:
    """The process one isolated stage will run in, started (and warming up) ahead of time:
    started here, or taken from those the command started first (``pipeline.prestart``).
    Its output (native libraries' messages) goes to its stage log once ``prepare`` names it."""

    def __init__(self, stage: Stage, log_path: Path,
                 started: StartedProcess | None = None) -> None:
        self.stage = stage
        self._started = started or start_stage_process(stage.name, log_path,
                                                       stage.environment)
        self.process = self._started.process
        self._jobs = self._started.jobs
        self._messages = self._started.messages

    def prepare(self, plan: BuildPlan, build_dir: Path, log_path: Path,
                ahead: bool = False) -> None:
        """Send the build's plan (the stage module's ``warm_up`` may start on it) and the
        stage log, where the process's output goes from now on (with what it wrote before,
        when it was writing elsewhere). ``ahead``: the process was started ahead of its
        stage's turn, beside another stage: it imports behind that one (``import_behind``)."""
        self._started.stage_log = log_path
        moved = None if log_path == self._started.output else log_path
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # run() says why
            self._jobs.send((plan, build_dir, moved, ahead))

    def head_start(self, head_start: HeadStart) -> None:
        """Let the process start on its stage's work (``Stage.head_start``)."""
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # run() says why
            self._jobs.send(head_start)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def served(self) -> bool:
        """Forked by a stage server (``stage_client``): no child of this process."""
        return isinstance(self.process, ServedProcess)

    def run(self, ctx: StageContext, log_path: Path) -> StageOutcome:
        """``stage.run(ctx)`` in this process; progress comes back as it happens. A user error
        keeps its message and exit code; anything else becomes this process's exception with
        the traceback in the stage log."""
        name = self.stage.name
        job: StageJob = (name, ctx.plan, ctx.stage_dir, ctx.build_dir, ctx.artifacts,
                         log_path)
        try:
            try:
                self._jobs.send(job)
            except (BrokenPipeError, ConnectionResetError):
                self._ended(name)  # it died while warming up
            while True:
                try:
                    kind, payload = self._messages.recv()
                except EOFError:
                    self._ended(name)
                if kind == "progress":  # the stage process logged it already
                    ctx.on_progress(ProgressEvent(name, "update", payload))
                elif kind == "spare_core":
                    ctx.spare_core(payload)
                elif kind == "served_child":  # its ModelOpt worker, forked by the server
                    ctx.count_process(payload)
                elif kind == "outcome":
                    self._finish()
                    return payload  # type: ignore[no-any-return]
                elif kind == "no_space":
                    number, strerror, filename = payload
                    raise OSError(number, strerror, filename)
                elif kind == "memory_refused":
                    message, hint = payload
                    raise MemoryRefusal(message, hint=hint)
                elif kind == "user_error":
                    message, exit_code, hint = payload
                    raise child_error(message, exit_code, hint)
                else:
                    raise RuntimeError(payload)
        finally:
            self.stop()

    def _ended(self, name: str) -> None:
        """The process is gone without a result: why, as an exception."""
        code = self.process.wait()
        if code < 0:  # a signal: the OOM killer, a CI timeout, a user's kill -9
            raise StageKilledError(name, -code) from None
        raise RuntimeError(f"the {name} process ended without a result (exit code {code})"
                           ) from None

    def _finish(self) -> None:
        """The outcome is in hand: the process exits by itself; wait a little for it."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=30)

    def stop(self) -> None:
        """End the process and everything it started (at once), and close the pipes."""
        self._started.stop()


def _run_job(module_name: str, job: StageJob, messages: Connection) -> None:
    name, plan, stage_dir, build_dir, artifacts, log_path = job
    logger, handler = stage_logger(f"trtpack.stage.{name}.process", log_path)

    def forward(event: ProgressEvent) -> None:
        messages.send(("progress", event.message))

    def spare_core(model_bytes: int) -> None:
        messages.send(("spare_core", model_bytes))

    ctx = StageContext(plan, name, stage_dir, build_dir, artifacts, logger, forward,
                       spare_core)
    try:
        module = importlib.import_module(module_name)
        warnings = []
        if name == MEMORY_TRACED_IN:  # torch and the model code are imported here anyway
            from trtpack.pipeline.memory_check import check_in_export

            warnings = check_in_export(plan)
        outcome = module.run(ctx)
        outcome.warnings[:0] = warnings
        messages.send(("outcome", outcome))
    except MemoryRefusal as e:
        messages.send(("memory_refused", (str(e), e.hint)))
    except TrtpackError as e:
        message = e.message if isinstance(e, StageError) else str(e)
        messages.send(("user_error", (message, e.exit_code, e.hint)))
    except BaseException as e:
        logger.error("".join(traceback.format_exc()))
        full = no_space_cause(e)
        if full is not None:  # the build says it in words (pipeline.faults)
            messages.send(("no_space", (full.errno, full.strerror, full.filename)))
        else:
            messages.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        handler.close()


def _output_to(log_path: Path, before: Path) -> None:
    """From now on this process's output goes to ``log_path``, after what it wrote to
    ``before`` (removed once it is there; else the build moves it when it stops us)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if move_output(before, log_path):
        with contextlib.suppress(OSError):
            before.unlink()
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main(argv: list[str]) -> int:
    """The stage process: ``JOBS_FD MESSAGES_FD STAGE_NAME LOG_PATH``. It imports the stage's
    module and its warm imports (``import_warm``) first; the first message is ``(plan,
    build_dir, stage_log, ahead)`` for the module's optional ``warm_up(plan, build_dir)``
    (``stage_log``: where the output goes from now on, None to stay at ``LOG_PATH``;
    ``ahead``: import behind the stage that runs now, ``import_behind``); the second is the
    job."""
    die_with_parent()
    jobs = Connection(int(argv[0]), writable=False)
    messages = Connection(int(argv[1]), readable=False)
    # a process a stage server forks for this one (the ModelOpt worker) is no child of it:
    # the build counts it in the stage's memory by its pid (queued until the stage runs)
    tell_served(lambda pid: messages.send(("served_child", pid)))
    stage = next(s for s in STAGES if s.name == argv[2])
    stage_module = importlib.import_module(stage.module)
    # A stage may ask for other collector thresholds (export: tracing a model makes millions
    # of short-lived objects, and Python's default thresholds spend a good part of a small
    # model's export collecting them); what the imports made is frozen out of later
    # collections either way.
    thresholds = getattr(stage_module, "GC_THRESHOLDS", None)
    if thresholds is not None:
        gc.set_threshold(*thresholds)
    # The plan is here already when the build started this process (its warm_up, e.g. the
    # ModelOpt worker, then starts before the imports); a prestarted one imports first.
    planned = jobs.poll()
    if not planned:
        import_warm(stage, stage_module)
    try:
        plan, build_dir, stage_log, ahead = jobs.recv()
    except EOFError:  # not needed after all (cache hit, or the build ended)
        return 0
    if stage_log is not None:
        _output_to(stage_log, Path(argv[3]))
    warm_up = getattr(stage_module, "warm_up", None)
    if warm_up is not None:  # e.g. precision starts the ModelOpt worker
        warm_up(plan, build_dir)
    if planned and ahead:
        import_behind(stage, stage_module, jobs)
    elif planned:
        import_warm(stage, stage_module)
    gc.freeze()
    while True:
        try:
            job = jobs.recv()
        except EOFError:  # not needed after all (cache hit, or the build ended)
            return 0
        # a StageJob is a tuple, a HeadStart is not (not an isinstance test: this process
        # runs the module as __main__, and unpickles trtpack.pipeline.isolate's HeadStart)
        if isinstance(job, tuple):
            break
        _head_start(stage.name, stage_module, plan, build_dir, job)
    _run_job(stage.module, job, messages)
    messages.close()
    return 0


def import_quietly(modules: tuple[str, ...]) -> None:
    """Import ``modules`` (``Stage.warm_modules``) in order; ``module:function`` imports the
    module and calls its ``function()`` (an import done a particular way)."""
    for entry in modules:
        module, _, function = entry.partition(":")
        with contextlib.suppress(Exception):  # not installed: the stage says so when it runs
            imported = importlib.import_module(module)
            if function:
                getattr(imported, function)()


def import_warm(stage: Stage, module: ModuleType) -> None:
    """What a stage's process imports before its job: ``stage.warm_modules``, then what the
    stage module's optional ``preload()`` imports (the simplify's onnxsim)."""
    import_quietly(stage.warm_modules)
    _preload(module)


def _preload(module: ModuleType) -> None:
    preload = getattr(module, "preload", None)
    if preload is not None:
        with contextlib.suppress(Exception):  # the stage says what is missing when it runs
            preload()


def import_behind(stage: Stage, module: ModuleType, jobs: Connection) -> None:
    """``import_warm`` at a lower CPU priority while another stage runs, until the next
    message (the job, or a head start) is waiting on ``jobs``: on a thread of its own,
    ``BEHIND_NICENESS`` nicer (a thread its imports start inherits that: ONNX Runtime's
    telemetry), and this process's autogroup as much nicer where the group is the process's
    own (``processes.autogroup_nice``: the scheduler weighs sessions, not threads). The
    thread stops before its next module once the message is waiting, the autogroup is as it
    was once the thread ends or the message has come, and what the thread left is imported
    here, at the process's own priority."""
    import threading

    def imports() -> None:
        lower_this_thread(BEHIND_NICENESS)
        for entry in stage.warm_modules:
            if jobs.poll():
                return
            import_quietly((entry,))
        if not jobs.poll():
            _preload(module)

    group = autogroup_nice()
    lowered = group is not None and set_autogroup_nice(min(19, group + BEHIND_NICENESS))
    thread = threading.Thread(target=imports, name="trtpack-imports-behind", daemon=True)
    thread.start()
    try:
        while thread.is_alive() and not jobs.poll(BEHIND_POLL_SECONDS):
            pass
    finally:
        if lowered and group is not None:
            set_autogroup_nice(group)
    thread.join()
    import_warm(stage, module)  # what the thread left, at this process's priority


def _head_start(name: str, module: ModuleType, plan: BuildPlan, build_dir: Path,
                head_start: HeadStart) -> None:
    """The stage module's ``head_start(ctx)``. Whatever it raises is logged and left to the
    stage's ``run``, which does that work itself when there is no head start."""
    logger, handler = stage_logger(f"trtpack.stage.{name}.head_start", head_start.log_path)
    ctx = StageContext(plan, name, head_start.stage_dir, build_dir, head_start.artifacts,
                       logger, lambda event: None)  # its progress is logged, not shown
    try:
        module.head_start(ctx)
    except Exception:
        logger.warning("the head start failed; the stage does that work when it runs",
                       exc_info=True)
    finally:
        handler.close()


def end_process(code: int) -> None:
    """End the stage process once its outcome is sent and its files are closed, without
    the interpreter's teardown of what the stage imported: the build waits for the process
    to end (its memory back to the system before the next stage), and tearing down torch
    and transformers (or onnxsim) takes a noticeable part of a small model's build."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    end_process(main(sys.argv[1:]))
