"""Synthetic models for tests and benchmarks, built from nothing but a seed.

``conv_onnx`` is a small convolutional ONNX model (an image model, no transformer fields).

``big_embedding_model`` is the large-model case: its weights (2.46 GB of float32) are past
protobuf's 2 GiB limit, so its ONNX model has to keep them in an external data file, while
computing it costs little (an embedding look-up, a masked mean and a small projection).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# 600,000 x 1,024 float32 = 2,457,600,000 bytes: past 2**31 (2,147,483,648) with room to spare.
BIG_VOCAB_SIZE = 600_000
BIG_HIDDEN_SIZE = 1_024
BIG_OUTPUT_SIZE = 256
BIG_SEED = 0


def big_embedding_model() -> torch.nn.Module:
    """An embedding model over 2 GB: ``(input_ids, attention_mask) -> sentence_embedding``.

    ``input_ids`` and ``attention_mask`` are int64 ``[batch, sequence]``; the output is float32
    ``[batch, 256]``: the embeddings of the unmasked tokens, averaged, projected and squashed
    by ``tanh``. The weights come from a fixed seed, so two calls build the same model.
    """
    import torch

    class BigEmbeddingModel(torch.nn.Module):
        def __init__(self, vocab_size: int, hidden_size: int, output_size: int,
                     seed: int) -> None:
            super().__init__()
            self.vocab_size = vocab_size  # the range of realistic input_ids
            generator = torch.Generator().manual_seed(seed)
            # _weight skips nn.Embedding's own initialisation (one fill of 2.4 GB, not two);
            # uniform_ fills it faster than normal_ (benchmarks/README.md, "Figures behind
            # design choices")
            table = torch.empty(vocab_size, hidden_size).uniform_(-1.0, 1.0, generator=generator)
            self.embeddings = torch.nn.Embedding(vocab_size, hidden_size, _weight=table)
            self.projection = torch.nn.Linear(hidden_size, output_size)
            with torch.no_grad():
                bound = hidden_size**-0.5
                self.projection.weight.uniform_(-bound, bound, generator=generator)
                self.projection.bias.uniform_(-bound, bound, generator=generator)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor
                    ) -> torch.Tensor:
            tokens = self.embeddings(input_ids)
            mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
            summed = (tokens * mask).sum(dim=1)
            count = mask.sum(dim=1).clamp(min=1.0)
            return torch.tanh(self.projection(summed / count))

    model = BigEmbeddingModel(BIG_VOCAB_SIZE, BIG_HIDDEN_SIZE, BIG_OUTPUT_SIZE, BIG_SEED)
    return model.eval().requires_grad_(False)


def conv_onnx(path: Path, channels: tuple[int, int] = (16, 32), seed: int = 0) -> Path:
    """A small convolutional ONNX model (Conv 3x3 -> Relu -> Conv 3x3 -> global average
    pool -> ``features`` [batch, channels[1]]) with a dynamic batch and image size, written
    to ``path``: an image model for checks that must not lean on transformer fields."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    first, second = channels
    weights = [
        numpy_helper.from_array(rng.standard_normal((first, 3, 3, 3)).astype(np.float32)
                                / 5, "conv1.weight"),
        numpy_helper.from_array(rng.standard_normal((second, first, 3, 3)).astype(np.float32)
                                / 12, "conv2.weight"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "conv1.weight"], ["conv1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv1"], ["relu1"]),
        helper.make_node("Conv", ["relu1", "conv2.weight"], ["conv2"], pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["conv2"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["features"]),
    ]
    graph = helper.make_graph(
        nodes, "conv",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                       ["batch", 3, "height", "width"])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", second])],
        weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path
