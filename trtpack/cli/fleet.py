"""``trtpack fleet plan``: a fleet manifest (the models a platform serves and the instance
types to serve them on) as the job matrix CI runs. Thin wrappers over ``trtpack.api.fleet``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from trtpack.cli.exits import handle_errors

commands = typer.Typer(help="A fleet: many models on many instance types, from one manifest.",
                       no_args_is_help=True, rich_markup_mode=None)


@commands.command("plan")
@handle_errors
def plan(
    manifest: Annotated[Path, typer.Argument(
        metavar="MANIFEST", help="The fleet manifest (YAML: models, instance_types).")],
) -> None:
    """Print the job matrix of MANIFEST as one line of JSON: one job per model and
    instance type, each with its convert command (trtpack build ... --no-engine)
    and engine command. Over 256 jobs (GitHub's limit per matrix) is refused.

    \b
    In a GitHub Actions workflow (.github/workflows/gpu.yml runs fleet.yaml):
      plan: echo "matrix=$(trtpack fleet plan fleet.yaml)" >> "$GITHUB_OUTPUT"
      jobs: strategy: {matrix: ${{ fromJSON(needs.plan.outputs.matrix) }}}
    """
    from trtpack.api.fleet import load_manifest, matrix_json

    sys.stdout.write(matrix_json(load_manifest(manifest)) + "\n")
