"""The ``trtpack`` command line: the typer app, its options and ``main``. The commands are
typer commands of a few lines each over the library, one module per group (``build``,
``diagnostics``, ``outputs``, ``recipes``, ``cache``); ``trtpack.cli.console`` renders what
they return. Errors the user can fix are one line and an exit code; ``--debug`` shows
tracebacks."""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperOption

from trtpack import __version__
from trtpack.cli import build, cache, diagnostics, fleet, outputs, recipes
from trtpack.cli.console import out, print_interrupted, print_usage_error
from trtpack.cli.exits import STATE, quiet_stdout
from trtpack.errors import ExitCode

app = typer.Typer(
    name="trtpack",
    help="Compile PyTorch / Hugging Face models into verified, ready-to-serve Triton models.\n\n"
    "\b\nExamples:\n"
    "  trtpack build minilm --target cpu    # any machine, offline\n"
    "  trtpack build minilm --target cpu --precision int8\n"
    "  trtpack recipes list                 # which recipes build offline\n"
    "With an NVIDIA GPU and TensorRT (an engine for AWS g5 instances):\n"
    "  trtpack build bert-large --profile 1x128:16x128:128x128 --target g5",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    # plain click help: rich's option panels cut option names and values ('--calibration-met…')
    # in 80 columns, and would read brackets in help text as markup
    rich_markup_mode=None,
)



class PlainArgument(TyperArgument):
    """An argument shown as a person writes it: ``MODEL``, ``BUILD_DIR...`` (typer shows
    ``{model}`` and its Python type, ``<str>``, ``<list[Path]>``)."""

    def display_type(self, ctx: Any) -> str:
        return ""  # the name says what it is

    def _rich_display_name(self) -> str:
        name = self.metavar or (self.name or "value").upper()
        return name if self.nargs == 1 or name.endswith("...") else f"{name}..."

    def _usage_display_name(self) -> str:
        name = self._rich_display_name()
        return name if self.required or self.nargs != 1 else f"[{name}]"


class PlainOption(TyperOption):
    """An option's value shown as a word (``--out DIR``), not its Python type (``<path>``):
    every option names its own metavar; this is the fallback for one that does not."""

    def display_type(self, ctx: Any) -> str:
        return {Path: "PATH", int: "N", float: "NUMBER"}.get(
            self.type_descriptor.annotation, (self.name or "value").upper())


class PlainHelpCommand(TyperCommand):
    """Every command's help with ``PlainArgument`` and ``PlainOption`` placeholders."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if type(param) is TyperArgument:
                param.__class__ = PlainArgument
            elif type(param) is TyperOption:
                param.__class__ = PlainOption


for group in (build.commands, diagnostics.commands, outputs.commands, recipes.commands,
              cache.commands, fleet.commands):
    for info in group.registered_commands:
        if info.cls in (None, TyperCommand):
            info.cls = PlainHelpCommand

app.add_typer(build.commands)
app.add_typer(diagnostics.commands)
app.add_typer(outputs.commands)
app.add_typer(recipes.commands, name="recipes")
app.add_typer(cache.commands, name="cache")
app.add_typer(fleet.commands, name="fleet")


def show_version(value: bool) -> None:
    if value:
        out.print(f"trtpack {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of errors.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=show_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    STATE["debug"] = debug


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # a killed build cleans up like an interrupted one


def main() -> None:
    import os
    import signal

    from typer.exceptions import Abort, TyperException

    signal.signal(signal.SIGTERM, _terminate)
    try:
        # not standalone: typer's usage errors come here to be one line like trtpack's own
        code = app(prog_name="trtpack", standalone_mode=False)
    except TyperException as e:  # a usage error (exit 2), or no arguments (the help)
        ctx = getattr(e, "ctx", None)
        if type(e).__name__ == "NoArgsIsHelpError":  # its message is the help
            sys.stderr.write(e.format_message() + "\n")
        else:
            print_usage_error(e.format_message(), ctx.command_path if ctx else None)
        code = e.exit_code
    except Abort:
        print_interrupted()
        code = ExitCode.INTERRUPTED
    except SystemExit as e:
        code = e.code
    except BrokenPipeError:  # outside a command (--version)
        quiet_stdout()
        code = ExitCode.BROKEN_PIPE
    if code == 1 and type(sys.stdout).__name__.endswith("PacifyFlushWrapper"):
        # click met the broken pipe (--help | head) and exits 1: that code means a failed
        # accuracy check here, so end as a command cut off by its reader does
        quiet_stdout()
        code = ExitCode.BROKEN_PIPE
    if code == ExitCode.INTERRUPTED:
        # cleaned up and said so: leave without the interpreter's shutdown, where about one
        # interrupted build in 20 ended by SIGINT (-2) instead of 130
        from trtpack.pipeline.prestart import end_untaken

        end_untaken()  # os._exit skips trtpack.cli.main's own cleanup
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(ExitCode.INTERRUPTED)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
