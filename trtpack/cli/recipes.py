"""``trtpack recipes list|show``: the built-in recipes, and the recipe trtpack infers for a
model."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from trtpack.cli.console import HUB_NOTE, WIDE, out, recipes_table
from trtpack.cli.exits import handle_errors

commands = typer.Typer(help="List and show the built-in recipes.", no_args_is_help=True,
                       rich_markup_mode=None)


@commands.command("list")
@handle_errors
def recipes_list() -> None:
    """List the built-in recipes, and where each one's weights come from: which build
    offline, and which need the Hugging Face hub (or --random-weights)."""
    from trtpack.sources.recipe_files import builtin_recipe_names
    from trtpack.sources.resolve import resolve_model

    out.print(recipes_table([resolve_model(name) for name in builtin_recipe_names()],
                            descriptions=out.width >= WIDE))
    out.print(HUB_NOTE, markup=False)


@commands.command("show")
@handle_errors
def recipes_show(
    name: Annotated[str, typer.Argument(
        help="Recipe name or YAML file, or an ONNX file, model directory, hub id or PyTorch "
        "model (file.py:make_model, model.pt2, model.pt): the recipe trtpack infers for "
        "it (save it, edit it, build it).")],
    task: Annotated[str | None, typer.Option(
        metavar="TASK", help="The head, as for build --task.")] = None,
    inputs: Annotated[list[str] | None, typer.Option(
        "--input", metavar="NAME=...", help="As for build --input.")] = None,
    profile: Annotated[list[str] | None, typer.Option(
        "--profile", "-p", help="As for build --profile.")] = None,
) -> None:
    """Show a recipe with every default filled in (as YAML)."""
    import yaml

    from trtpack.api.recipes import resolve_recipe
    from trtpack.machine.paths import default_cache_dir
    from trtpack.options import BuildRequest

    recipe, _ = resolve_recipe(BuildRequest(model=name, task=task, inputs=inputs or [],
                                            profiles=profile or []), default_cache_dir())
    data = recipe.model_dump(mode="json")
    data["source"] = recipe.source.model_dump(mode="json", exclude_defaults=True)
    # plain text, never wrapped to the terminal: the output is saved and edited as a file
    sys.stdout.write(yaml.safe_dump(data, sort_keys=False))

