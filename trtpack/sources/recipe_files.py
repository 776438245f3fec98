"""Recipe files: the built-in ``recipes/*.yaml`` and any YAML path. A recipe may ``extends:``
another (by name or path) and override fields: that is how an overlay written by the INT8
fallback search is committed and reused. ``--set KEY=VALUE`` overrides apply on top.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

from trtpack.errors import RecipeError, UserInputError
from trtpack.report import JsonObject, JsonValue
from trtpack.shapes import TensorSpec
from trtpack.sources.inputs import INTEGER_DTYPES, InputDescription, value_rule_problem
from trtpack.sources.recipe import Recipe

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"  # trtpack/recipes/
RECIPE_SUFFIXES = (".yaml", ".yml")


def _validation_error_message(path: str, err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        message = e["msg"]
        if e["type"] == "extra_forbidden":  # a misspelt key: name the one meant
            close = difflib.get_close_matches(str(e["loc"][-1]), _keys_at(e["loc"][:-1]), n=1)
            parent = ".".join(str(p) for p in e["loc"][:-1])
            message = "unknown key" + (f"; did you mean {parent + '.' if parent else ''}"
                                       f"{close[0]}?" if close else "")
        lines.append(f"  - {loc}: {message}")
    return f"invalid recipe {path}:\n" + "\n".join(lines)


def _keys_at(loc: Sequence[int | str]) -> list[str]:
    """The field names a recipe accepts at ``loc`` (``("triton",)``: TritonSettings'),
    following nested models through lists and optionals; [] where it cannot tell."""
    model: type[BaseModel] | None = Recipe
    for part in loc:
        if isinstance(part, int):
            continue  # an item of a list: the list's model is already the one
        field = model.model_fields.get(str(part)) if model is not None else None
        if field is None:
            return []
        model = _model_in(field.annotation)
        if model is None:
            return []
    return list(model.model_fields) if model is not None else []


def _model_in(annotation: object) -> type[BaseModel] | None:
    """The pydantic model inside ``annotation`` (itself, ``X | None``, ``list[X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None



def builtin_recipe_names() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def _read_yaml(path: Path) -> dict[str, JsonValue]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RecipeError(f"cannot read recipe {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise RecipeError(f"recipe {path} is not UTF-8 text (byte {e.start})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise RecipeError(f"recipe {path}{where} is not valid YAML: {problem}") from None
    if data is None:
        raise RecipeError(f"recipe {path} is empty: a recipe is a YAML mapping of settings "
                          "(name, source, inputs, outputs, ...)",
                          hint="start from a built-in one: trtpack recipes show minilm > "
                          f"{path.name}")
    if not isinstance(data, dict):
        kind = {list: "a list", str: "a single text value", int: "a number",
                float: "a number", bool: "a true/false value"}.get(type(data), "not a mapping")
        raise RecipeError(f"recipe {path} is {kind}; a recipe is a YAML mapping of settings "
                          "(key: value lines: name, source, inputs, outputs, ...)")
    if refers_to_itself(data):
        raise RecipeError(f"recipe {path} has a YAML alias inside its own anchor (a value "
                          "that contains itself)")
    return data


def refers_to_itself(value: object, inside: tuple[int, ...] = ()) -> bool:
    """Whether a loaded YAML value contains itself (``&a [*a]``): YAML allows it, a recipe
    cannot be one."""
    if not isinstance(value, dict | list):
        return False
    if id(value) in inside:
        return True
    children = value.values() if isinstance(value, dict) else value
    return any(refers_to_itself(child, (*inside, id(value))) for child in children)


def _deep_merge(base: Mapping[str, JsonValue], override: Mapping[str, JsonValue]
                ) -> dict[str, JsonValue]:
    merged = dict(base)
    for key, value in override.items():
        current = merged.get(key)
        if isinstance(value, Mapping) and isinstance(current, Mapping):
            merged[key] = _deep_merge(current, value)
        else:
            merged[key] = value
    return merged


def _recipe_data(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, JsonValue]:
    path = path.resolve()
    if path in seen:
        raise RecipeError(f"recipe {path} extends itself (through {', '.join(map(str, seen))})")
    data = _read_yaml(path)
    parent = data.pop("extends", None)
    if parent is None:
        return data
    if not isinstance(parent, str):
        raise RecipeError(f"recipe {path}: 'extends' must be a recipe name or path")
    parent_path = _locate_recipe(parent, relative_to=path.parent)
    return _deep_merge(_recipe_data(parent_path, (*seen, path)), data)


def _locate_recipe(ref: str, relative_to: Path | None = None) -> Path:
    candidates = [Path(ref)]
    if relative_to is not None:
        candidates.insert(0, relative_to / ref)
    for c in candidates:
        if c.is_file():
            return c
    builtin = RECIPES_DIR / f"{ref}.yaml"
    if builtin.is_file():
        return builtin
    raise RecipeError(
        f"unknown recipe '{ref}'; known recipes: {', '.join(builtin_recipe_names())}"
    )


def load_recipe_file(path: Path) -> Recipe:
    data = _recipe_data(path)
    data.setdefault("name", path.stem)
    try:
        return Recipe.model_validate(data).with_origin(path)
    except ValidationError as e:
        raise RecipeError(_validation_error_message(str(path), e)) from None


def apply_overrides(recipe: Recipe, overrides: list[str]) -> Recipe:
    """``recipe`` with ``--set KEY=VALUE`` overrides applied: KEY is a dotted path into the
    recipe (``triton.instance_count``), VALUE is read as YAML (``2``, ``true``, ``[a, b]``).
    The result is validated like a recipe file; errors name the override."""
    if not overrides:
        return recipe
    changes: dict[str, JsonValue] = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        path = key.strip().split(".")
        if not sep or not all(path):
            raise UserInputError(f"--set '{item}': expected KEY=VALUE, e.g. "
                                 "--set triton.instance_count=2")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except (yaml.YAMLError, ValueError):  # ValueError: an escape past Unicode ("\U0011ffff")
            value = text
        if refers_to_itself(value):
            raise UserInputError(f"--set '{item}': the value contains itself (a YAML alias "
                                 "inside its own anchor)")
        node = changes
        for part in path[:-1]:
            found = node.setdefault(part, {})
            if not isinstance(found, dict):
                raise UserInputError(f"--set '{item}' conflicts with another --set")
            node = found
        node[path[-1]] = value
    try:
        updated = Recipe.model_validate(_deep_merge(recipe.model_dump(mode="json"), changes))
    except ValidationError as e:
        raise RecipeError(_validation_error_message(f"{recipe.name} with --set "
                                                   + " --set ".join(overrides), e)) from None
    if recipe.origin is not None:
        updated.with_origin(recipe.origin)
    return updated


def apply_input_options(recipe: Recipe, descriptions: Sequence[InputDescription]) -> Recipe:
    """``recipe`` with ``--input`` descriptions applied to its inputs of the same name: a value
    rule sets ``inputs[].value``; a ``DTYPE[DIM,...]`` must keep the input's dtype and rank
    and its static sizes, and may name or size its dynamic axes. An input the recipe does not
    have is an error naming the ones it has."""
    if not descriptions:
        return recipe
    by_name = {i.name: i for i in recipe.inputs}
    inputs = list(recipe.inputs)
    for d in descriptions:
        current = by_name.get(d.name)
        if current is None:
            raise UserInputError(
                f"--input '{d}': '{recipe.name}' has no input '{d.name}'; its inputs are "
                f"{', '.join(by_name)}")
        update: dict[str, JsonValue] = {}
        if d.spec is not None:
            problem = _description_problem(current.spec(), d.spec)
            if problem is not None:
                raise UserInputError(f"--input '{d}': {problem}",
                                     hint=f"'{recipe.name}' declares {current.name}="
                                     f"{current.dtype}[{','.join(map(str, current.axes))}]")
            update["axes"] = list(d.spec.axes)
        if d.value is not None:
            problem = value_rule_problem(current.dtype, d.value)
            if problem is not None:
                raise UserInputError(f"--input '{d}': {d.value}: {problem}")
            update["value"] = d.value.constant if d.value.is_constant else str(d.value)
        inputs[inputs.index(current)] = current.model_copy(update=update)
    updated = recipe.model_copy(update={"inputs": inputs})
    if recipe.origin is not None:
        updated.with_origin(recipe.origin)
    return updated


def unruled_small_integer_inputs(recipe: Recipe) -> list[str]:
    """The names of the scalar or one-element integer inputs with no value rule."""
    return [i.name for i in recipe.inputs if i.value is None and i.kind == "generic"
            and i.dtype in INTEGER_DTYPES and all(a == 1 for a in i.axes)]


def check_small_integer_inputs(recipe: Recipe) -> None:
    """A scalar or one-element integer input (a sample rate, a mode, a length) with no value
    rule is exit 2 naming it and the flag: drawn at random it sends the model down a branch
    no user takes (``silero_vad``'s ``sr``)."""
    names = unruled_small_integer_inputs(recipe)
    unruled = [i for i in recipe.inputs if i.name in names]
    if unruled:
        first = unruled[0]
        raise UserInputError(
            f"{', '.join(repr(i.name) for i in unruled)}: a one-element {first.dtype} input "
            f"with no value rule; trtpack does not guess it",
            hint=f"give it with --input {first.name}=VALUE (a constant, e.g. "
                 f"{first.name}=16000) or --input {first.name}=LOW..HIGH (a range), or "
                 "value: in the recipe's inputs")


def _description_problem(declared: TensorSpec, given: TensorSpec) -> str | None:
    if given.dtype != declared.dtype:
        return f"the model's input '{declared.name}' is {declared.dtype}, not {given.dtype}"
    if given.rank != declared.rank:
        return (f"the model's input '{declared.name}' has {declared.rank} dimension(s), not "
                f"{given.rank}")
    for i, (was, now) in enumerate(zip(declared.axes, given.axes, strict=True)):
        if isinstance(was, int) and was != now:
            return f"dimension {i} of '{declared.name}' is fixed at {was} in the model"
    return None


def overlay_document(recipe: Recipe, changes: JsonObject) -> dict[str, JsonValue]:
    """A recipe file that is ``recipe`` with ``changes`` (nested, merged key by key) on top.

    It extends what the recipe came from: a built-in by name, a recipe file by its absolute
    path. A recipe inferred from a model directory has no file to extend, so the document is
    the whole recipe."""
    origin = recipe.origin
    if origin is None or origin.parent == RECIPES_DIR.resolve():
        return {"extends": recipe.name, **changes}
    if origin.is_file() and origin.suffix in RECIPE_SUFFIXES:
        return {"extends": str(origin), **changes}
    return _deep_merge(recipe.model_dump(mode="json"), changes)
