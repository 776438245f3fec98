"""Item A of issue 32: a ``--serve text`` ensemble over a model with more than one output.

Post-processing reads the model's first output; the other outputs must not be ensemble
tensors, or Triton refuses the ensemble: core ``src/model_config_utils.cc`` (commit
73aad7c, line 275, "Check redundant ensemble tensors"): ``if (!tensor.second.ready ||
(tensor.second.next_nodes.size() == 0))`` -> "ensemble tensor '...' is unused in ensemble
'...'" for every tensor that is not an ensemble output. The bundled tritonserver (Triton
2.51) runs that validation itself here; the model is served through the ONNX Runtime
stand-in (``conftest.use_onnxruntime_standin``), the ensemble config is trtpack's as written.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.serving.conftest import TOKEN_INPUTS, BuiltModel, servable_copy
from tests.serving.tritonserver import TritonServer
from trtpack.serving.config import read_config, write_config
from trtpack.serving.ensemble import check_ensemble
from trtpack.serving.layout import ModelRepository

OUTPUTS = ("last_hidden_state", "pooler_output")


@pytest.fixture(scope="module")
def two_output_repo(minilm: BuiltModel, tmp_path_factory: pytest.TempPathFactory
                    ) -> ModelRepository:
    """MiniLM (real weights) exported with two outputs, as sentence-transformers' ONNX
    exports carry extra ones, written with ``--serve text``."""
    import torch
    from transformers import AutoModel

    class TwoOutputs(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out = self.inner(**dict(zip(TOKEN_INPUTS, args, strict=True)))
            return out.last_hidden_state, out.pooler_output

    root = tmp_path_factory.mktemp("two-outputs")
    model = AutoModel.from_pretrained(str(minilm.hf_dir)).eval()
    sample = tuple(torch.ones(2, 8, dtype=torch.long) for _ in TOKEN_INPUTS)
    axes = {n: {0: "batch", 1: "sequence"} for n in TOKEN_INPUTS}
    axes.update({OUTPUTS[0]: {0: "batch", 1: "sequence"}, OUTPUTS[1]: {0: "batch"}})
    torch.onnx.export(TwoOutputs(model), sample, str(root / "model.onnx"),  # type: ignore[arg-type]
                      input_names=list(TOKEN_INPUTS), output_names=list(OUTPUTS),
                      dynamic_axes=axes, opset_version=18, dynamo=False)
    return minilm.write(root / "model_repository", model_path=root / "model.onnx",
                        serve="text", name="minilm2")


def test_the_model_step_maps_only_what_postprocessing_reads(
        two_output_repo: ModelRepository) -> None:
    config = read_config(two_output_repo.root / "minilm2_ensemble" / "config.pbtxt")
    model_step = next(s for s in config.ensemble_scheduling.step if s.model_name == "minilm2")
    assert dict(model_step.output_map) == {"last_hidden_state": "last_hidden_state"}
    member = read_config(two_output_repo.root / "minilm2" / "config.pbtxt")
    assert [o.name for o in member.output] == list(OUTPUTS)  # the model keeps both


def test_check_ensemble_refuses_an_unused_tensor(two_output_repo: ModelRepository,
                                                 tmp_path: Path) -> None:
    """The mirror of Triton's rule: map the unread output back in and it is named."""
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(two_output_repo.root, repo)
    path = repo / "minilm2_ensemble" / "config.pbtxt"
    config = read_config(path)
    step = next(s for s in config.ensemble_scheduling.step if s.model_name == "minilm2")
    step.output_map["pooler_output"] = "pooler_output"
    write_config(path, config)
    assert check_ensemble(repo, "minilm2_ensemble") == [
        "minilm2_ensemble: ensemble tensor 'pooler_output' is unused in ensemble "
        "'minilm2_ensemble' (no step reads it and it is not an ensemble output)"]


@pytest.mark.triton
def test_tritonserver_loads_and_serves_the_two_output_ensemble(
        triton_server: Callable[..., TritonServer], two_output_repo: ModelRepository,
        minilm: BuiltModel, tmp_path: Path) -> None:
    """The Done-when line: the bundled tritonserver loads the ensemble (it exits at start
    on a model that fails its validation) and returns the sentence embedding."""
    import tritonclient.http as httpclient

    server = triton_server(servable_copy([two_output_repo], tmp_path / "served"))
    client = server.client()
    try:
        assert client.is_model_ready("minilm2_ensemble")
        text = np.array([[b"A man is playing a guitar."]], dtype=np.object_)
        request = httpclient.InferInput("TEXT", list(text.shape), "BYTES")
        request.set_data_from_numpy(text)
        result = client.infer("minilm2_ensemble", [request],
                              outputs=[httpclient.InferRequestedOutput("embedding")])
        embedding = result.as_numpy("embedding")
    finally:
        client.close()
    assert embedding is not None and embedding.shape == (1, 384)
    assert abs(float(np.linalg.norm(embedding[0])) - 1.0) < 1e-4  # mean-pooled, normalized
