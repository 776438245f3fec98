"""A PyTorch module's footprint without running it: built on the meta device and one forward
traced at the corner's shapes."""

from __future__ import annotations

from trtpack.pytorch.footprint import recipe_footprints
from trtpack.sources.resolve import resolve_model

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def corner(batch: int, sequence: int) -> dict[str, list[int]]:
    return {name: [batch, sequence] for name in INPUTS}


def test_tiny_bert_footprint_from_its_module() -> None:
    recipe = resolve_model("tiny-bert", None)
    found = recipe_footprints(recipe, [corner(2, 64), corner(2, 128), corner(4, 128)])
    eager, runtime = found["eager"], found["runtime"]
    cfg = recipe.config
    # the weights: every parameter of the module (embeddings + 2 layers), FP32
    assert 4 * cfg["vocab_size"] * cfg["hidden_size"] < eager[0].weights < 4 * 10**6
    assert {f.weights for f in (*eager, *runtime)} == {eager[0].weights}
    # at least the output [batch, sequence, hidden] and one [batch, sequence, intermediate]
    assert runtime[1].activations >= 4 * 2 * 128 * (cfg["hidden_size"] +
                                                    cfg["intermediate_size"])
    # unfused attention holds the [batch, heads, sequence, sequence] scores: it grows
    # faster than linearly with the sequence, and linearly with the batch
    assert runtime[1].activations > 2.5 * runtime[0].activations
    assert abs(runtime[2].activations / runtime[1].activations - 2) < 0.05
    assert runtime[1].activations >= 4 * 2 * cfg["num_attention_heads"] * 128 * 128
    assert all(r.activations >= e.activations for r, e in zip(runtime, eager, strict=True))


def test_a_module_that_returns_a_tensor() -> None:
    """A module whose forward returns a plain tensor (a tensor has ``.values()`` too, for
    sparse tensors: it must not be read as a dict of outputs)."""
    import torch

    from trtpack.pytorch.footprint import module_footprint

    with torch.device("meta"):
        module = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                     torch.nn.Linear(256, 8))
    found = module_footprint(module, {"input": torch.empty(4, 64, device="meta")})
    assert found.weights == 4 * (64 * 256 + 256 + 256 * 8 + 8)
    assert found.activations >= 4 * 4 * 256  # the hidden [4, 256] at least
