"""Child processes that never outlive the build: each stage process leads a process group of
its own (so the build can end it and everything it started in one call), and the kernel ends
it when the process that started it dies, even by SIGKILL (Linux ``PR_SET_PDEATHSIG``)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

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


def python_module_command(module: str, *args: str) -> list[str]:
    """The command line of ``python -m module args...`` in this interpreter, importing the
    installed packages wherever it is started (never the working directory's)."""
    return [sys.executable, "-c", _RUN_MODULE, module, *args]


def python_code_command(code: str) -> list[str]:
    """The command line of ``python -c code`` in this interpreter, importing the installed
    packages wherever it is started (never the working directory's)."""
    return [sys.executable, "-c", _SAFE_PATH + code]
