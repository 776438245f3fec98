"""CPU forms for every built-in recipe and every head: the fused CPU model of each built-in
transformer recipe holds the fusions its config implies (one Attention per layer, at least
two layer normalizations per layer), and INT8 on the CPU ends in exit 0 or exit 1 (with the
failing rows), never exit 4 (ViT's fused Gelu once lacked its domain import; DistilBERT's
``n_heads`` was not read, so it got no fusion at all). Tiny configs, random weights."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.hf_models import TEXT_MODELS, VISION_MODELS
from trtpack.precision.calibration.data import DEFAULT_TEXT
from trtpack.precision.cpu.fusion import optimizer_model_type
from trtpack.report import JsonObject
from trtpack.sources.architectures import config_int
from trtpack.sources.recipe_files import builtin_recipe_names
from trtpack.sources.resolve import resolve_model

LAYERS_KEYS = ("num_hidden_layers", "n_layer", "n_layers")  # config.json's transformer layers


def hidden_layers(config: JsonObject) -> int | None:
    """A transformer's layers (None: the config does not say)."""
    return next((config_int(config[k]) for k in LAYERS_KEYS if config.get(k)), None)

LAYERS = 2
# the same tiny shape in each family's config keys
TINY = {
    "bert": {"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": LAYERS,
             "intermediate_size": 64},
    "distilbert": {"dim": 32, "n_heads": 2, "n_layers": LAYERS, "hidden_dim": 64},
}


def _transformer_recipes() -> list[str]:
    return [n for n in builtin_recipe_names()
            if optimizer_model_type(resolve_model(n).config.get("model_type")) is not None]


def test_the_recipes_without_a_transformer_config_imply_no_fusion() -> None:
    """The sweep below covers every built-in recipe whose config the CPU optimizer knows;
    the others (a ResNet, a factory model without a config) have no attention to fuse."""
    others = set(builtin_recipe_names()) - set(_transformer_recipes())
    assert others == {"resnet-50", "big-embedding"}
    assert all(hidden_layers(resolve_model(n).config) is None for n in others)


@pytest.mark.parametrize("name", [  # about 40 s each: the one that failed stays in the quick set
    n if n == "distilbert" else pytest.param(n, marks=pytest.mark.slow)
    for n in _transformer_recipes()])
def test_every_builtin_transformer_recipe_gets_its_cpu_fusions(name: str, tmp_path: Path
                                                               ) -> None:
    recipe = resolve_model(name)
    overrides = [f"config.{k}={v}" for k, v in TINY[recipe.config["model_type"]].items()]
    result = run_cli("build", name, "--random-weights", "--target", "cpu", "--profile",
                     "1x8:2x16:4x16", "--out", str(tmp_path / "out"), "--cache-dir",
                     str(tmp_path / "cache"), "--json",
                     *(a for o in overrides for a in ("--set", o)))
    assert result.exit_code == 0, result.output
    cpu = next(s for s in json.loads(result.stdout)["stages"] if s["name"] == "cpu_model")
    fused = cpu["metrics"]["fused_operators"]
    # the config the model was built from (minilm's package keeps its own 6 layers)
    built = json.loads((tmp_path / "out" / "artifacts" / "export" / "config.json").read_text())
    layers = hidden_layers(built)
    assert layers is not None and fused.get("Attention") == layers, fused
    norms = sum(fused.get(op, 0) for op in ("LayerNormalization", "SkipLayerNormalization",
                                            "EmbedLayerNormalization"))
    assert norms >= 2 * layers, fused


FAST_HEADS = ("vit-cls",)  # exited 4 (distilbert-cls, which got no fusion: slow, and above)


# every 8th line of the shipped calibration text (41 of 321, all three lengths): the same
# forms, gates and Q/DQ search on a fifth of the samples (the search's cost; the sample
# counts are tests/precision's subject, this sweep's is the graphs of every head)
CALIBRATION_EVERY = 8


@pytest.mark.parametrize("kind", [
    k if k in FAST_HEADS else pytest.param(k, marks=pytest.mark.slow)
    for k in (*TEXT_MODELS, *VISION_MODELS)])
def test_every_head_builds_int8_on_the_cpu_or_says_why(
        kind: str, hf_model: Callable[[str], Path], cache_dir: Path, tmp_path: Path) -> None:
    # the folder and profile tests/sources/test_heads.py builds FP32 from, in the session
    # cache: export, simplify and verify are made once for both (INT8 is the subject here);
    # within the tiny configs' 64 positions (RoBERTa's start at 2)
    profile = "1x8:2x16:4x32" if kind in TEXT_MODELS else "1:2:4"
    calibration: tuple[str, ...] = ()
    if kind in TEXT_MODELS:
        lines = DEFAULT_TEXT.read_text().splitlines()[::CALIBRATION_EVERY]
        (tmp_path / "lines.txt").write_text("\n".join(lines) + "\n")
        calibration = ("--calibration", str(tmp_path / "lines.txt"))
    result = run_cli("build", str(hf_model(kind)), "--target", "cpu", "--precision", "int8",
                     "--out", str(tmp_path / "out"), "--cache-dir", str(cache_dir),
                     "--json", "--profile", profile, *calibration)
    assert result.exit_code in (0, 1), result.output
    if result.exit_code == 1:
        assert "failed" in result.output or "below" in result.output
