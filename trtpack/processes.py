"""Child processes that never outlive the build: each stage process leads a process group of
its own (so the build can end it and everything it started in one call), and the kernel ends
it when the process that started it dies, even by SIGKILL (Linux ``PR_SET_PDEATHSIG``).

Where ``TRTPACK_STAGE_SERVER`` names a stage server (``pipeline.stage_server``), such a process
may instead be forked from one of the server's warm templates (``served_process``): a stage's
process (``pipeline.stage_client``) or a ModelOpt worker (``precision.modelopt_jobs``). This
module imports nothing heavy: ``pipeline.prestart`` uses it as the command starts.
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
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NoReturn, Protocol

from trtpack.errors import no_space_cause

PR_SET_PDEATHSIG = 1  # linux/prctl.h
# run_forked's exit code when the target failed on a full disk (ENOSPC, EDQUOT)
NO_SPACE_EXIT = 28


def die_with_parent() -> None:
    """End this process when its parent dies: the kernel's parent-death signal where there is
    one (Linux), else a thread polling the parent's pid once a second."""
    parent = os.getppid()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
            raise OSError(ctypes.get_errno(), "prctl")
    except (OSError, AttributeError):
        def watch() -> None:
            while os.getppid() == parent:
                time.sleep(1.0)
            os._exit(1)

        threading.Thread(target=watch, name="trtpack-parent-watch", daemon=True).start()
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


def exit_with(body: Callable[[], int]) -> NoReturn:
    """End this forked process with ``body()``'s exit code (1 where it raised: its traceback on
    stderr), its output flushed, without the interpreter's teardown of what the parent had
    imported."""
    code = 1
    try:
        code = body()
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def become_served(led: int, std: tuple[int, int, int], cwd: str,
                  environment: Mapping[str, str]) -> None:
    """Turn a process a template forked for a request into that request's process: it leads a
    session of its own (``led`` closed then: the monitor waits for that to send its pid, and
    the build may end the group at once), ``std`` become its stdin, stdout and stderr (the
    originals closed), SIGINT and SIGTERM act as in a fresh process, and it runs in ``cwd``
    with ``environment`` only."""
    os.setsid()
    os.close(led)
    for target, fd in enumerate(std):
        os.dup2(fd, target)
    for fd in set(std) - {0, 1, 2}:
        os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environment)


# --- CPU priority of work done ahead of its turn -------------------------------------------

AUTOGROUP = Path("/proc/self/autogroup")  # Linux: this process's autogroup and its nice value
AUTOGROUP_TRIES = 40  # the kernel takes one change of any autogroup per 100 ms (else EAGAIN)
AUTOGROUP_RETRY_SECONDS = 0.025


def autogroup_nice() -> int | None:
    """The nice value of this process's autogroup when the group is this process's alone (it
    leads its session, as a stage process does, and has no child process: the precision
    stage's ModelOpt worker would share it) and the kernel has autogroups; else None.
    Linux's autogroup scheduler gives each session's group an equal share of the CPUs,
    whatever its processes' own nice values: a process's priority against the build's
    other processes is its group's."""
    import psutil

    if not sys.platform.startswith("linux") or os.getsid(0) != os.getpid() \
            or psutil.Process().children():
        return None
    try:
        words = AUTOGROUP.read_text().split()
        return int(words[words.index("nice") + 1])
    except (OSError, ValueError, IndexError):
        return None


def set_autogroup_nice(value: int) -> bool:
    """Set this process's autogroup's nice value (to no less than it was, or as privilege
    allows), retrying while the kernel asks to wait; whether it is set."""
    for _ in range(AUTOGROUP_TRIES):
        try:
            AUTOGROUP.write_text(f"{value}\n")
            return True
        except BlockingIOError:  # EAGAIN: another change of an autogroup in the last 100 ms
            time.sleep(AUTOGROUP_RETRY_SECONDS)
        except OSError:
            return False
    return False


def lower_this_thread(niceness: int) -> None:
    """Raise the calling thread's nice value by ``niceness`` (Linux: the value is the
    thread's own; its later threads and children inherit it). Unprivileged, it cannot be
    lowered again: only a thread whose work ends with it is lowered."""
    if not sys.platform.startswith("linux"):
        return
    thread = threading.get_native_id()
    with contextlib.suppress(OSError):
        now = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, min(19, now + niceness))


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (a stage process and all it started)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def run_forked(target: Callable[..., int], args: tuple[object, ...], timeout: float,
               output: Path) -> int | None:
    """``target(*args)`` in a forked copy of this process (what it imported stays imported,
    so nothing is loaded twice), its stdout and stderr written to ``output``. Returns its
    exit code, or None when it ran past ``timeout`` seconds and was killed. Linux and macOS
    (``os.fork``). A target that fails on a full disk exits with ``NO_SPACE_EXIT``."""
    pid = os.fork()
    if pid == 0:  # the copy: never returns
        code = 1
        try:
            fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            code = target(*args)
        except BaseException as e:
            code = NO_SPACE_EXIT if no_space_cause(e) is not None else 1
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    deadline = time.monotonic() + timeout
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return None
            time.sleep(0.02)
    except BaseException:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        raise


# Run by every Python child process trtpack starts, before anything is imported: ``python -c``
# puts the working directory first on ``sys.path`` ('' ; ``-m`` puts its full path there),
# so a folder named ``trtpack/`` (or ``triton/``, ``onnx/``) where the user stands would
# shadow the installed packages. ``-P`` / ``PYTHONSAFEPATH`` would do this, from Python 3.11
# only; with them nothing is put there and nothing is dropped.
_SAFE_PATH = "import sys\nif sys.path and sys.path[0] == '':\n    del sys.path[0]\n"
_RUN_MODULE = (_SAFE_PATH + "import runpy\nmodule = sys.argv.pop(1)\n"
               "runpy.run_module(module, run_name='__main__', alter_sys=True)\n")


def checkout_environment(environment: Mapping[str, str]) -> dict[str, str]:
    """``environment`` with this checkout first on ``PYTHONPATH``: a process started with it
    imports this trtpack wherever it stands (a ModelOpt worker, a PyTorch source's
    description)."""
    env = dict(environment)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def python_module_command(module: str, *args: str) -> list[str]:
    """The command line of ``python -m module args...`` in this interpreter, importing the
    installed packages wherever it is started (never the working directory's)."""
    return [sys.executable, "-c", _RUN_MODULE, module, *args]


def python_code_command(code: str) -> list[str]:
    """The command line of ``python -c code`` in this interpreter, importing the installed
    packages wherever it is started (never the working directory's)."""
    return [sys.executable, "-c", _SAFE_PATH + code]


# --- processes forked from a stage server's templates ---------------------------------------

STAGE_SERVER_ENV = "TRTPACK_STAGE_SERVER"
"""The folder of the stage server this build's stage processes (and ModelOpt workers) are asked
of (unset or empty: each is started fresh)."""
REPLY_SECONDS = 30.0  # a template forks at once; beyond this the fresh start is quicker
_log = logging.getLogger(__name__)  # why a process was not served (debug: not shown)


class ChildProcess(Protocol):
    """What a build uses of a process it started: ``subprocess.Popen`` or ``ServedProcess``."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class ServedProcess:
    """A process a template forked: no child of this process, tied to it by ``connection``
    (the server kills the process's group when it closes); its exit status comes over it.
    ``pid`` leads its own session (``kill_group``)."""

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
            raise subprocess.TimeoutExpired(f"served process {self._pid}", timeout or 0.0)
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


_SERVED_LISTENERS: list[Callable[[int], None]] = []


def tell_served(listener: Callable[[int], None]) -> None:
    """From now on, ``listener`` gets the pid of every process served to this one: a stage
    process tells its build, which counts that process (no child of the stage's) in the
    stage's memory."""
    _SERVED_LISTENERS.append(listener)


def served_process(template: str, request: Mapping[str, object],
                   fds: Sequence[int]) -> ServedProcess | None:
    """A process forked by the named server's ``template`` for ``request`` (its working
    directory, environment, ...) with ``fds`` passed to it (``SCM_RIGHTS``), or None: no
    server, no such template, or it refused (start a fresh process)."""
    folder = server_folder()
    if folder is None:
        return None
    path = folder / f"{template}.sock"
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        connection.connect(str(path))
        socket.send_fds(connection, [pickle.dumps(dict(request))], list(fds))
        ready, _, _ = select.select([connection], [], [], REPLY_SECONDS)
        reply = connection.recv(4096) if ready else b""
        kind, value = pickle.loads(reply) if reply else ("gone", "no reply")
    except (OSError, pickle.UnpicklingError, ValueError, EOFError) as e:
        kind, value = "gone", type(e).__name__
    if kind != "started":
        _log.debug("%s: no process from %s (%s: %s); starting one", template, path, kind,
                   value)
        with contextlib.suppress(OSError):
            connection.close()  # a process it started, late, is killed with it
        return None
    served = ServedProcess(connection, int(value))
    for listener in _SERVED_LISTENERS:
        listener(served.pid)
    return served
