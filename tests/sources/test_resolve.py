"""MODEL as an ONNX file exported outside trtpack, a hub id in the local cache, and every
bad input the resolver must turn into one line and exit 2 (nothing written to --out)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from tests.conftest import run_cli
from tests.hf_models import copy_tokenizer, make_model_dir
from trtpack.cases import load_cases
from trtpack.errors import UserInputError
from trtpack.model_io import model_io_from_onnx
from trtpack.serving.config import check_config, read_config
from trtpack.sources.resolve import resolve_model


def export_outside(folder: Path, external: bool) -> Path:
    """A BERT exported by torch.onnx.export (legacy exporter, as trtexec users have it):
    unnamed-per-input dynamic axes, two outputs; optionally weights in 'weights.bin'."""
    import onnx
    import torch
    from transformers import BertConfig, BertModel

    class Wrapper(torch.nn.Module):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask)
            return out.last_hidden_state, out.pooler_output

    folder.mkdir(parents=True)
    torch.manual_seed(0)
    model = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=64, vocab_size=30522,
                                 max_position_embeddings=128)).eval()
    ids = torch.randint(1000, 30000, (2, 8))
    path = folder / "model.onnx"
    torch.onnx.export(Wrapper(model).eval(), (ids, torch.ones_like(ids)), str(path),
                      input_names=["input_ids", "attention_mask"],
                      output_names=["last_hidden_state", "pooler_output"],
                      dynamic_axes={"input_ids": [0, 1], "attention_mask": [0, 1]},
                      dynamo=False, opset_version=17)
    if external:
        proto = onnx.load(str(path))
        onnx.save(proto, str(path), save_as_external_data=True, location="weights.bin",
                  size_threshold=1024)
    return path


@pytest.fixture(scope="module")
def onnx_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("onnx-in")
    return {"single file": export_outside(root / "plain", external=False),
            "external data": export_outside(root / "external", external=True)}


@pytest.mark.parametrize("layout", ["single file", "external data"])
def test_onnx_exported_outside_builds_fp16_and_is_compared_with_itself(
        layout: str, onnx_files: dict[str, Path], cache_dir: Path, tmp_path: Path) -> None:
    source = onnx_files[layout]
    assert (source.parent / "weights.bin").is_file() is (layout == "external data")
    out = tmp_path / "out"
    # the command as it is (the profile inferred from the graph) for one layout
    profile = ["--profile", "1x8:2x16:4x32"] if layout == "single file" else []
    result = run_cli("build", str(source), "--target", "g5", "--no-engine", "--precision",
                     "fp16",
                     *profile, "--out", str(out), "--cache-dir", str(cache_dir), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [s["name"] for s in report["stages"]][:2] == ["import", "simplify"]  # no export
    checks = {r["check"] for r in report["verification"]}
    assert checks == {"simplified-vs-input-onnx", "fp16-vs-fp32"}
    for check in checks:
        rows = [r for r in report["verification"] if r["check"] == check]
        assert {(r["corner"], r["output"]) for r in rows} == {
            (c, o) for c in ("min", "opt", "max") for o in ("last_hidden_state",
                                                            "pooler_output")}
        assert all(r["passed"] for r in rows), rows
    assert {r["metric"] for r in report["verification"]} == {"pooled_cosine", "cosine"}
    served = out / "model_repository" / "model" / "1" / "model.onnx"
    config = read_config(served.parent.parent / "config.pbtxt")
    io = model_io_from_onnx(served)
    assert check_config(config, io) == [] and config.max_batch_size == (4 if profile else 8)
    assert [t.name for t in config.input] == ["input_ids", "attention_mask"]
    # the reference is the user's ONNX in ONNX Runtime, on in-vocabulary ids with padding
    original = ort.InferenceSession(str(source))
    fp16 = ort.InferenceSession(str(served))
    cases = load_cases(out / "artifacts" / "import" / "reference.npz")
    assert len(cases) == 3
    assert any(c.inputs["attention_mask"].min() == 0 for c in cases)
    for case in cases:
        assert case.inputs["input_ids"].max() < 30522 and len(np.unique(case.inputs[
            "input_ids"])) > 3
        want = original.run(None, case.inputs)
        np.testing.assert_array_equal(want[0], case.outputs["last_hidden_state"])
        got = fp16.run(None, case.inputs)
        for a, b in zip(want[1], got[1], strict=True):  # per sample: pooled output
            assert np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)) > 0.999
    # bench on an ONNX-in build: the served model and the input ONNX are timed on the import
    # stage's recorded inputs; PyTorch is skipped with its reason (no PyTorch model)
    result = run_cli("bench", str(out), "--seconds", "0.1", "--threads", "1")
    assert result.exit_code == 0, result.output
    rows = json.loads((out / "report.json").read_text())["benchmark"]["rows"]
    assert {(r["runtime"], r["status"]) for r in rows} == {
        ("served", "ok"), ("onnx-fp32", "ok"), ("pytorch", "skipped")}  # no CPU model: g5
    assert all(r["p50_ms"] > 0 for r in rows if r["status"] == "ok")


def test_recipes_show_prints_the_inferred_recipe_that_builds_as_a_file(
        onnx_files: dict[str, Path], tmp_path: Path) -> None:
    shown = run_cli("recipes", "show", str(onnx_files["external data"]))
    assert shown.exit_code == 0, shown.output
    assert "onnx: " in shown.stdout and "axes:\n  - batch\n" in shown.stdout
    saved = tmp_path / "mine.yaml"
    saved.write_text(shown.stdout)
    assert resolve_model(str(saved)).model_dump() == resolve_model(
        str(onnx_files["external data"])).model_dump()


def _graph_with_unrelated_dynamic_dims(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [None, None])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [None, None, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    graph = helper.make_graph([
        helper.make_node("ReduceSum", ["a"], ["sa"], keepdims=0),
        helper.make_node("ReduceSum", ["b"], ["sb"], keepdims=0),
        helper.make_node("Add", ["sa", "sb"], ["y"])], "g", [a, b], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.save(model, str(path))
    return path


def test_unnamed_dynamic_dims_are_dim_k_and_listed_when_a_profile_misses_one(
        tmp_path: Path) -> None:
    path = _graph_with_unrelated_dynamic_dims(tmp_path / "g.onnx")
    recipe = resolve_model(str(path))
    assert [i.axes for i in recipe.inputs] == [["batch", "dim_1"], ["batch", "dim_3", 4]]
    result = run_cli("build", str(path), "--target", "cpu", "--profile", "1x8:2x16:4x32",
                     "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert "(batch, dim_1, dim_3)" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def _write_bad_inputs(root: Path, onnx_files: dict[str, Path]) -> dict[str, Path]:
    import shutil

    bad: dict[str, Path] = {}
    bad["random binary"] = root / "random.bin"
    bad["random binary"].write_bytes(np.random.default_rng(0).bytes(5000))
    data = onnx_files["single file"].read_bytes()
    bad["truncated onnx"] = root / "truncated.onnx"
    bad["truncated onnx"].write_bytes(data[: len(data) // 3])
    bad["yaml named .onnx"] = root / "recipe.onnx"
    bad["yaml named .onnx"].write_text("extends: tiny-bert\nname: x\n")
    missing = root / "missing-data"
    missing.mkdir()
    shutil.copy(onnx_files["external data"], missing / "model.onnx")
    bad["missing external data"] = missing / "model.onnx"
    cut = root / "cut-data"
    cut.mkdir()
    shutil.copy(onnx_files["external data"], cut / "model.onnx")
    weights = (onnx_files["external data"].parent / "weights.bin").read_bytes()
    (cut / "weights.bin").write_bytes(weights[:1000])
    bad["truncated external data"] = cut / "model.onnx"
    bad["directory without config.json"] = root / "empty-dir"
    bad["directory without config.json"].mkdir()
    unsupported = root / "pretraining"
    unsupported.mkdir()
    (unsupported / "config.json").write_text(json.dumps(
        {"model_type": "bert", "architectures": ["BertForPreTraining"]}))
    bad["unsupported architecture"] = unsupported
    for case, modules, pooling in (
            ("modules.json not a list", '{"0": "Transformer"}', None),
            ("modules.json of strings", '["Transformer"]', None),
            ("damaged pooling config",
             '[{"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"}]',
             '{"pooling_mode_cls_token": tru')):
        st = root / case.replace(" ", "-")
        (st / "1_Pooling").mkdir(parents=True)
        (st / "modules.json").write_text(modules)
        (st / "config.json").write_text(json.dumps({"model_type": "bert"}))
        if pooling is not None:
            (st / "1_Pooling" / "config.json").write_text(pooling)
        bad[case] = st
    return bad


EXPECTED = {
    "random binary": "neither a recipe YAML file nor an ONNX model",
    "truncated onnx": "not a readable ONNX model (damaged or truncated",
    "yaml named .onnx": "is named .onnx but holds text",
    "missing external data": "external data 'weights.bin', which is missing",
    "truncated external data": "(truncated?)",
    "directory without config.json": "without config.json",
    "unsupported architecture": "architecture BertForPreTraining is not supported; trtpack "
                                "builds these heads: sequence-classification",
    "modules.json not a list": "modules.json is not a list of modules",
    "modules.json of strings": "modules.json is not a list of modules",
    "damaged pooling config": "cannot read ",
}


@pytest.mark.parametrize("case", list(EXPECTED))
def test_bad_model_is_one_line_and_exit_2(case: str, onnx_files: dict[str, Path],
                                          tmp_path: Path) -> None:
    model = _write_bad_inputs(tmp_path, onnx_files)[case]
    out = tmp_path / "out"
    result = run_cli("build", str(model), "--target", "cpu", "--out", str(out))
    assert result.exit_code == 2, result.output
    assert EXPECTED[case] in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.output
    assert not out.exists() and not list(tmp_path.glob("out*"))


def test_task_the_architecture_lacks_is_exit_2(tmp_path: Path) -> None:
    folder = make_model_dir("gpt2-lm", tmp_path)
    result = run_cli("build", str(folder), "--task", "fill-mask", "--target", "cpu",
                     "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert "model type 'gpt2' has no fill-mask head" in result.stderr
    assert "text-generation" in result.stderr  # what it has
    assert not (tmp_path / "out").exists()
    bad = run_cli("build", str(folder), "--task", "translation", "--out", str(tmp_path / "o"))
    assert bad.exit_code == 2 and "unknown --task 'translation'" in bad.stderr


def _fake_hub_cache(root: Path, model_id: str, source: Path) -> None:
    import shutil

    repo = root / f"models--{model_id.replace('/', '--')}"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(source, repo / "snapshots" / commit)


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trtpack.cli", *args], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=300, check=False)


def test_hub_id_is_found_in_the_local_cache_offline_and_a_missing_one_is_exit_2(
        tmp_path: Path) -> None:
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "bert", "architectures": ["BertForTokenClassification"],
         "hidden_size": 32, "vocab_size": 30522, "id2label": {"0": "O", "1": "PER"}}))
    copy_tokenizer(folder)
    _fake_hub_cache(tmp_path / "hub", "acme/tiny-ner", folder)
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    shown = _cli("recipes", "show", "acme/tiny-ner", env=env)
    assert shown.returncode == 0, shown.stderr
    assert "task: token-classification" in shown.stdout
    assert "snapshots/" + "0" * 40 in shown.stdout
    assert "name: tiny-ner\n" in shown.stdout  # named from the id, not the commit hash
    _fake_hub_cache(tmp_path / "hub", "tiny-ner", folder)  # a bare id, like "gpt2"
    bare = _cli("recipes", "show", "tiny-ner", env=env)
    assert bare.returncode == 0 and "models--tiny-ner/snapshots/" in bare.stdout, bare.stderr
    assert "name: tiny-ner\n" in bare.stdout
    missing = _cli("build", "acme/not-cached", "--target", "cpu", "--out",
                   str(tmp_path / "out"), env=env)
    assert missing.returncode == 2
    assert "'acme/not-cached' is not in the local Hugging Face cache" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("text", "name"), [
    ("_x", "x"), ("bert (copy)", "bert--copy-"), ("--", "model"), (".hidden", "hidden"),
    ("résumé", "r-sum-"), ("ok_1.2-b", "ok_1.2-b")])
def test_safe_name_is_a_valid_recipe_name(text: str, name: str) -> None:
    from trtpack.sources.recipe import RECIPE_NAME, safe_name

    assert safe_name(text) == name
    assert re.match(RECIPE_NAME, safe_name(text))


def test_inferred_names_of_odd_files_and_folders_are_valid(onnx_files: dict[str, Path],
                                                            tmp_path: Path) -> None:
    import shutil

    onnx = tmp_path / "_x.onnx"
    shutil.copy(onnx_files["single file"], onnx)
    assert resolve_model(str(onnx)).name == "x"
    folder = tmp_path / "bert (copy)"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "bert", "architectures": ["BertForSequenceClassification"]}))
    assert resolve_model(str(folder)).name == "bert--copy-"


def test_recipe_pointing_at_an_onnx_file(onnx_files: dict[str, Path], tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    shown = run_cli("recipes", "show", str(onnx_files["single file"])).stdout
    recipe.write_text(shown.replace("name: model", "name: from-recipe"))
    loaded = resolve_model(str(recipe))
    assert loaded.source.onnx == str(onnx_files["single file"].resolve())
    assert loaded.name == "from-recipe"
    with pytest.raises(UserInputError, match="does not exist"):
        resolve_model(str(tmp_path / "nope.onnx"))


def test_recipe_with_onnx_source_and_tokenizer_beside_it_serves_text(
        onnx_files: dict[str, Path], cache_dir: Path, tmp_path: Path) -> None:
    import shutil

    folder = tmp_path / "with-tokenizer"
    folder.mkdir()
    shutil.copy(onnx_files["single file"], folder / "encoder.onnx")
    copy_tokenizer(folder)
    shown = run_cli("recipes", "show", str(folder / "encoder.onnx"))
    assert "tokenizer: true" in shown.stdout
    recipe = tmp_path / "encoder.yaml"
    recipe.write_text(shown.stdout)
    out = tmp_path / "out"
    result = run_cli("build", str(recipe), "--target", "cpu", "--serve", "text",
                     "--profile", "1x8:2x16:4x32", "--out", str(out),
                     "--cache-dir", str(cache_dir), "--json")
    assert result.exit_code == 0, result.output
    repo = out / "model_repository"
    assert sorted(p.name for p in repo.iterdir()) == [
        "encoder", "encoder_ensemble", "encoder_tokenizer"]
    assert (repo / "encoder_tokenizer" / "1" / "tokenizer" / "tokenizer.json").is_file()
    cases = load_cases(out / "artifacts" / "import" / "reference.npz")
    assert all((c.inputs["input_ids"][:, 0] == 101).all() for c in cases)  # tokenized text


def test_set_vocab_size_bounds_the_token_ids_of_an_onnx_without_tokenizer(
        onnx_files: dict[str, Path], cache_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run_cli("build", str(onnx_files["single file"]), "--target", "cpu",
                     "--profile", "1x8:2x16:4x32", "--set", "vocab_size=500",
                     "--out", str(out), "--cache-dir", str(cache_dir), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["stages"][0]["metrics"]["vocab_size"] == 500
    for case in load_cases(out / "artifacts" / "import" / "reference.npz"):
        ids = case.inputs["input_ids"][case.inputs["attention_mask"] == 1]
        assert ids.max() < 500 and len(np.unique(ids)) > 3


def test_gpt2_style_tokenizer_without_tokenizer_json_is_found_and_loaded(tmp_path: Path
                                                                        ) -> None:
    """vocab.json + merges.txt (a byte-level BPE saved the GPT-2 way, no tokenizer.json):
    the resolver, the model loader and the served vocabulary all read it."""
    from trtpack.pytorch.models import load_tokenizer
    from trtpack.serving.postprocess import vocabulary

    folder = tmp_path / "gpt2-bpe"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": 6,
         "n_embd": 32, "n_positions": 64}))
    tokens = ["<|endoftext|>", "h", "i", "hi", "Ġ", "Ġhi"]
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    (folder / "merges.txt").write_text("#version: 0.2\nh i\nĠ hi\n", encoding="utf-8")
    recipe = resolve_model(str(folder))
    assert recipe.tokenizer and recipe.task == "text-generation"
    tokenizer = load_tokenizer(recipe, folder)
    assert tokenizer is not None
    assert tokenizer("hi hi")["input_ids"] == [3, 5]
    assert vocabulary(folder) == tuple(tokens)
