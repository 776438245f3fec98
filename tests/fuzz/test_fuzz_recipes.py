"""Fuzzed ``--profile``, ``--set`` and recipe YAML files: inputs made from valid ones by typos,
truncations, swapped values and fields of the wrong type. Each is parsed in-process; the
result is a valid profile/recipe or the user-error type whose message names what is wrong
(the profile, the --set, the recipe file and field), never another exception."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.mutations import (
    ANY_VALUE,
    Counter,
    edited_text,
    fuzz_settings,
    min_examples,
    mutated_document,
)
from trtpack.errors import ProfileError, RecipeError, UserInputError
from trtpack.shapes import TensorSpec, parse_profile
from trtpack.sources.recipe import Recipe
from trtpack.sources.recipe_files import RECIPES_DIR, apply_overrides, load_recipe_file
from trtpack.sources.resolve import resolve_model

MIN_EXAMPLES = 500  # the floor per parser and run
TEXT_SPECS = resolve_model("tiny-bert").input_specs()  # input_ids, attention_mask, types
MIXED_SPECS = [TensorSpec("pixel_values", "float32", ("batch", 3, 32, 32), "image"),
               TensorSpec("scale", "float32", ("batch", "k"), "generic")]

sizes = st.integers(1, 300)


@st.composite
def valid_profile(draw: st.DrawFn) -> str:
    """A profile the parser accepts, in one of its forms."""
    corners = sorted(draw(st.lists(sizes, min_size=3, max_size=3)))
    batch = sorted(draw(st.lists(sizes, min_size=3, max_size=3)))
    axes = ":".join(f"{b}x{s}" for b, s in zip(batch, corners, strict=True))
    form = draw(st.sampled_from(["axes", "named", "one", "full"]))
    if form == "axes":
        return axes
    if form == "one":
        return f"{batch[1]}x{corners[1]}"
    if form == "full":
        return f"input_ids={axes}"
    names = draw(st.lists(st.sampled_from([s.name for s in TEXT_SPECS]), min_size=1,
                          max_size=3, unique=True))
    return ",".join(f"{n}={axes}" for n in names)


def _wrong_numbers(text: str, data: st.DataObject) -> str:
    """Replace one number by zero, a negative, a huge or a non-ASCII one."""
    import re

    numbers = list(re.finditer(r"\d+", text))
    if not numbers:
        return text
    m = data.draw(st.sampled_from(numbers))
    bad = data.draw(st.sampled_from(["0", "-1", "9" * 30, "9" * 5000, "٣", "1e3", "2.5", ""]))
    return text[:m.start()] + bad + text[m.end():]


def test_profile_parser_fuzzed() -> None:
    seen = Counter("--profile")

    @fuzz_settings(1200)
    @given(text=edited_text(valid_profile()), data=st.data(),
           mixed=st.booleans(), renumber=st.booleans())
    def check(text: str, data: st.DataObject, mixed: bool, renumber: bool) -> None:
        seen()
        if renumber:
            text = _wrong_numbers(text, data)
        specs = MIXED_SPECS if mixed else TEXT_SPECS
        try:
            profile = parse_profile(text, specs)
        except ProfileError as e:
            message = str(e)
            assert message.startswith(("profile ", "empty profile")), message
            assert len(message) < 400 and "\n" not in message, message  # one line
            return
        for spec in specs:  # a valid result: every input, every corner, positive, ordered
            r = profile.shapes[spec.name]
            assert len(r.min) == len(r.opt) == len(r.max) == spec.rank
            assert all(0 < a <= b <= c for a, b, c in zip(r.min, r.opt, r.max, strict=True))

    check()
    assert seen.count >= min_examples(MIN_EXAMPLES)


# --set KEY=VALUE: keys of the recipe (and misspelt ones), values of every YAML kind.
def _recipe_keys(document: Any, prefix: str = "") -> list[str]:
    keys = []
    for key, value in document.items():
        keys.append(prefix + key)
        if isinstance(value, dict):
            keys += _recipe_keys(value, prefix + key + ".")
    return keys


BASE_RECIPE = resolve_model("tiny-bert")
RECIPE_KEYS = _recipe_keys(BASE_RECIPE.model_dump(mode="json"))
yaml_value = st.one_of(
    st.sampled_from(["2", "true", "null", "[a, b]", "{x: 1}", "-3", "1e9", "0", "'text'",
                     "[", "{", "!!binary aGk=", "!!python/object:os.system", "&a [*a]",
                     "2026-11-23", "0x10", ".inf", "~", "- 1", "? x", "|", "%YAML 1.1"]),
    ANY_VALUE.map(lambda v: yaml.safe_dump(v, default_flow_style=True).strip()))


@st.composite
def override(draw: st.DrawFn) -> str:
    key = draw(edited_text(st.sampled_from(RECIPE_KEYS), max_edits=1))
    value = draw(edited_text(yaml_value, max_edits=1))
    return draw(st.sampled_from([f"{key}={value}", f"{key}={value}", key, f"={value}",
                                 f"{key} = {value}"]))


def test_set_overrides_fuzzed() -> None:
    seen = Counter("--set")

    @fuzz_settings(2 * MIN_EXAMPLES)
    @given(items=st.lists(override(), min_size=1, max_size=3))
    def check(items: list[str]) -> None:
        seen()
        try:
            recipe = apply_overrides(BASE_RECIPE, items)
        except RecipeError as e:
            assert "--set" in str(e), str(e)
            assert "\n  - " in str(e)  # one bullet per invalid field, named by its path
            return
        except UserInputError as e:
            assert str(e).startswith("--set '"), str(e)
            return
        assert isinstance(recipe, Recipe)
        Recipe.model_validate(recipe.model_dump(mode="json"))  # still a valid recipe

    check()
    assert seen.count >= min_examples(MIN_EXAMPLES)


# Recipe YAML files: the shipped recipes with fields replaced, deleted or added, or their
# text edited and truncated.
SHIPPED = {p.name: yaml.safe_load(p.read_text()) for p in sorted(RECIPES_DIR.glob("*.yaml"))}


@st.composite
def recipe_text(draw: st.DrawFn) -> bytes:
    name = draw(st.sampled_from(sorted(SHIPPED)))
    how = draw(st.sampled_from(["fields", "fields", "text", "bytes"]))
    if how == "fields":
        return yaml.safe_dump(draw(mutated_document(SHIPPED[name]))).encode()
    text = (RECIPES_DIR / name).read_text()
    if how == "text":
        return draw(edited_text(st.just(text), max_edits=6)).encode("utf-8", "surrogatepass")
    from tests.fuzz.mutations import damaged_bytes

    return draw(damaged_bytes(text.encode()))


def test_recipe_files_fuzzed() -> None:
    seen = Counter("recipe YAML")
    folder = Path(tempfile.mkdtemp(prefix="trtpack-fuzz-recipe-"))
    path = folder / "user-recipe.yaml"

    @fuzz_settings(700)
    @given(content=recipe_text())
    def check(content: bytes) -> None:
        seen()
        path.write_bytes(content)
        try:
            recipe = load_recipe_file(path)
        except RecipeError as e:
            assert str(path) in str(e), str(e)
            return
        try:  # a loaded recipe's profiles are parsed against its inputs before a build
            for text in recipe.profiles:
                parse_profile(text, recipe.input_specs())
        except ProfileError as e:
            assert str(e).startswith(("profile ", "empty profile")), str(e)

    check()
    assert seen.count >= min_examples(MIN_EXAMPLES)
