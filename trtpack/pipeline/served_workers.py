"""Templates in a stage server (``pipeline.stage_server``) for the processes trtpack starts per
job besides the stages': the ModelOpt worker (``precision.modelopt_jobs.ModelOptWorker``) and a
PyTorch source's description (``pytorch.describe_process``).

Each spends seconds of CPU importing torch (and ModelOpt) before its one job, and a build
starts one per conversion (per PyTorch source). Such a process's template imports what a fresh
one of its kind imports (``HELPERS``: ``modelopt_worker.preload`` of each of
``MODELOPT_MODES``; torch, its compiler's settings and ``pytorch.describe``) once, in the
environment that kind runs in (``Helper.environment``) and a working directory of its own; per
job it forks the process: its own session, the job's working directory (a worker's throw-away
folder: ModelOpt writes files there), the requester's environment for that kind, stdin,
stdout and stderr, then the module's ``main`` as a fresh process runs it. Each job runs in a
copy of a process that has only imported, as a fresh one has (ModelOpt patches
``onnxruntime.quantization`` when it quantizes, in that copy only; a user's model code is
imported there only).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from trtpack.precision.modelopt_jobs import MODELOPT_MODES, WORKER_TEMPLATE, worker_environment
from trtpack.processes import become_served, checkout_environment, exit_with
from trtpack.pytorch.describe_process import DESCRIBE_TEMPLATE


def _modelopt_imports() -> None:
    from trtpack.precision import modelopt_worker

    for mode in MODELOPT_MODES:
        modelopt_worker.preload(mode)


def _modelopt_run(argv: list[str]) -> int:
    from trtpack.precision import modelopt_worker

    sys.argv = [modelopt_worker.__file__, *argv]
    return modelopt_worker.main(argv)


def _describe_imports() -> None:
    # torch.export, which describes the module, imports torch's compiler settings (which set
    # TORCHINDUCTOR_CACHE_DIR, as in a fresh process): seconds, made here once
    import torch._inductor.config  # noqa: F401

    import trtpack.pytorch.describe  # noqa: F401


def _describe_run(argv: list[str]) -> int:
    from trtpack.pytorch import describe

    sys.argv = [describe.__file__, *argv]
    describe.main()
    return 0


@dataclass(frozen=True)
class Helper:
    """A kind of process a template forks per job: its environment (from the requester's, or
    the server's for the template itself), its imports, and its job (``argv`` -> exit code)."""

    environment: Callable[[Mapping[str, str]], dict[str, str]]
    imports: Callable[[], None]
    run: Callable[[list[str]], int]


HELPERS: dict[str, Helper] = {
    WORKER_TEMPLATE: Helper(worker_environment, _modelopt_imports, _modelopt_run),
    DESCRIBE_TEMPLATE: Helper(checkout_environment, _describe_imports, _describe_run),
}


def template_directory(folder: Path, name: str) -> Path:
    """The working directory of template ``name`` in the server's ``folder`` (nothing is
    written there: each job runs in its own)."""
    return folder / f".{name}-template"


def prepare(folder: Path, name: str) -> Callable[[], None]:
    """Make this process (the template ``name``, before its imports) its kind's environment and
    a working directory of its own under ``folder``; returns its imports, to be made."""
    helper = HELPERS[name]
    os.environ.update(helper.environment(os.environ))
    cwd = template_directory(folder, name)
    cwd.mkdir(exist_ok=True)
    os.chdir(cwd)
    return helper.imports


def become_worker(name: str, fds: list[int], led: int, request: Mapping[str, object],
                  environment: Mapping[str, str]) -> NoReturn:
    """Become the process of ``request`` of kind ``name`` (never returns): ``fds`` its stdin,
    stdout and stderr, ``environment`` its environment; ``led`` closed once it leads its
    session (the monitor then sends its pid: its group may be ended at once)."""
    def run() -> int:
        stdin, stdout, stderr = fds
        become_served(led, (stdin, stdout, stderr), str(request["cwd"]), environment)
        return HELPERS[name].run([str(a) for a in request["argv"]])  # type: ignore[attr-defined]

    exit_with(run)
