"""Real PyTorch models built end to end on the CPU target and verified against the module at
every profile corner: a factory of the user's own (several inputs and outputs, a sibling
module, a weights file) that rebuilds when any of them changes; an ExportedProgram saved with
a dynamic batch; ``silero_vad.jit`` from the silero-vad wheel (TorchScript, its sample rate a
constant); a Hugging Face model passed to ``trtpack.build`` as an ``nn.Module`` object."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import trtpack

BLOCKS = '''
import torch


class TwoHeads(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU())
        self.score = torch.nn.Linear(32, 3)
        self.embed = torch.nn.Linear(32, 8)

    def forward(self, features, scale):
        h = self.body(features) * scale
        return {"scores": self.score(h),
                "embedding": torch.nn.functional.normalize(self.embed(h), dim=-1)}
'''

FACTORY = '''
from pathlib import Path

import torch

from blocks import TwoHeads


def make_model():
    torch.manual_seed(0)
    model = TwoHeads()
    model.load_state_dict(torch.load(Path(__file__).parent / "weights.pt", weights_only=True))
    return model, (torch.randn(2, 16), torch.rand(2, 1) + 0.5)
'''


def _report(out: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    return report


def _served_sha(out: Path) -> str:
    onnx = next((out / "model_repository").glob("*/1/model.onnx"))
    return hashlib.sha256(onnx.read_bytes()).hexdigest()


def _verified_everywhere(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The onnx-vs-torch rows: one per corner and output, all passed."""
    rows = [r for r in report["verification"] if r["check"] == "onnx-vs-torch"]
    assert rows and all(r["passed"] for r in rows), rows
    assert {r["corner"] for r in rows} == {"min", "opt", "max"}
    return rows


def _write_weights(folder: Path, seed: int) -> None:
    import torch

    sys.path.insert(0, str(folder))
    try:
        from blocks import TwoHeads  # the project's own module, as the factory imports it

        torch.manual_seed(seed)
        torch.save(TwoHeads().state_dict(), folder / "weights.pt")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("blocks", None)


def test_factory_rebuilds_when_its_code_or_weights_change(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "blocks.py").write_text(BLOCKS)
    (project / "make.py").write_text(FACTORY)
    _write_weights(project, seed=1)
    out, cache = tmp_path / "out", tmp_path / "cache"

    def build() -> dict[str, Any]:
        done = trtpack("build", "make.py:make_model", "--target", "cpu", "--out", str(out),
                       "--cache-dir", str(cache), cwd=project, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return _report(out)

    first = build()
    rows = _verified_everywhere(first)
    assert {r["output"] for r in rows} == {"scores", "embedding"}
    export = next(s for s in first["stages"] if s["name"] == "export")
    assert export["metrics"]["source"].startswith("factory ") and \
        export["metrics"]["exporter"] == "dynamo"
    sha = _served_sha(out)

    again = build()  # nothing changed: every stage reused, the same model
    assert all(s["cached"] for s in again["stages"]
               if s["status"] == "ok" and s["name"] != "package")  # package always writes
    assert _served_sha(out) == sha

    (project / "blocks.py").write_text(BLOCKS.replace("GELU()", "Tanh()"))  # a sibling module
    edited = build()
    assert not next(s for s in edited["stages"] if s["name"] == "export")["cached"]
    _verified_everywhere(edited)
    assert _served_sha(out) != sha
    sha = _served_sha(out)

    _write_weights(project, seed=2)  # the weights file the factory reads
    reweighted = build()
    assert not next(s for s in reweighted["stages"] if s["name"] == "export")["cached"]
    _verified_everywhere(reweighted)
    assert _served_sha(out) != sha


def test_exported_program_with_a_dynamic_batch(tmp_path: Path) -> None:
    import torch

    class Mixer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(12, 6)

        def forward(self, tokens: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, ...]:
            mixed = self.proj(tokens) + bias
            return mixed, mixed.softmax(-1).amax(-1)

    batch = torch.export.Dim("batch", max=32)
    program = torch.export.export(Mixer().eval(), (torch.randn(4, 12), torch.randn(4, 6)),
                                  dynamic_shapes=({0: batch}, {0: batch}))
    path = tmp_path / "mixer.pt2"
    torch.export.save(program, str(path))
    out = tmp_path / "out"
    done = trtpack("build", str(path), "--target", "cpu", "--out", str(out), "--cache-dir",
                   str(tmp_path / "cache"), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "memory not estimated" not in done.stdout + done.stderr  # traced on meta
    report = _report(out)
    # torch.export reports the batch from 0 or 2; the program runs at 1, so min is 1
    assert report["profiles"] == ["tokens=1x12:4x12:8x12,bias=1x6:4x6:8x6"]
    rows = _verified_everywhere(report)
    assert {r["output"] for r in rows} == {"output_0", "output_1"}
    export = next(s for s in report["stages"] if s["name"] == "export")
    assert export["metrics"]["source"] == "ExportedProgram mixer.pt2"


@pytest.mark.slow
def test_silero_vad_torchscript_with_its_sample_rate_as_a_constant(tmp_path: Path) -> None:
    silero_vad = pytest.importorskip("silero_vad")
    jit = Path(silero_vad.__file__).parent / "data" / "silero_vad.jit"
    out = tmp_path / "out"
    done = trtpack("build", str(jit), "--input", "x=float32[batch,512]", "--input", "sr=16000",
                   "--target", "cpu", "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
                   timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "memory not estimated" not in done.stdout + done.stderr
    report = _report(out)
    rows = _verified_everywhere(report)
    assert max(r["max_abs_diff"] for r in rows) < 1e-4
    export = next(s for s in report["stages"] if s["name"] == "export")["metrics"]
    assert export["source"] == "TorchScript silero_vad.jit" and export["exporter"] == "legacy"
    recipe = (out / "recipe.yaml").read_text()
    assert "sr: 16000" in recipe  # folded into the graph, recorded in the recipe
    served = next((out / "model_repository").glob("*/config.pbtxt")).read_text()
    assert '"x"' in served and '"sr"' not in served


@pytest.mark.slow
def test_hugging_face_module_object_through_the_python_api(tmp_path: Path) -> None:
    import numpy as np
    import torch
    from transformers import BertConfig, BertModel

    import trtpack

    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=500, hidden_size=32, num_hidden_layers=2,
                                num_attention_heads=2, intermediate_size=64,
                                max_position_embeddings=128))
    ids = torch.randint(0, 500, (2, 16))
    built = trtpack.build(
        bert, example_inputs={"input_ids": ids, "attention_mask": torch.ones_like(ids)},
        input=["input_ids=int64[batch,sequence]", "attention_mask=int64[batch,sequence]"],
        profile="1x8:4x16:8x32", target="cpu", out=tmp_path / "out",
        cache_dir=str(tmp_path / "cache"))
    assert built.ok and built.served_model.name == "model.onnx"
    rows = _verified_everywhere(built.report.to_dict())
    assert {r["output"] for r in rows} == {"last_hidden_state", "pooler_output"}
    feeds = {"input_ids": ids.numpy(), "attention_mask": np.ones((2, 16), dtype=np.int64)}
    with torch.inference_mode():
        expected = bert(input_ids=ids, attention_mask=torch.ones_like(ids)).pooler_output
    got = built.run(feeds)["pooler_output"]
    assert np.abs(got - expected.numpy()).max() < 1e-4
    # the same module again: its .pt2 and every stage are reused
    again = trtpack.build(
        bert, example_inputs={"input_ids": ids, "attention_mask": torch.ones_like(ids)},
        input=["input_ids=int64[batch,sequence]", "attention_mask=int64[batch,sequence]"],
        profile="1x8:4x16:8x32", target="cpu", out=tmp_path / "out",
        cache_dir=tmp_path / "cache")
    assert all(s.cached for s in again.report.stages
               if s.status == "ok" and s.name != "package")
    assert os.path.samefile(again.served_model, built.served_model) or \
        again.served_model.read_bytes() == built.served_model.read_bytes()


@pytest.mark.parametrize("config", [
    {"model_type": "bert", "vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 2,
     "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 64},
    {"model_type": "gpt2", "vocab_size": 300, "n_embd": 32, "n_layer": 2, "n_head": 4,
     "n_positions": 64},
    {"model_type": "resnet", "num_channels": 3, "embedding_size": 8, "hidden_sizes": [8, 16],
     "depths": [1, 1], "layer_type": "bottleneck"},
])
def test_random_weights_initialized_once_match_a_plain_build(config: dict[str, Any]) -> None:
    """Random weights built on the meta device and initialized once by the model's own
    init_weights have a plain build's parameters and buffers: the same names and shapes,
    the same buffers (position ids, batch-norm statistics), weights of the same scale; and
    the same seed gives the same weights."""
    import torch

    from trtpack.pytorch.models import model_config, model_module
    from trtpack.sources.resolve import resolve_model

    recipe = resolve_model("tiny-bert").model_copy(update={"config": config})
    built = {}
    for init_once in (False, True, True):
        torch.manual_seed(5)
        module = model_module(recipe, model_config(recipe), init_once=init_once).eval()
        built.setdefault(init_once, []).append(module)
    plain, once, again = built[False][0], built[True][0], built[True][1]
    plain_params, once_params = dict(plain.named_parameters()), dict(once.named_parameters())
    assert {k: v.shape for k, v in once_params.items()} == \
        {k: v.shape for k, v in plain_params.items()}
    for name, buffer in plain.named_buffers():
        assert torch.equal(dict(once.named_buffers())[name], buffer), name
    for name, param in once_params.items():
        assert torch.isfinite(param).all(), name
        assert torch.equal(param, dict(again.named_parameters())[name]), name  # seeded
        if param.numel() >= 256:  # a weight matrix: the scale of the plain build's
            ratio = float(param.detach().std() / plain_params[name].detach().std())
            assert 0.8 < ratio < 1.25, (name, ratio)
    # not a plain build after all (its generator draws differ: the constructors drew none)
    assert any(not torch.equal(p, plain_params[n]) for n, p in once_params.items())
    # the model runs on them
    with torch.inference_mode():
        if config["model_type"] == "resnet":
            out = once(pixel_values=torch.randn(2, 3, 32, 32)).last_hidden_state
        else:
            out = once(input_ids=torch.randint(0, 300, (2, 9))).last_hidden_state
    assert torch.isfinite(out).all()
