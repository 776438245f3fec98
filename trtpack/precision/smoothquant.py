"""SmoothQuant-style activation smoothing of an FP32 ONNX model before INT8 quantization.

A MatMul ``Y = X @ W`` with a constant weight ``W`` [in, out] equals ``(X / s) @ (s * W)``
for any positive per-input-channel ``s`` [in]. BERT's activations have a few channels with
large values (the LayerNorm outputs' outliers): one per-tensor INT8 scale stretched by them
rounds every other channel coarsely. With ``s_j = max|X_j|^a / max|W_j|^(1-a)`` the
activation's channels are evened out and the difficulty moves into the weight, which
ModelOpt quantizes per output channel (Xiao et al., SmoothQuant, 2023).

trtpack inserts one ``Mul(X, 1/s)`` per smoothed activation (shared by every MatMul that
reads it with a constant weight, e.g. one layer's Q/K/V) and multiplies those weights' rows
by ``s``; other readers of ``X`` (a residual Add) keep the original. The model is the same
function in FP32 (up to rounding); ``max|X_j|`` comes from one ONNX Runtime run of the FP32
model on the calibration feeds. onnx and onnxruntime are imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

DEFAULT_ALPHA = 0.5
SMOOTH_PREFIX = "trtpack_smooth"


@dataclass
class SmoothTarget:
    """One activation and the MatMul nodes reading it with a constant 2-D weight."""

    tensor: str
    matmuls: list[onnx.NodeProto]
    producer: str  # op type of the node making the activation ("" for a graph input)


def smoothing_targets(model: onnx.ModelProto, producer_ops: Sequence[str] | None = None
                      ) -> list[SmoothTarget]:
    """Activations read by MatMul nodes whose second input is a constant [in, out] weight
    (each weight read by that MatMul only); ``producer_ops`` limits them to activations
    made by those op types (e.g. ``LayerNormalization``)."""
    inits = {i.name: i for i in model.graph.initializer}
    readers: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    producers = {o: n.op_type for n in model.graph.node for o in n.output}
    found: dict[str, SmoothTarget] = {}
    for node in model.graph.node:
        if node.op_type != "MatMul" or len(node.input) != 2:
            continue
        x, w = node.input
        weight = inits.get(w)
        if x in inits or weight is None or len(weight.dims) != 2 or readers.get(w) != 1:
            continue
        producer = producers.get(x, "")
        if producer_ops is not None and producer not in producer_ops:
            continue
        found.setdefault(x, SmoothTarget(x, [], producer)).matmuls.append(node)
    return list(found.values())


def channel_maxima(model: onnx.ModelProto, tensors: Sequence[str],
                   feeds: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """max |x| per last-axis channel of each tensor over ``feeds`` (one ORT session)."""
    from trtpack.runtimes.onnxruntime import cpu_session, with_outputs

    session = cpu_session(with_outputs(model, tensors))
    inputs = {i.name for i in session.get_inputs()}
    maxima: dict[str, np.ndarray] = {}
    for feed in feeds:
        outs = session.run(list(tensors), {k: v for k, v in feed.items() if k in inputs})
        for name, value in zip(tensors, outs, strict=True):
            a = np.abs(np.asarray(value, dtype=np.float32))
            m = a.reshape(-1, a.shape[-1]).max(axis=0)
            maxima[name] = m if name not in maxima else np.maximum(maxima[name], m)
    return maxima


def smoothing_scales(x_max: np.ndarray, weights: Sequence[np.ndarray], alpha: float
                     ) -> np.ndarray:
    """s_j = max|X_j|^alpha / max|W_j|^(1-alpha), W_j the j-th row over every weight;
    channels with no signal keep s = 1."""
    w_max = np.max(np.stack([np.abs(w).max(axis=1) for w in weights]), axis=0)
    x = np.asarray(x_max, dtype=np.float64)
    w = w_max.astype(np.float64)
    ok = (x > 0) & (w > 0)
    s = np.ones_like(x)
    s[ok] = x[ok] ** alpha / w[ok] ** (1.0 - alpha)
    return np.clip(s, 1e-5, 1e5).astype(np.float32)


def smooth_model(model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]],
                 alpha: float = DEFAULT_ALPHA, producer_ops: Sequence[str] | None = None
                 ) -> list[str]:
    """Smooth ``model`` in place; returns the activations smoothed. Each gets a ``Mul``
    named ``trtpack_smooth/<tensor>`` feeding its MatMuls; their weights' rows are scaled."""
    from onnx import helper, numpy_helper

    targets = smoothing_targets(model, producer_ops)
    if not targets:
        return []
    maxima = channel_maxima(model, [t.tensor for t in targets], feeds)
    inits = {i.name: i for i in model.graph.initializer}
    position = {id(n): i for i, n in enumerate(model.graph.node)}
    inserts: list[tuple[int, onnx.NodeProto]] = []
    done: list[str] = []
    for t in targets:
        weights = [numpy_helper.to_array(inits[m.input[1]]) for m in t.matmuls]
        if any(w.shape[0] != maxima[t.tensor].shape[0] for w in weights):
            continue
        s = smoothing_scales(maxima[t.tensor], weights, alpha)
        for m, w in zip(t.matmuls, weights, strict=True):
            init = inits[m.input[1]]
            init.CopyFrom(numpy_helper.from_array((w * s[:, None]).astype(w.dtype),
                                                  init.name))
        scale_name = f"{SMOOTH_PREFIX}/{t.tensor}/inverse_scale"
        out_name = f"{SMOOTH_PREFIX}/{t.tensor}"
        model.graph.initializer.append(numpy_helper.from_array(
            (1.0 / s).astype(np.float32), scale_name))
        mul = helper.make_node("Mul", [t.tensor, scale_name], [out_name],
                               name=f"{SMOOTH_PREFIX}/{t.tensor}")
        for m in t.matmuls:
            m.input[0] = out_name
        # before the first MatMul reading it (the graph stays topologically sorted)
        inserts.append((min(position[id(m)] for m in t.matmuls), mul))
        done.append(t.tensor)
    for index, node in sorted(inserts, key=lambda p: p[0], reverse=True):
        model.graph.node.insert(index, node)
    return done


def smooth_source(source: Path, feeds: Sequence[Mapping[str, np.ndarray]], alpha: float,
                  producer_ops: Sequence[str] | None, folder: Path
                  ) -> tuple[onnx.ModelProto, Path, list[str]]:
    """The FP32 model at ``source`` smoothed (``smooth_model``) and saved as
    ``<folder>/model.onnx``: (the smoothed model, its path, the activations smoothed)."""
    import onnx

    from trtpack.onnx_tools.files import save_model

    model = onnx.load(str(source))
    smoothed = smooth_model(model, feeds, alpha, producer_ops)
    folder.mkdir()
    save_model(model, folder / "model.onnx")
    return model, folder / "model.onnx", smoothed
