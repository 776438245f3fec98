"""Every shipped recipe that no other test builds (classifier and vision paths), built for
the CPU with random weights at small profiles: exit 0, ONNX Runtime agrees with PyTorch at
every corner (top-1), and the Triton config matches the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from trtpack.serving.config import read_config

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("recipe", "profile", "input_dims", "output_dims"),
    [
        ("distilbert", "1x8:2x16:4x32", {"input_ids": [-1], "attention_mask": [-1]}, [2]),
        ("resnet-50", "1:2:4", {"pixel_values": [3, 224, 224]}, [1000]),
    ],
)
def test_shipped_recipe_builds_and_verifies(recipe: str, profile: str,
                                            input_dims: dict[str, list[int]],
                                            output_dims: list[int], tmp_path: Path,
                                            cache_dir: Path) -> None:
    out = tmp_path / "out"
    result = run_cli("build", recipe, "--random-weights", "--target", "cpu", "--profile",
                     profile, "--out", str(out), "--cache-dir", str(cache_dir), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    rows = [r for r in report["verification"] if r["check"] == "onnx-vs-torch"]
    assert {r["corner"] for r in rows} == {"min", "opt", "max"}
    assert all(r["passed"] and r["metric"] == "top1" and r["metric_value"] == 1.0
               for r in rows), rows
    config = read_config(out / "model_repository" / recipe / "config.pbtxt")
    assert config.max_batch_size == 4
    assert {i.name: list(i.dims) for i in config.input} == input_dims
    assert [list(o.dims) for o in config.output] == [output_dims]
