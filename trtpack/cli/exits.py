"""How a command ends: the library's errors become one line and their exit code
(``handle_errors``, on every command); ``--debug`` adds the traceback."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from trtpack.cli.console import (
    print_accuracy_failure,
    print_error,
    print_interrupted,
    print_traceback,
)
from trtpack.errors import AccuracyError, ExitCode, TrtpackError

STATE: dict[str, bool] = {"debug": False}

F = TypeVar("F", bound=Callable[..., Any])


def handle_errors(func: F) -> F:
    """Turn the library's errors into a one-line message and their exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except TrtpackError as e:
            if isinstance(e, AccuracyError):
                print_accuracy_failure(e)
            else:
                print_error(e)
            if STATE["debug"]:  # the traceback is extra output, the exit code the same
                print_traceback(e)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            print_interrupted()
            raise typer.Exit(ExitCode.INTERRUPTED) from None

    return wrapper  # type: ignore[return-value]

