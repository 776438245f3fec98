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
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TypeAlias

from trtpack.errors import MemoryRefusal, StageError, StageKilledError, TrtpackError, no_space_cause
from trtpack.options import BuildPlan
from trtpack.pipeline.stage import Stage
from trtpack.processes import die_with_parent, kill_group
from trtpack.stages.artifacts import Artifacts
from trtpack.stages.base import ProgressEvent, StageContext, StageOutcome, stage_logger

# what the build sends a stage's process: the stage's name, the options, its folder, the build
# folder, the artifacts it reads and its log
StageJob: TypeAlias = tuple[str, BuildPlan, Path, Path, Artifacts, Path]

# the stage whose process traces a PyTorch model for the memory pre-check
# (``memory_check.check_in_export``), before its own work
MEMORY_TRACED_IN = "export"


class ChildStageError(TrtpackError):
    """A user error raised by a stage in its own process, with its message and exit code."""

    def __init__(self, message: str, exit_code: int, hint: str | None) -> None:
        super().__init__(message, hint=hint)
        self.exit_code = exit_code


class StageProcess:
    """The process one isolated stage will run in, started (and warming up) ahead of time.
    Its output (native libraries' messages) goes to ``log_path``."""

    def __init__(self, stage: Stage, log_path: Path, options: BuildPlan,
                 build_dir: Path) -> None:
        self.stage = stage
        jobs_r, jobs_w = os.pipe()  # build -> stage: the job
        messages_r, messages_w = os.pipe()  # stage -> build: progress, then the outcome
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "trtpack.pipeline.isolate", str(jobs_r),
                 str(messages_w), stage.module, *stage.warm_modules],
                pass_fds=(jobs_r, messages_w), start_new_session=True,
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
            )
        os.close(jobs_r)
        os.close(messages_w)
        self._jobs = Connection(jobs_w, readable=False)
        self._messages = Connection(messages_r, writable=False)
        # what the stage may start ahead of its job (its module's ``warm_up``)
        self._jobs.send((options, build_dir))

    @property
    def pid(self) -> int:
        return self.process.pid

    def run(self, ctx: StageContext, log_path: Path) -> StageOutcome:
        """``stage.run(ctx)`` in this process; progress comes back as it happens. A user error
        keeps its message and exit code; anything else becomes this process's exception with
        the traceback in the stage log."""
        name = self.stage.name
        job: StageJob = (name, ctx.options, ctx.stage_dir, ctx.build_dir, ctx.artifacts,
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
                    raise ChildStageError(message, exit_code, hint)
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
        if self.process.poll() is None:
            kill_group(self.process.pid)
        self.process.wait()
        kill_group(self.process.pid)  # anything it started that is still running
        self._jobs.close()
        self._messages.close()


def _run_job(module_name: str, job: StageJob, messages: Connection) -> None:
    name, options, stage_dir, build_dir, artifacts, log_path = job
    logger, handler = stage_logger(f"trtpack.stage.{name}.process", log_path)

    def forward(event: ProgressEvent) -> None:
        messages.send(("progress", event.message))

    ctx = StageContext(options, name, stage_dir, build_dir, artifacts, logger, forward)
    try:
        module = importlib.import_module(module_name)
        warnings = []
        if name == MEMORY_TRACED_IN:  # torch and the model code are imported here anyway
            from trtpack.pipeline.memory_check import check_in_export

            warnings = check_in_export(options)
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


def main(argv: list[str]) -> int:
    """The stage process: ``JOBS_FD MESSAGES_FD STAGE_MODULE [WARM_MODULE...]``. The
    first message is ``(options, build_dir)`` for the stage module's optional
    ``warm_up(options, build_dir)``; the second is the job."""
    die_with_parent()
    jobs = Connection(int(argv[0]), writable=False)
    messages = Connection(int(argv[1]), readable=False)
    try:
        options, build_dir = jobs.recv()
    except EOFError:
        return 0
    stage_module = importlib.import_module(argv[2])
    # A stage may ask for other collector thresholds (export: tracing a model makes millions
    # of short-lived objects, and Python's default thresholds spend a good part of a small
    # model's export collecting them); what the imports made is frozen out of later
    # collections either way.
    thresholds = getattr(stage_module, "GC_THRESHOLDS", None)
    if thresholds is not None:
        gc.set_threshold(*thresholds)
    warm_up = getattr(stage_module, "warm_up", None)
    if warm_up is not None:  # e.g. precision starts the ModelOpt worker
        warm_up(options, build_dir)
    for module in argv[3:]:
        with contextlib.suppress(Exception):  # not installed: the stage says so when it runs
            importlib.import_module(module)
    gc.freeze()
    try:
        job = jobs.recv()
    except EOFError:  # not needed after all (cache hit, or the build ended)
        return 0
    _run_job(argv[2], job, messages)
    messages.close()
    return 0


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
