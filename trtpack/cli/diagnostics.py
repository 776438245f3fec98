"""``trtpack doctor``, ``trtpack targets`` and ``trtpack inspect``: what this machine has and
can build, and what an engine or model repository is; over ``trtpack.diagnostics`` and
``trtpack.machine``, shown by ``trtpack.cli.views``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trtpack.cli.exits import handle_errors

commands = typer.Typer()


@commands.command()
@handle_errors
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
) -> None:
    """Show what is installed: Python packages, GPU, TensorRT — and what that allows."""
    from trtpack.cli.views import print_doctor, print_json
    from trtpack.diagnostics.doctor import environment_report

    report = environment_report()
    if as_json:
        print_json(report)
    else:
        print_doctor(report)


@commands.command()
@handle_errors
def targets() -> None:
    """List the deployment targets: instance families, their GPUs and compute capability.

    The 'here' column marks the targets whose engines this machine's GPU can build."""
    from trtpack.cli.views import print_targets
    from trtpack.machine.gpus import detect_gpu
    from trtpack.machine.local_targets import targets_table

    print_targets(targets_table(detect_gpu()))


@commands.command()
@handle_errors
def inspect(
    path: Annotated[Path, typer.Argument(help="A trtpack build folder (or a failed build's "
                                               "OUT.failed), a Triton model repository (or "
                                               "one model of it), an ONNX file or a "
                                               "model.plan.")],
    check: Annotated[bool, typer.Option(
        "--check", help="Exit 3 unless every engine found can run on this machine (ONNX "
        "Runtime models: loaded here).")] = False,
) -> None:
    """Show what PATH is (build, repository, ONNX file, engine): its precision, provenance
    and I/O, and whether it can run on this machine."""
    from trtpack.cli.views import print_inspection
    from trtpack.diagnostics.inspection import inspect_path
    from trtpack.errors import MissingEnvironmentError

    result = inspect_path(path, load_onnx=check)
    print_inspection(result)
    if check and result.runs_here is not True:
        reasons = [r for e in result.all_engines() for r in e.reasons] + \
            [r for m in result.models if m.onnx for r in m.onnx.reasons]
        raise MissingEnvironmentError("cannot run here: " + (
            "; ".join(reasons) or "no engine or ONNX Runtime model found"))

