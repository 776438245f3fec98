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


@commands.command("build")
@handle_errors
def build(
    manifest: Annotated[Path, typer.Argument(
        metavar="MANIFEST", help="The fleet manifest (YAML: models, instance_types).")],
    target: Annotated[str, typer.Option(
        "--target", metavar="TARGET",
        help="cpu (every model for ONNX Runtime on CPUs), or a GPU family with --no-engine.")
    ] = "cpu",
    no_engine: Annotated[bool, typer.Option(
        "--no-engine", help="Stop before the TensorRT engine (the convert jobs' builds).")
    ] = False,
    out_dir: Annotated[Path, typer.Option(
        "--out", metavar="DIR", help="The fleet's folder (new or empty): model_repository/ "
        "with every model, builds/ and fleet.json.")] = Path("build/fleet"),
    jobs: Annotated[int | None, typer.Option(
        "--jobs", metavar="N", help="The most builds at once (default: the CPUs); fewer "
        "where their memory estimates do not fit together.")] = None,
    cache_dir: Annotated[Path | None, typer.Option(
        "--cache-dir", metavar="DIR", help="Stage cache folder (as trtpack build's).")] = None,
    cache_url: Annotated[str | None, typer.Option(
        "--cache-url", metavar="s3://BUCKET/PREFIX",
        help="The shared remote stage cache (as trtpack build's).")] = None,
    no_cache: Annotated[bool, typer.Option(
        "--no-cache", help="Rebuild every stage.")] = False,
    skip_memory_check: Annotated[bool, typer.Option(
        "--skip-memory-check", help="Estimate nothing: one build at a time, unchecked.")
    ] = False,
) -> None:
    """Build every model of MANIFEST on this machine through the stage cache (side by side
    where their memory estimates fit), then one Triton model repository holding them all.
    An interrupted or failed fleet build leaves no OUT.

    \b
    Example: trtpack fleet build fleet.yaml --target cpu --out build/fleet
             trtpack package build/fleet --sagemaker
    """
    from trtpack.api.fleet import load_manifest
    from trtpack.api.fleet_build import fleet_build
    from trtpack.cli.console import err, out
    from trtpack.machine.paths import parse_cache_url

    if cache_url is not None:
        parse_cache_url(cache_url)  # credentials in it: exit 2, before any work
    loaded = load_manifest(manifest)
    result = fleet_build(
        loaded, out_dir, target=target, no_engine=no_engine, jobs=jobs, cache_dir=cache_dir,
        cache_url=cache_url, use_cache=not no_cache, skip_memory_check=skip_memory_check,
        progress=lambda message: err.print(f"fleet: {message}", markup=False,
                                           highlight=False, soft_wrap=True))
    served = sum(len(m.served) for m in result.models)
    out.print(f"{len(result.models)} model(s), {served} served model folder(s) in "
              f"{result.repository}", markup=False, highlight=False, soft_wrap=True)


@commands.command("assemble")
@handle_errors
def assemble(
    build_dirs: Annotated[list[Path] | None, typer.Argument(
        metavar="BUILD_DIR...", help="Output folders of 'trtpack build' (e.g. the fleet "
        "jobs' artifacts): any models; one model's GPU builds are merged as trtpack merge "
        "does.")] = None,
    out_dir: Annotated[Path | None, typer.Option(
        "--out", metavar="DIR", help="The folder (new or empty): model_repository/ and "
        "assemble.json.")] = None,
) -> None:
    """One Triton model repository for every model of the build folders given: each model's
    builds for several GPU families merged by compute capability (cc_model_filenames), a
    CPU or --no-engine build taken as it is.

    \b
    Example: trtpack fleet assemble out/* --out fleet-repository
    """
    from trtpack.cli.console import out
    from trtpack.errors import UserInputError
    from trtpack.serving.assemble import assemble_builds

    if out_dir is None:
        raise UserInputError("assemble needs --out DIR")
    result = assemble_builds(build_dirs or [], out_dir)
    out.print(f"{len(result.models)} model(s), {len(result.served)} served model folder(s) "
              f"in {result.repository}", markup=False, highlight=False, soft_wrap=True)
