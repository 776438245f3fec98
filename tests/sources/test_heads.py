"""Every common Hugging Face head, built from a tiny random-weight directory through the
CLI: the ONNX and the Triton model expose the head's outputs, the pipeline's own check
passes at every profile corner, and -- independently of the pipeline -- the served ONNX
agrees with the transformers model on the same real tokenized text (or images)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from tests.conftest import run_cli
from tests.hf_models import VISION_MODELS, VOCAB, make_model_dir, make_sentence_transformers_dir
from tests.serving.python_models import run_python_model
from trtpack.cases import load_cases
from trtpack.model_io import model_io_from_onnx
from trtpack.serving.config import check_config, read_config

PROFILE = "1x8:2x16:4x32"

# kind -> (task, {output: metric}, transformers class to compare with)
HEADS: dict[str, tuple[str, dict[str, str], str]] = {
    "gpt2-lm": ("text-generation", {"logits": "token_top1"}, "GPT2LMHeadModel"),
    "bert-qa": ("question-answering", {"start_logits": "span", "end_logits": "span"},
                "BertForQuestionAnswering"),
    "bert-mlm": ("fill-mask", {"logits": "token_top1"}, "BertForMaskedLM"),
    "bert-tokcls": ("token-classification", {"logits": "token_top1"},
                    "BertForTokenClassification"),
    "roberta-cls": ("sequence-classification", {"logits": "top1"},
                    "RobertaForSequenceClassification"),
    "distilbert-cls": ("sequence-classification", {"logits": "top1"},
                       "DistilBertForSequenceClassification"),
    "deberta-v2-cls": ("sequence-classification", {"logits": "top1"},
                       "DebertaV2ForSequenceClassification"),
    "electra-tokcls": ("token-classification", {"logits": "token_top1"},
                       "ElectraForTokenClassification"),
    "xlm-roberta-mlm": ("fill-mask", {"logits": "token_top1"}, "XLMRobertaForMaskedLM"),
    "vit-cls": ("image-classification", {"logits": "top1"}, "ViTForImageClassification"),
    "resnet-cls": ("image-classification", {"logits": "top1"}, "ResNetForImageClassification"),
    "convnext-cls": ("image-classification", {"logits": "top1"},
                     "ConvNextForImageClassification"),
    "vit-base-model": ("feature-extraction", {"pooler_output": "cosine"}, "ViTModel"),
    "resnet-base-model": ("feature-extraction", {"pooler_output": "cosine"}, "ResNetModel"),
}
FAST = {"gpt2-lm", "bert-qa"}


@pytest.fixture(scope="module")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hf-heads")




def build(model: Path | str, out: Path, cache_dir: Path, *extra: str,
          profile: str = PROFILE) -> dict[str, Any]:
    result = run_cli("build", str(model), "--target", "cpu", "--profile", profile,
                     "--out", str(out), "--cache-dir", str(cache_dir), "--json", *extra)
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def served_onnx(out: Path, name: str) -> Path:
    return out / "model_repository" / name / "1" / "model.onnx"


def check_served_config(out: Path, name: str) -> Any:
    config = read_config(out / "model_repository" / name / "config.pbtxt")
    io = model_io_from_onnx(served_onnx(out, name))
    assert check_config(config, io) == []
    assert [t.name for t in config.output] == [t.name for t in io.outputs]
    return io


def unpadded_top1(ref: np.ndarray, got: np.ndarray, mask: np.ndarray | None) -> float:
    """The worst sample's share of agreeing argmaxes (tokens: unpadded ones only)."""
    same = ref.argmax(-1) == got.argmax(-1)
    if same.ndim == 1:
        return float(same.min())
    keep = np.ones_like(same) if mask is None else mask.astype(bool)
    return float(((same & keep).sum(1) / keep.sum(1)).min())


def transformers_outputs(folder: Path, cls_name: str, inputs: dict[str, np.ndarray]
                         ) -> dict[str, np.ndarray]:
    import torch
    import transformers

    model = getattr(transformers, cls_name).from_pretrained(str(folder)).eval()
    with torch.inference_mode():
        out = model(**{k: torch.from_numpy(v) for k, v in inputs.items()}, use_cache=False) \
            if cls_name == "GPT2LMHeadModel" else \
            model(**{k: torch.from_numpy(v) for k, v in inputs.items()})
    return {k: v.float().numpy() for k, v in out.items() if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize(
    "kind", [pytest.param(k, marks=() if k in FAST else pytest.mark.slow) for k in HEADS])
def test_head_is_built_served_and_matches_transformers(
        kind: str, hf_model: Callable[[str], Path], cache_dir: Path, tmp_path: Path) -> None:
    task, metrics, cls_name = HEADS[kind]
    folder = hf_model(kind)
    recipe = run_cli("recipes", "show", str(folder))
    assert recipe.exit_code == 0 and f"task: {task}" in recipe.stdout
    out = tmp_path / "out"
    vision = kind in VISION_MODELS
    report = build(folder, out, cache_dir, profile="1:2:4" if vision else PROFILE)
    rows = [r for r in report["verification"] if r["check"] == "onnx-vs-torch"]
    assert {(r["corner"], r["output"]) for r in rows} == {
        (c, o) for c in ("min", "opt", "max") for o in metrics}
    assert all(r["passed"] and r["metric"] == metrics[r["output"]] for r in rows), rows
    io = check_served_config(out, kind)
    assert [t.name for t in io.outputs] == list(metrics)
    # independent of the pipeline: the served ONNX against transformers on the inputs the
    # build used (real tokenized text: every row starts with [CLS], rows are padded)
    session = ort.InferenceSession(str(served_onnx(out, kind)))
    cases = load_cases(out / "artifacts" / "export" / "reference.npz")
    assert {c.corner for c in cases} == {"min", "opt", "max"}
    if "attention_mask" in cases[0].inputs:
        assert any(c.inputs["attention_mask"].min() == 0 for c in cases)  # padded rows
    for case in cases:
        mask = case.inputs.get("attention_mask")
        if mask is not None:
            assert (case.inputs["input_ids"][:, 0] == 101).all()  # tokenized text
        got = dict(zip([o.name for o in session.get_outputs()],
                       session.run(None, case.inputs), strict=True))
        want = transformers_outputs(folder, cls_name, case.inputs)
        for name in metrics:
            assert got[name].shape == want[name].shape
            assert np.abs(got[name] - want[name]).max() < 1e-5, (case.label, name)
            assert unpadded_top1(want[name], got[name], mask if got[name].ndim == 3 else None
                                 ) == 1.0
            if metrics[name] == "span":  # per sample, the answer span's position agrees
                low = np.where(mask == 1, want[name], -np.inf).argmax(-1)
                assert (low == np.where(mask == 1, got[name], -np.inf).argmax(-1)).all()


@pytest.mark.slow
def test_sentence_transformers_directory_pools_as_its_modules_json(
        models_root: Path, cache_dir: Path, tmp_path: Path) -> None:
    import torch
    from sentence_transformers import SentenceTransformer

    folder = make_sentence_transformers_dir(models_root)
    out = tmp_path / "out"
    report = build(folder, out, cache_dir)
    rows = [r for r in report["verification"] if r["check"] == "onnx-vs-torch"]
    assert len(rows) == 3 and all(r["passed"] and r["metric"] == "cosine" for r in rows)
    io = check_served_config(out, folder.name)
    assert [t.name for t in io.outputs] == ["sentence_embedding"]
    session = ort.InferenceSession(str(served_onnx(out, folder.name)))
    st = SentenceTransformer(str(folder), device="cpu")
    for case in load_cases(out / "artifacts" / "export" / "reference.npz"):
        (got,) = session.run(None, case.inputs)
        with torch.inference_mode():
            want = st({k: torch.from_numpy(v) for k, v in case.inputs.items()}
                      )["sentence_embedding"].numpy()
        np.testing.assert_allclose(got, want, atol=1e-5)
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)  # Normalize


def test_causal_lm_refuses_text_serving(models_root: Path, tmp_path: Path) -> None:
    folder = make_model_dir("gpt2-lm", models_root / "refuse")
    result = run_cli("build", str(folder), "--target", "cpu", "--serve", "text",
                     "--out", str(tmp_path / "out"))
    assert result.exit_code == 2, result.output
    assert "TensorRT-LLM" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
    # help wraps at the terminal's width, and may break a line after a hyphen
    assert "TensorRT-LLM" in re.sub(r"-\n\s*", "-", run_cli("build", "--help").stdout)


def test_task_override_picks_another_head(models_root: Path) -> None:
    folder = make_model_dir("bert-mlm", models_root / "override")
    shown = run_cli("recipes", "show", str(folder), "--task", "question-answering")
    assert shown.exit_code == 0, shown.output
    assert "model_class: BertForQuestionAnswering" in shown.stdout
    assert "start_logits" in shown.stdout and "metric: span" in shown.stdout


def test_decoder_without_token_types_gets_no_token_type_ids(tmp_path: Path) -> None:
    """A causal LM whose config has no type_vocab_size (Llama, as transformers saves it)
    takes input_ids and attention_mask only; BERT (type_vocab_size 2) keeps token types."""
    from transformers import BertConfig, LlamaConfig

    from trtpack.sources.resolve import resolve_model

    llama = tmp_path / "tiny-llama"
    LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=2, vocab_size=VOCAB,
                architectures=["LlamaForCausalLM"]).save_pretrained(str(llama))
    assert "type_vocab_size" not in json.loads((llama / "config.json").read_text())
    recipe = resolve_model(str(llama))
    assert recipe.task == "text-generation"
    assert [i.name for i in recipe.inputs] == ["input_ids", "attention_mask"]
    bert = tmp_path / "tiny-bert"
    BertConfig(architectures=["BertForMaskedLM"]).save_pretrained(str(bert))
    assert [i.name for i in resolve_model(str(bert)).inputs] == [
        "input_ids", "attention_mask", "token_type_ids"]


@pytest.mark.parametrize(("kind", "output", "names"), [
    ("bert-mlm", "tokens", "vocabulary"),
    pytest.param("bert-tokcls", "labels", "id2label", marks=pytest.mark.slow),
])
def test_text_serving_postprocess_follows_the_head(kind: str, output: str, names: str,
                                                   hf_model: Callable[[str], Path],
                                                   cache_dir: Path, tmp_path: Path) -> None:
    from tests.hf_models import LABELS, minilm_dir

    folder = hf_model(kind)
    out = tmp_path / "out"
    build(folder, out, cache_dir, "--serve", "text")
    repo = out / "model_repository"
    post = repo / f"{kind}_postprocess"
    config = read_config(post / "config.pbtxt")
    assert config.parameters["mode"].string_value == "token_argmax"
    assert [o.name for o in read_config(repo / f"{kind}_ensemble" / "config.pbtxt").output
            ] == [output]
    expected = ((minilm_dir() / "vocab.txt").read_text(encoding="utf-8").splitlines()
                if names == "vocabulary" else [LABELS[i] for i in range(3)])
    assert json.loads((post / "1" / "labels.json").read_text()) == expected
    # the served model's logits on tokenized text, through the generated model.py
    case = load_cases(out / "artifacts" / "export" / "reference.npz")[-1]
    session = ort.InferenceSession(str(served_onnx(out, kind)))
    logits = session.run(None, case.inputs)[0]
    got = run_python_model(post, {"logits": logits})[output]
    assert got.shape == logits.shape[:2]
    top = logits.argmax(-1)
    assert [[v.decode() for v in row] for row in got] == [[expected[i] for i in row]
                                                           for row in top]


def test_class_name_suffixes_agree_with_transformers_tables() -> None:
    """Every transformers class whose suffix names a head (heads.suffix_heads) is in that
    head's table: the suffix shortcut (no torch import) never disagrees with transformers."""
    from trtpack.sources.heads import (
        class_names,
        head_in_tables,
        heads,
        suffix_heads,
        transformers_table,
    )

    classes = {c for head in heads() for v in transformers_table(head).values()
               for c in class_names(v)}
    checked, wrong = 0, []
    for cls in sorted(classes):
        task = next((t for suffix, t in suffix_heads() if cls.endswith(suffix)), None)
        if task is not None:
            checked += 1
            head = head_in_tables(cls)
            if head is None or head.task != task:
                wrong.append((cls, task, head and head.task))
    assert checked > 500 and wrong == []


def test_a_head_named_by_its_suffix_resolves_without_torch_or_transformers(
        tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.architecture.test_import_pure import BLOCKER

    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "bert", "architectures": ["BertForTokenClassification"],
         "type_vocab_size": 2, "id2label": {"0": "O", "1": "PER"}}))
    code = (f"from trtpack.sources.resolve import resolve_model\n"
            f"print(resolve_model({str(tmp_path)!r}).task)\n")
    proc = subprocess.run([sys.executable, "-c", BLOCKER + code], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "token-classification", proc.stderr
