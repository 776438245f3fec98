"""A stage process asked of a stage server (``pipeline.stage_server``), when one is named.

``TRTPACK_STAGE_SERVER=FOLDER`` names a running server's folder; ``served_process`` asks the
template of a stage for its process and returns a handle that reads like the
``subprocess.Popen`` it replaces (``processes.ServedProcess``: ``pid``, ``poll``, ``wait``,
``returncode``), or None when there is no server, no template for that stage, or the
template refuses (the build's environment differs in a variable its imports may have read):
the caller then starts a fresh process, as without a server. The stage process is no child
of the build: the handle's connection is what ties them (the server kills the process's
group when it closes), and ``pid`` is its process group's, for ``processes.kill_group`` as
before.

This module imports nothing heavy: ``pipeline.prestart`` uses it as the command starts.
"""

from __future__ import annotations

import os
from pathlib import Path

from trtpack.processes import ServedProcess
from trtpack.processes import served_process as from_template


def served_process(stage: str, log_path: Path, jobs_read: int, messages_write: int,
                   log_fd: int) -> ServedProcess | None:
    """The stage process of ``stage`` from the named server's template (its pipes' ends and
    log passed to it), or None: start a fresh one."""
    request = {"log_path": str(log_path), "cwd": os.getcwd(), "environment": dict(os.environ)}
    return from_template(stage, request, [jobs_read, messages_write, log_fd])
