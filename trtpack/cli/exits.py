"""How a command ends: the library's errors become one line and their exit code
(``handle_errors``, on every command); ``--debug`` adds the traceback. A reader that
leaves (``trtpack ... | head``) ends the command quietly with exit 141."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import typer

from trtpack.cli.console import (
    print_accuracy_failure,
    print_error,
    print_interrupted,
    print_traceback,
)
from trtpack.errors import AccuracyError, ExitCode, TrtpackError

STATE: dict[str, bool] = {"debug": False}

P = ParamSpec("P")
R = TypeVar("R")


def quiet_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit cannot fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def handle_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn the library's errors into a one-line message and their exit code."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
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
        except BrokenPipeError:  # `trtpack ... | head`: the reader left; end quietly
            quiet_stdout()
            raise typer.Exit(ExitCode.BROKEN_PIPE) from None

    return wrapper

