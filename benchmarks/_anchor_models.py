"""For cpu_anchor.py: the PyTorch model a trtpack build was made from, and the machine's FP32
ceiling (a measured GEMM rate and the model's MatMul FLOPs per corner)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

WEIGHT_CHECK_TOLERANCE = 1e-3
"""Largest |eager - the build's PyTorch reference| / max |reference| taken as the same weights."""


@dataclass
class AnchorModel:
    name: str  # the recipe name, also the folder under model_repository/
    weights: str  # "pretrained" or "random", as the build's export stage reports it
    torch_model: Any  # transformers model in eval mode
    tokenizer: Any
    folder: str  # a Hugging Face model folder with these weights, for the Optimum-like export
    corners: list[tuple[int, int]]  # (batch, sequence) of the build's profile, min/opt/max
    num_heads: int
    hidden: int
    intermediate: int
    layers: int


def served_model(build: Path, name: str) -> Path:
    """``model_repository/<name>/1/model.onnx`` of a trtpack build of recipe ``name``."""
    path = build / "model_repository" / name / "1" / "model.onnx"
    if not path.is_file():
        found = [p.parent.parent.name for p in build.glob("model_repository/*/1/model.onnx")]
        raise SystemExit(f"{build} has no served model of {name} (it has: {found})")
    return path


def load_anchor_model(model: str, fp32_build: Path, work: Path) -> AnchorModel:
    """The build's recipe (``recipe.yaml``) through trtpack's own loader, with the weights
    its export stage used: pretrained, or random from ``torch.manual_seed(0)`` (the seed
    every build uses), so eager PyTorch and the Optimum-like export run the same weights as
    the trtpack builds; checked against the build's own PyTorch outputs."""
    from trtpack.pytorch.models import load_model, source_directory
    from trtpack.sources.recipe_files import load_recipe_file

    recipe = load_recipe_file(fp32_build / "recipe.yaml")
    if recipe.name != model:
        raise SystemExit(f"--model {model} but {fp32_build} is a build of {recipe.name}")
    report = json.loads((fp32_build / "report.json").read_text())
    export = next(s for s in report["stages"] if s["name"] == "export")
    weights = export["metrics"]["weights"]
    loaded = load_model(recipe, random_weights=weights == "random", seed=0)
    directory = source_directory(recipe.source)
    if weights == "pretrained" and directory is not None:
        folder = str(directory)
    else:  # random weights: save them where the export can load them
        folder = str(work / "torch-model")
        loaded.module.save_pretrained(folder)
    reference = np.load(fp32_build / "artifacts" / "export" / "reference.npz")
    corners = [tuple(int(n) for n in reference[f"p0.{c}.input.input_ids"].shape)
               for c in ("min", "opt", "max")]
    config = loaded.module.config
    return AnchorModel(recipe.name, weights, loaded.module, loaded.tokenizer, folder,
                       [(b, s) for b, s in corners], config.num_attention_heads,
                       config.hidden_size, config.intermediate_size, config.num_hidden_layers)


def weight_check(anchor: AnchorModel, fp32_build: Path) -> dict[str, float]:
    """Eager PyTorch on the build's own reference inputs (every corner) against the outputs
    the build's PyTorch gave: the same weights give the same numbers."""
    import torch

    reference = np.load(fp32_build / "artifacts" / "export" / "reference.npz")
    worst = 0.0
    for corner in ("min", "opt", "max"):
        feed = {k.rsplit(".", 1)[1]: torch.from_numpy(reference[k]) for k in reference.files
                if k.startswith(f"p0.{corner}.input.")}
        expected = reference[f"p0.{corner}.output.last_hidden_state"]
        with torch.inference_mode():
            got = anchor.torch_model(**feed).last_hidden_state.numpy()
        worst = max(worst, float(np.abs(got - expected).max() / np.abs(expected).max()))
    if worst > WEIGHT_CHECK_TOLERANCE:
        raise SystemExit(f"eager PyTorch is not the model {fp32_build} was built from "
                         f"(relative difference {worst:.3g} > {WEIGHT_CHECK_TOLERANCE})")
    return {"max_relative_difference": worst, "tolerance": WEIGHT_CHECK_TOLERANCE}


def matmul_flops(anchor: AnchorModel, batch: int, seq: int) -> int:
    """FLOPs of the encoder's MatMuls at one corner, from the config: per token per layer
    2*(4*H*H + 2*H*I) (Q, K, V, output projections and the two FFN layers) plus attention's
    two batched MatMuls 2*2*S*H. Embeddings, pooler, softmax, LayerNorm, GELU not counted."""
    h, i = anchor.hidden, anchor.intermediate
    return batch * seq * anchor.layers * (2 * (4 * h * h + 2 * h * i) + 2 * 2 * seq * h)


FLOPS_SOURCE = ("config formula: tokens * layers * (2*(4*H*H + 2*H*I) + 2*2*S*H); "
                "embeddings, pooler, softmax, LayerNorm and GELU not counted")


def gemm_calls(anchor: AnchorModel, rows: int = 1024) -> tuple[dict[str, Callable[[], object]],
                                                                dict[str, int]]:
    """torch.mm FP32 of the model's two FFN shapes at ``rows`` tokens, and their FLOPs."""
    import torch

    h, i = anchor.hidden, anchor.intermediate
    generator = torch.Generator().manual_seed(0)
    calls: dict[str, Callable[[], object]] = {}
    flops: dict[str, int] = {}
    for m, k, n in ((rows, h, i), (rows, i, h)):
        a = torch.randn(m, k, generator=generator)
        b = torch.randn(k, n, generator=generator)
        name = f"[{m} x {k}] @ [{k} x {n}]"

        def multiply(a: Any = a, b: Any = b) -> object:
            return torch.mm(a, b)

        calls[name] = multiply
        flops[name] = 2 * m * k * n
    return calls, flops


def fp32_ceiling(anchor: AnchorModel, gemm: dict[str, dict[str, float]],
                 gemm_flops: dict[str, int], timings: dict[str, dict[str, Any]]
                 ) -> dict[str, Any]:
    """The lowest time any FP32 implementation could reach at each corner, at the best
    measured GEMM rate, beside half of PyTorch eager's p50 (what "2x eager" needs)."""
    rates = {name: round(gemm_flops[name] / (t["p50_ms"] / 1000) / 1e9, 1)
             for name, t in gemm.items()}
    rate = max(rates.values())
    corners = {}
    for batch, seq in anchor.corners:
        flops = matmul_flops(anchor, batch, seq)
        floor = flops / (rate * 1e9) * 1000
        half = timings[f"{batch}x{seq}"]["pytorch eager"]["p50_ms"] / 2
        corners[f"{batch}x{seq}"] = {
            "matmul_gflop": round(flops / 1e9, 4), "fp32_floor_ms": round(floor, 3),
            "half_eager_p50_ms": round(half, 3), "two_x_eager_possible": floor <= half}
    return {"gemm": {name: {**gemm[name], "gflops": rates[name]} for name in gemm},
            "rate_gflops": rate, "flops_source": FLOPS_SOURCE,
            "note": "measured torch.mm FP32 rate with the same threads (the better of the two "
                    "shapes, median of rounds), not a datasheet peak; at small corners no "
                    "kernel reaches it, so the floor is a lower bound",
            "corners": corners}


def ceiling_markdown(ceiling: dict[str, Any]) -> str:
    lines = [f"FP32 ceiling: {ceiling['rate_gflops']:.0f} GFLOP/s measured (torch.mm, "
             + ", ".join(f"{n} {g['gflops']:.0f}" for n, g in ceiling["gemm"].items())
             + "; a measured rate, not a datasheet peak). MatMul FLOPs from the "
             + ceiling["flops_source"] + ".", "",
             "| corner | MatMul GFLOP | FP32 floor ms | eager p50 / 2 ms | 2x eager possible |",
             "|---|---:|---:|---:|---|"]
    for corner, c in ceiling["corners"].items():
        lines.append(f"| {corner} | {c['matmul_gflop']:.3f} | {c['fp32_floor_ms']:.2f} | "
                     f"{c['half_eager_p50_ms']:.2f} | "
                     f"{'yes' if c['two_x_eager_possible'] else 'no'} |")
    return "\n".join(lines)
