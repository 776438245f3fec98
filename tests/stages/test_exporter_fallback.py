"""Export that does not give up: a model the dynamo exporter cannot export (a branch on the
data) is exported by the TorchScript exporter instead and verified the same way, and the
report says which exporter wrote it and why; Swin with a dynamic batch, which failed in the
exporter's type-promotion pass, is exported by the dynamo exporter now that the pass runs
only where a cast is needed; a model whose own PyTorch forward fails at the profile's shapes
is the user's error (exit 2, naming the shape), not "export failed"."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from tests.conftest import run_cli
from tests.hf_models import make_model_dir


def make_tiny_swin(root: Path) -> Path:
    """A random-weight SwinForImageClassification, 32x32 images, two stages of one block."""
    import torch
    import transformers

    torch.manual_seed(0)
    labels = {i: f"L{i}" for i in range(4)}
    config = transformers.SwinConfig(
        image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
        window_size=2, num_labels=4, id2label=labels,
        label2id={v: k for k, v in labels.items()})
    folder = root / "swin-tiny"
    transformers.SwinForImageClassification(config).eval().save_pretrained(str(folder))
    return folder


def test_swin_with_dynamic_batch_builds_with_the_dynamo_exporter(tmp_path: Path) -> None:
    """Its graph needs no cast: the type-promotion pass, whose re-run of a view on symbolic
    shapes failed ("Cannot view a tensor"), is not run, and the dynamo export is verified at
    every corner with the batch still dynamic."""
    folder = make_tiny_swin(tmp_path)
    out = tmp_path / "out"
    result = run_cli("build", str(folder), "--target", "cpu", "--profile", "1:2:4", "--out",
                     str(out), "--cache-dir", str(tmp_path / "cache"), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    export = report["stages"][0]
    assert export["name"] == "export"
    assert (export["metrics"]["exporter"], export["metrics"]["exporter_fallback"]) == \
        ("dynamo", "")
    rows = [r for r in report["verification"] if r["check"] == "onnx-vs-torch"]
    assert {r["corner"] for r in rows} == {"min", "opt", "max"}
    assert all(r["passed"] and r["metric"] == "top1" and r["metric_value"] == 1.0
               for r in rows), rows
    assert max(r["max_abs_diff"] for r in rows) < 1e-4
    served = onnx.load(str(out / "model_repository" / "swin-tiny" / "1" / "model.onnx"),
                       load_external_data=False)
    batch = served.graph.input[0].type.tensor_type.shape.dim[0]
    assert batch.dim_param == "batch"  # the batch stayed dynamic


BRANCHY = """
import torch


class Branchy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        if x.abs().sum() >= 0:  # a branch on the data: torch.export cannot trace it
            return torch.relu(self.lin(x))
        return -self.lin(x)


def make_model():
    torch.manual_seed(0)
    return Branchy(), (torch.randn(2, 8),)
"""


def test_a_model_dynamo_cannot_export_builds_through_the_torchscript_fallback(
        tmp_path: Path) -> None:
    factory = tmp_path / "branchy.py"
    factory.write_text(BRANCHY)
    out = tmp_path / "out"
    result = run_cli("build", f"{factory}:make_model", "--target", "cpu", "--profile",
                     "1x8:2x8:4x8", "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
                     "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    export = report["stages"][0]
    assert export["name"] == "export"
    assert export["metrics"]["exporter"] == "legacy"
    why = export["metrics"]["exporter_fallback"]
    assert why.startswith("the dynamo exporter failed ("), why
    assert any(w.startswith(why) and "TorchScript exporter (dynamo=False)" in w
               for w in report["warnings"]), report["warnings"]
    rows = [r for r in report["verification"] if r["check"] == "onnx-vs-torch"]
    assert {r["corner"] for r in rows} == {"min", "opt", "max"}
    assert all(r["passed"] for r in rows), rows
    assert max(r["max_abs_diff"] for r in rows) < 1e-5
    assert "dynamo exporter failed" in (out / "logs" / "export.log").read_text()


def test_a_model_the_dynamo_exporter_handles_says_so(tiny_build: Path) -> None:
    report = json.loads((tiny_build / "report.json").read_text())
    metrics = report["stages"][0]["metrics"]
    assert (metrics["exporter"], metrics["exporter_fallback"]) == ("dynamo", "")


def test_forward_failing_at_the_profile_shape_is_the_users_error(tmp_path: Path) -> None:
    """A BERT with 64 positions asked for sequences of 128: its own forward fails."""
    folder = make_model_dir("bert-base-model", tmp_path)
    out = tmp_path / "out"
    result = run_cli("build", str(folder), "--target", "cpu", "--profile",
                     "1x16:2x32:2x128", "--out", str(out),
                     "--cache-dir", str(tmp_path / "cache"))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert lines and "the model's own PyTorch forward fails at profile 0 max " \
        "(input_ids=2x128, attention_mask=2x128, token_type_ids=2x128)" in lines[0], \
        result.stderr
    assert "export failed" not in result.output and "Traceback" not in result.output
    assert not out.exists()


@pytest.mark.parametrize("message, expected", [
    ("Failed to decompose.\n## Exception summary\n\n<class 'ValueError'>: Cannot view x\n",
     "ValueError: Cannot view x"),
    ("plain first line\nsecond", "RuntimeError: plain first line"),
    ("", "RuntimeError: "),
])
def test_exporter_failure_is_one_line(message: str, expected: str) -> None:
    from trtpack.pytorch.onnx_export import exporter_failure

    assert exporter_failure(RuntimeError(message)) == expected
