"""The recipe a build request names: MODEL's recipe (a PyTorch source described in a process of
its own) with ``--set``, ``--input``, ``--tokenizer`` and ``--portable`` applied."""

from __future__ import annotations

from pathlib import Path

from trtpack.errors import RecipeError, TrtpackError, UserInputError
from trtpack.options import BuildRequest
from trtpack.sources.architectures import head_split_problem
from trtpack.sources.inputs import parse_input_options
from trtpack.sources.recipe import Recipe, Source
from trtpack.sources.recipe_files import (
    apply_input_options,
    apply_overrides,
    check_small_integer_inputs,
    unruled_small_integer_inputs,
)
from trtpack.sources.resolve import resolve_model
from trtpack.sources.torch_sources import (
    DescribedSource,
    DescribeRequest,
    InputSpec,
    recipe_for_torch,
    torch_source,
)


def request_recipe(request: BuildRequest, cache_dir: Path) -> tuple[Recipe, str | None]:
    """The recipe the request builds: MODEL's (``resolve_recipe``) with ``--set``, ``--input``,
    ``--tokenizer`` and ``--portable`` applied, and the key of a PyTorch source's files."""
    resolved, source_files = resolve_recipe(request, cache_dir)
    recipe: Recipe = apply_overrides(resolved, list(request.overrides))
    problem = head_split_problem(recipe.config)
    if problem is not None:  # else transformers refuses it inside the export stage (exit 4)
        raise RecipeError(f"recipe '{recipe.name}': {problem}")
    recipe = apply_input_options(recipe, [
        d for d in parse_input_options(request.inputs)
        if d.name not in recipe.source.arguments])  # those are folded into the graph
    if request.sample_inputs is not None:  # a sample rate the user's data gives
        from trtpack.verify.sample_files import sample_constants

        recipe = apply_input_options(recipe, parse_input_options(sample_constants(
            Path(request.sample_inputs), unruled_small_integer_inputs(recipe))))
    check_small_integer_inputs(recipe)
    if request.tokenizer is not None:
        recipe = with_tokenizer(recipe, request.tokenizer)
    if request.portable is not None:
        recipe = recipe.model_copy(update={"engine": recipe.engine.model_copy(
            update={"hardware_compatibility": request.portable})})
    return recipe, source_files


def resolve_recipe(request: BuildRequest, cache_dir: Path) -> tuple[Recipe, str | None]:
    """The recipe for ``request.model``, and for a PyTorch source the key of its files: a
    factory, ``.pt2`` or TorchScript file is described by loading it once in a process of its
    own (``trtpack.pytorch.describe``), and the description is reused until its files
    change; anything else resolves as before (``sources.resolve``)."""
    model = str(request.model)
    source = torch_source(model)
    if source is None:
        recipe = resolve_model(model, request.task)
        if recipe.source.torch_kind is None:
            return recipe, None
        try:
            described = describe_torch(recipe.source.model_dump(exclude_defaults=True),
                                       request, cache_dir, recipe)
        except TrtpackError:  # the export stage loads it again and reports it, in its log
            return recipe, None
        return recipe, str(described["source_files"])
    described = describe_torch(source, request, cache_dir)
    if described["kind"] == "folder":  # a factory returning a model folder: a package
        from trtpack.sources.hf_recipe import recipe_for_hf_dir

        folder = Path(described["folder"])
        recipe = recipe_for_hf_dir(folder, request.task).model_copy(
            update={"source": Source(package=source["factory"])})
        return recipe.with_origin(folder), str(described["source_files"])
    ref = source.get("factory") or model
    stem = Path(ref.rpartition(":")[0] if "factory" in source else ref).stem
    name = stem.rpartition(".")[2] if "factory" in source else stem
    recipe = recipe_for_torch(source, described, name=name, task=request.task,
                              profiles=list(request.profiles))
    return recipe, str(described["source_files"])


def describe_torch(source: dict[str, str], request: BuildRequest, cache_dir: Path,
                   recipe: Recipe | None = None) -> DescribedSource:
    """The description of a PyTorch source (``trtpack.pytorch.describe``) with the user's
    ``--input`` descriptions and constants (or a recipe's inputs)."""
    from trtpack.pytorch.describe_process import describe_in_process

    inputs: dict[str, InputSpec] = {}
    arguments: dict[str, object] = {}  # constants, written as JSON for the model's process
    if recipe is not None:
        inputs = {i.name: {"dtype": i.dtype, "axes": list(i.axes)} for i in recipe.inputs}
        arguments = dict(recipe.source.arguments)
    # NAME=DTYPE[...] describes a tensor input; NAME=VALUE alone gives a non-tensor argument
    # (sr=16000), folded into the graph; a tensor input's values (=LOW..HIGH) apply later, and
    # a range alone is passed on so that describe refuses it for a non-tensor argument
    ranged: dict[str, str] = {}
    for described in parse_input_options(request.inputs):
        if described.spec is not None:
            inputs[described.name] = {"dtype": described.spec.dtype,
                                      "axes": list(described.spec.axes)}
        elif described.value is not None and described.value.constant is not None:
            arguments[described.name] = described.value.constant
        elif described.value is not None:
            ranged[described.name] = str(described.value)
    from trtpack.pipeline.cache import source_digest

    request_data: DescribeRequest = {  # a description is trtpack's reading
        "source": source, "inputs": inputs, "arguments": arguments, "trtpack": source_digest()}
    if ranged:
        request_data["ranged"] = ranged
    return describe_in_process(request_data, cache_dir)


def with_tokenizer(recipe: Recipe, path: Path) -> Recipe:
    """``recipe`` with its tokenizer taken from ``path`` (``--tokenizer``): a folder holding a
    saved tokenizer, or one of its files (``tokenizer.json``, ``vocab.txt`` ...)."""
    from trtpack.sources.tokenizer_files import VOCABULARY_FILES, has_tokenizer

    folder = path.expanduser()
    if folder.is_file():
        folder = folder.parent
    if not folder.is_dir():
        raise UserInputError(f"--tokenizer '{path}' does not exist")
    if not has_tokenizer(folder):
        raise UserInputError(f"--tokenizer '{path}' holds no tokenizer (none of "
                             f"{', '.join(VOCABULARY_FILES)})")
    return recipe.model_copy(update={
        "tokenizer": True, "tokenizer_source": Source(path=str(folder.resolve()))})
