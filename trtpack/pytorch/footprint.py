"""A PyTorch model's footprint at one input shape, without running it: the recipe's module is
built on PyTorch's meta device (no weights allocated, nothing computed) and one forward pass at
that shape is traced operation by operation; its activations are then counted by the one
definition, ``resources.activation_bytes``."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from trtpack.onnx_tools.footprint import Footprint
from trtpack.resources import Op, activation_bytes
from trtpack.sources.recipe import Recipe

if TYPE_CHECKING:
    import torch
    from torch._ops import OpOverload

Shape = Sequence[int]


def meta_module(recipe: Recipe) -> torch.nn.Module:
    """The recipe's module as ``load_model`` builds it (head, pooling), on the meta device:
    its parameters have shapes and dtypes but no memory. A factory's module is built, then
    moved to the meta device."""
    import torch

    from trtpack.pytorch.models import load_model, model_config, model_module

    if recipe.source.torch_kind is not None:  # a factory, a .pt2 or a TorchScript file
        return load_model(recipe, random_weights=True).module.to("meta")
    config = model_config(recipe, from_hub=True)
    with torch.device("meta"):
        return model_module(recipe, config)


def _storage(tensor: torch.Tensor) -> int:
    return int(tensor.untyped_storage()._cdata)


def module_footprint(module: torch.nn.Module, inputs: Mapping[str, torch.Tensor],
                     positional: bool = False) -> Footprint:
    """Trace one forward of a meta-device ``module`` on meta ``inputs`` (name -> tensor) and
    count its weights and activations. A value the model reads back into Python (``.item()``,
    ``bool(tensor)``: data on the meta device has none) reads as 1 / True: the path of a
    batch without padding."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    scalar_ops = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default}
    ops: list[Op] = []
    sizes: dict[int, int] = {}
    held: list[torch.Tensor] = []  # every tensor stays referenced: a storage's key is never reused

    class Trace(TorchDispatchMode):
        def __torch_dispatch__(self, func: OpOverload, types: Sequence[type],
                               args: Sequence[object] = (),
                               kwargs: Mapping[str, object] | None = None) -> object:
            if func in scalar_ops:
                tensor = args[0]
                assert isinstance(tensor, torch.Tensor)  # both ops take one tensor
                return True if tensor.dtype == torch.bool else \
                    1.0 if tensor.is_floating_point() else 1
            out = func(*args, **(kwargs or {}))
            reads = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            writes = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            held.extend(writes)
            for t in writes:
                sizes.setdefault(_storage(t), t.untyped_storage().nbytes())
            ops.append(Op(tuple(_storage(t) for t in reads), tuple(_storage(t) for t in writes)))
            return out

    weights = {_storage(p): p.untyped_storage().nbytes()
               for p in (*module.parameters(), *module.buffers())}
    for value in inputs.values():
        weights.pop(_storage(value), None)
    with torch.inference_mode(), Trace():
        out = module(*inputs.values()) if positional else module(**inputs)
    for key in weights:  # a weight an op wrote in place is still a weight
        sizes.pop(key, None)
    # a ModelOutput or a dict (a tensor has a .values() too: of a sparse tensor)
    returned = list(out.values()) if isinstance(out, Mapping) else out
    outputs = [_storage(t) for t in tree_flatten(returned)[0] if isinstance(t, torch.Tensor)]
    input_keys = {_storage(v) for v in inputs.values()}
    for key in input_keys:
        sizes.pop(key, None)
    return Footprint(sum(weights.values()), activation_bytes(ops, sizes, outputs))


def unfuse_attention(module: torch.nn.Module) -> bool:
    """Switch a transformers model inside ``module`` to its eager attention (score, softmax,
    context as separate operations, as the exported ONNX graph runs them); False when there
    is none to switch."""
    for sub in module.modules():
        switch = getattr(sub, "set_attn_implementation", None)  # a transformers model's
        if switch is not None and hasattr(sub, "config"):
            try:
                switch("eager")
            except (ValueError, TypeError, AttributeError):
                return False
            return True
    return False


def recipe_footprints(recipe: Recipe, corners: Sequence[Mapping[str, Shape]]
                      ) -> dict[str, list[Footprint]]:
    """The recipe's model's footprint at each of ``corners`` (input name -> shape), from one
    meta-device module, run two ways: ``eager`` as PyTorch runs it (fused attention), and
    ``runtime`` with attention as separate operations, as the exported ONNX graph runs it."""
    import numpy as np
    import torch

    module = meta_module(recipe)
    with contextlib.suppress(NotImplementedError):  # an ExportedProgram's module: fixed mode
        module.eval()
    dtypes = {spec.name: torch.from_numpy(np.zeros(0, dtype=spec.dtype)).dtype
              for spec in recipe.input_specs()}
    inputs = [{name: torch.ones(tuple(shape), dtype=dtypes[name], device="meta")
               for name, shape in shapes.items()} for shapes in corners]
    positional = recipe.source.exported_program is not None  # its module takes no keywords
    eager = [module_footprint(module, feeds, positional) for feeds in inputs]
    runtime = [module_footprint(module, feeds, positional) for feeds in inputs] \
        if unfuse_attention(module) else eager
    return {"eager": eager, "runtime": runtime}
