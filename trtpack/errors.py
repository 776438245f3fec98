"""Error types and the exit codes the CLI maps them to.

A ``TrtpackError`` is something the user can act on: the CLI prints its message on one
line and exits with its code. Every other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trtpack.report import BuildReport


class ExitCode:
    OK = 0
    ACCURACY = 1
    BAD_INPUT = 2
    MISSING_ENVIRONMENT = 3
    STAGE_FAILED = 4
    INTERRUPTED = 130
    BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a command cut off by `| head`


class TrtpackError(Exception):
    """Base for errors that are the user's to fix; ``exit_code`` is what the CLI returns."""

    exit_code: int = ExitCode.STAGE_FAILED
    hint: str | None = None
    report: BuildReport | None = None  # a failed build's report (OUT.failed/report.json)

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        if hint is not None:
            self.hint = hint


class UserInputError(TrtpackError):
    """Bad usage, recipe, profile or path (exit 2)."""

    exit_code = ExitCode.BAD_INPUT


class MemoryRefusal(UserInputError):
    """A profile corner whose memory estimate exceeds what this machine has (exit 2): the
    build stops with nothing written (``pipeline.memory_check``)."""


class RecipeError(UserInputError):
    """A recipe file that does not load or validate; the message names the file and field."""


class ProfileError(UserInputError):
    """A malformed or inconsistent shape profile; the message names the input and dimension."""


class MissingEnvironmentError(TrtpackError):
    """A package, GPU or tool that this machine does not have (exit 3)."""

    exit_code = ExitCode.MISSING_ENVIRONMENT


class StageError(TrtpackError):
    """A stage that failed to run (exit 4); ``log_path`` says where its details are."""

    exit_code = ExitCode.STAGE_FAILED

    def __init__(self, stage: str, message: str, *, log_path: Path | None = None) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message
        self.log_path = log_path

    def __str__(self) -> str:
        where = f" (log: {self.log_path})" if self.log_path else ""
        return f"stage '{self.stage}' failed: {self.message}{where}"


class StageKilledError(Exception):
    """A stage's process ended by a signal (``signal_number``) before sending its outcome;
    the pipeline says why in words (``pipeline.faults.killed_message``)."""

    def __init__(self, stage: str, signal_number: int) -> None:
        super().__init__(f"the {stage} process was killed by signal {signal_number}")
        self.stage = stage
        self.signal_number = signal_number


class AccuracyError(TrtpackError):
    """A verification gate that did not pass (exit 1); ``rows`` carry the numbers."""

    exit_code = ExitCode.ACCURACY

    def __init__(self, message: str, rows: list | None = None) -> None:  # type: ignore[type-arg]
        super().__init__(message)
        self.rows = rows or []


def require_modules(modules: dict[str, str], *, purpose: str, install: str) -> None:
    """Raise ``MissingEnvironmentError`` naming every missing package in ``modules``
    (import name → pip package), found with ``find_spec`` (nothing is imported)."""
    import importlib.util

    missing = []
    for module, package in modules.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(package)
    if missing:
        raise MissingEnvironmentError(
            f"{purpose} needs {', '.join(missing)}, not installed here",
            hint=f"pip install {install}")


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_ERRNO_TEXT = re.compile(r"\[Errno (\d+)\]")


def no_space_cause(exc: BaseException) -> OSError | None:
    """The ENOSPC/EDQUOT ``OSError`` behind ``exc`` (its cause/context chain), or a stand-in
    when only the message carries it (an exporter that re-raised it as text)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in NO_SPACE:
            return e
        e = e.__cause__ or e.__context__
    for m in _ERRNO_TEXT.finditer(str(exc)):
        if int(m.group(1)) in NO_SPACE:
            return OSError(int(m.group(1)), "No space left on device"
                           if int(m.group(1)) == errno.ENOSPC else "Disk quota exceeded")
    return None


def first_line(error: BaseException, empty: str | None = None) -> str:
    """The first line of an exception's message, for a one-line error that quotes what a
    library or the user's code raised; ``empty`` (default: the exception's type name) where
    the message has none."""
    return (str(error).strip().splitlines() or [empty or type(error).__name__])[0]
