"""The ModelOpt worker's template in a stage server (``pipeline.stage_server``).

A fresh ModelOpt worker (``precision.modelopt_jobs.ModelOptWorker``) spends seconds of CPU
importing torch and ModelOpt before its one job, and a precision stage starts one per
conversion. The server's ``modelopt`` template imports what a worker of each of
``MODELOPT_MODES`` imports (``modelopt_worker.preload``) once, in the environment a worker runs
in (``worker_environment``) and a working directory of its own; per job it forks the worker:
its own session, the job's throw-away working directory (ModelOpt writes files there), the
requester's worker environment, stdin (the job's path), stdout and stderr, then
``modelopt_worker.main`` as a fresh worker runs it. Each job runs in a copy of a process that
has only imported, as a fresh worker does (ModelOpt patches ``onnxruntime.quantization`` when
it quantizes, in that copy only).
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path

from trtpack.precision.modelopt_jobs import MODELOPT_MODES, worker_environment


def template_directory(folder: Path) -> Path:
    """The template's working directory in the server's ``folder`` (ModelOpt writes nothing
    there: each job runs in its own)."""
    return folder / ".modelopt-template"


def prepare(folder: Path) -> Callable[[], None]:
    """Make this process (the template, before its imports) a worker's environment and a
    working directory of its own under ``folder``; returns its imports, to be made."""
    os.environ.update(worker_environment(os.environ))
    cwd = template_directory(folder)
    cwd.mkdir(exist_ok=True)
    os.chdir(cwd)

    def imports() -> None:
        from trtpack.precision import modelopt_worker

        for mode in MODELOPT_MODES:
            modelopt_worker.preload(mode)

    return imports


def become_worker(fds: list[int], led: int, request: Mapping[str, object],
                  environment: Mapping[str, str]) -> None:
    """Become the worker of ``request`` (never returns): ``fds`` its stdin, stdout and
    stderr, ``environment`` its environment; ``led`` closed once it leads its session (the
    monitor then sends its pid: its group may be ended at once)."""
    code = 1
    try:
        os.setsid()
        os.close(led)
        from trtpack.precision import modelopt_worker  # imported by the template already

        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(str(request["cwd"]))
        os.environ.clear()
        os.environ.update(environment)
        argv = [str(a) for a in request["argv"]]  # type: ignore[attr-defined]
        sys.argv = [modelopt_worker.__file__, *argv]
        code = modelopt_worker.main(argv)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
