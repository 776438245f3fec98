from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trtpack.errors import RecipeError, UserInputError
from trtpack.shapes import parse_profiles
from trtpack.sources.recipe_files import builtin_recipe_names, load_recipe_file, overlay_document
from trtpack.sources.resolve import resolve_model


def test_builtin_recipes_validate_and_their_profiles_parse() -> None:
    names = builtin_recipe_names()
    for required in ("minilm", "bert-base", "bert-large", "distilbert", "resnet-50"):
        assert required in names
    for name in names:
        recipe = resolve_model(name)
        assert recipe.name == name
        assert parse_profiles(recipe.profiles, recipe.input_specs())


def test_unknown_recipe_lists_known_ones() -> None:
    with pytest.raises(UserInputError) as info:
        resolve_model("no-such-model")
    assert "minilm" in str(info.value) and "bert-large" in str(info.value)


def test_missing_recipe_file() -> None:
    with pytest.raises(UserInputError, match="does not exist"):
        resolve_model("missing/recipe.yaml")


def test_invalid_field_names_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: bad\ntask: feature-extraction\nsource: {hf_id: x}\nprofiles: ['1x8']\n"
        "inputs:\n  - {name: input_ids, dtype: int65, axes: [batch, sequence]}\n"
        "outputs:\n  - {name: y, axes: [batch]}\n"
    )
    with pytest.raises(RecipeError) as info:
        load_recipe_file(path)
    message = str(info.value)
    assert str(path) in message and "inputs.0.dtype" in message and "int64" in message


def test_unknown_key_is_rejected(tmp_path: Path) -> None:
    base = Path(resolve_model("tiny-bert").model_dump_json())
    data = json.loads(str(base))
    data["opsett"] = 17
    path = tmp_path / "typo.yaml"
    path.write_text(json.dumps(data))
    with pytest.raises(RecipeError, match="opsett"):
        load_recipe_file(path)


def test_yaml_syntax_error_and_unsafe_tags(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(RecipeError, match="not valid YAML"):
        load_recipe_file(broken)
    unsafe = tmp_path / "unsafe.yaml"
    unsafe.write_text("name: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(RecipeError, match="not valid YAML"):
        load_recipe_file(unsafe)


def test_overlay_extends_a_builtin_recipe(tmp_path: Path) -> None:
    overlay = tmp_path / "minilm-int8.yaml"
    overlay.write_text(
        "extends: minilm\nname: minilm-int8\n"
        "precision_options:\n  int8:\n    exclude_nodes: [node_a, node_b]\n"
    )
    recipe = resolve_model(str(overlay))
    assert recipe.name == "minilm-int8"
    assert recipe.precision_options.int8.exclude_nodes == ["node_a", "node_b"]
    assert recipe.source.package == resolve_model("minilm").source.package


CHANGE = {"precision_options": {"int8": {"exclude_nodes": ["node_a"]}}}


def _reload(document: dict, where: Path) -> object:
    path = where / "overlay.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return resolve_model(str(path))


@pytest.mark.parametrize("origin", ["builtin", "user file", "model directory"])
def test_overlay_document_reproduces_the_recipe_it_came_from(origin: str, tmp_path: Path
                                                             ) -> None:
    """The fallback's overlay extends what the recipe came from and keeps its settings."""
    if origin == "builtin":
        recipe = resolve_model("tiny-bert")
    elif origin == "user file":  # a user recipe elsewhere, extending a built-in
        user = tmp_path / "recipes" / "strict.yaml"
        user.parent.mkdir()
        user.write_text("extends: tiny-bert\nverify:\n  fp16:\n    min_cosine: 0.9999\n")
        recipe = resolve_model(str(user))
    else:
        model_dir = tmp_path / "tiny-bert"  # named like a built-in, but it is not one
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps({"model_type": "bert"}))
        recipe = resolve_model(str(model_dir))
    document = overlay_document(recipe, CHANGE)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    again = _reload(document, elsewhere)
    expected = recipe.model_dump()
    expected["precision_options"]["int8"]["exclude_nodes"] = ["node_a"]
    assert again.model_dump() == expected
    assert ("extends" in document) is (origin != "model directory")


def test_recipe_inferred_from_hf_directory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "distilbert", "architectures": ["DistilBertForSequenceClassification"],
         "id2label": {"0": "NEG", "1": "POS"}, "dim": 768}))
    (tmp_path / "vocab.txt").write_text("[PAD]\n")
    recipe = resolve_model(str(tmp_path))
    assert recipe.task == "sequence-classification"
    assert [i.name for i in recipe.inputs] == ["input_ids", "attention_mask"]
    assert recipe.outputs[0].axes == ["batch", 2]
    assert recipe.tokenizer


def test_directory_without_config_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match=r"config\.json"):
        resolve_model(str(tmp_path))
