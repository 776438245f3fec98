"""A stage process asked of a stage server (``pipeline.stage_server``), when one is named.

``TRTPACK_STAGE_SERVER=FOLDER`` names a running server's folder; ``served_process`` asks the
template of a stage for its process and returns a handle that reads like the
``subprocess.Popen`` it replaces (``pid``, ``poll``, ``wait``, ``returncode``), or None
when there is no server, no template for that stage, or the template refuses (the build's
environment differs in a variable its imports may have read): the caller then starts a
fresh process, as without a server. The stage process is no child of the build: the
handle's connection is what ties them (the server kills the process's group when it
closes), and ``pid`` is its process group's, for ``processes.kill_group`` as before.

This module imports nothing heavy: ``pipeline.prestart`` uses it as the command starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import select
import signal
import socket
import subprocess
from pathlib import Path
from typing import Protocol

STAGE_SERVER_ENV = "TRTPACK_STAGE_SERVER"
"""The folder of the stage server this build's stage processes are asked of (unset or
empty: each is started fresh)."""
REPLY_SECONDS = 30.0  # a template forks at once; beyond this the fresh start is quicker
_log = logging.getLogger(__name__)  # why a stage process was not served (debug: not shown)


class ChildProcess(Protocol):
    """What the build uses of a stage's process: ``subprocess.Popen`` or ``ServedProcess``."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class ServedProcess:
    """A stage process a template forked: its exit status comes over the connection."""

    def __init__(self, connection: socket.socket, pid: int) -> None:
        self._connection = connection
        self._pid = pid
        self._returncode: int | None = None

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> int | None:
        return self._returncode

    def poll(self) -> int | None:
        if self._returncode is None:
            self._receive(0.0)
        return self._returncode

    def wait(self, timeout: float | None = None) -> int:
        if self._returncode is None:
            self._receive(timeout)
        if self._returncode is None:
            raise subprocess.TimeoutExpired(f"stage process {self._pid}", timeout or 0.0)
        return self._returncode

    def _receive(self, timeout: float | None) -> None:
        ready, _, _ = select.select([self._connection], [], [], timeout)
        if not ready:
            return
        try:
            data = self._connection.recv(4096)
        except OSError:
            data = b""
        if data:
            kind, code = pickle.loads(data)
            self._returncode = int(code) if kind == "exit" else -signal.SIGKILL
        else:  # the monitor is gone without a word: the process died with it (SIGKILL)
            self._returncode = -signal.SIGKILL
        self._connection.close()


def server_folder() -> Path | None:
    folder = os.environ.get(STAGE_SERVER_ENV, "")
    return Path(folder) if folder else None


def served_process(stage: str, log_path: Path, jobs_read: int, messages_write: int,
                   log_fd: int) -> ServedProcess | None:
    """The stage process of ``stage`` from the named server's template (its pipes' ends and
    log passed to it), or None: start a fresh one."""
    folder = server_folder()
    if folder is None:
        return None
    path = folder / f"{stage}.sock"
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        connection.connect(str(path))
        request = {"log_path": str(log_path), "cwd": os.getcwd(),
                   "environment": dict(os.environ)}
        socket.send_fds(connection, [pickle.dumps(request)],
                        [jobs_read, messages_write, log_fd])
        ready, _, _ = select.select([connection], [], [], REPLY_SECONDS)
        reply = connection.recv(4096) if ready else b""
        kind, value = pickle.loads(reply) if reply else ("gone", "no reply")
    except (OSError, pickle.UnpicklingError, ValueError, EOFError) as e:
        kind, value = "gone", type(e).__name__
    if kind != "started":
        _log.debug("stage %s: no process from %s (%s: %s); starting one", stage, path, kind,
                   value)
        with contextlib.suppress(OSError):
            connection.close()  # a stage it started, late, is killed with it
        return None
    return ServedProcess(connection, int(value))
