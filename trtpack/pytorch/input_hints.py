"""What an undescribed input of a PyTorch module probably is, for a hint: read from the
module's first layer that says what it takes."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def first_layer_input(module: torch.nn.Module) -> str:
    """A plausible ``--input`` type for a module's input, from its first layer that says
    what it takes: token ids for an embedding, ``[batch,C,H,W]`` for a 2-D convolution,
    ``[batch,features]`` for a linear layer."""
    import torch

    for layer in module.modules():
        if isinstance(layer, torch.nn.Embedding):
            return "int64[batch,sequence]"
        if isinstance(layer, torch.nn.modules.conv._ConvNd):
            spatial = {1: "512", 2: "224,224", 3: "16,112,112"}
            return f"float32[batch,{layer.in_channels},{spatial[len(layer.kernel_size)]}]"
        if isinstance(layer, torch.nn.RNNBase):
            return f"float32[batch,time,{layer.input_size}]" if layer.batch_first else \
                f"float32[time,batch,{layer.input_size}]"
        if isinstance(layer, torch.nn.Linear):
            return f"float32[batch,{layer.in_features}]"
    return "float32[batch,16]"
