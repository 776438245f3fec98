"""The CPU-shaped graph: ONNX Runtime's transformer optimizer (SkipLayerNormalization,
BiasGelu, ... where its patterns match) and an Attention fusion for the attention that the
dynamo exporter writes (scaled Q and K, an additive mask, Softmax, NaN guard), which ONNX
Runtime's own fusion does not recognize. The TensorRT path never sees this graph: TensorRT
wants the plain operators.

Every fusion needs an exact subgraph match, so the counts of fused operators are returned
for the report: a zero shows a silent non-match. The result is checked per sample against
the FP32 outputs by the stage, like every variant."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from trtpack.precision.cpu.kernels import MS_DOMAIN, split_skip_layer_norms

if TYPE_CHECKING:
    import numpy as np
    import onnx

# ONNX Runtime's contrib operators that mark a fused transformer graph (report counts)
FUSED_OPERATORS = ("Attention", "MultiHeadAttention", "SkipLayerNormalization",
                   "EmbedLayerNormalization", "BiasGelu", "FastGelu", "Gelu",
                   "LayerNormalization", "SkipSimplifiedLayerNormalization",
                   "SimplifiedLayerNormalization", "RotaryEmbedding", "GroupQueryAttention")
# The optimizer's model types, by the Hugging Face config's model_type
OPTIMIZER_MODEL_TYPES = {"bert": "bert", "roberta": "bert", "distilbert": "bert",
                         "xlm-roberta": "bert", "electra": "bert", "mpnet": "bert",
                         "albert": "bert", "deberta": "bert", "gpt2": "gpt2", "vit": "vit"}
# Added to the scores of masked keys. ONNX Runtime's default (-10000) puts exp() below the
# float32 normal range, and its CPU softmax then works on denormals: padded batches ran the
# attention 1.7x slower (benchmarks/README.md). At -60 a masked key's weight is e^-60 of the
# row's largest (nothing a float32 sum keeps) while exp() stays normal for score gaps < 27.
MASK_FILTER_VALUE = -60.0
# ops a Q, K or V path may pass through between its projection and the score MatMul
_PATH_OPS = ("Transpose", "Reshape", "Mul", "Div")


@dataclass(frozen=True)
class CpuGraph:
    """The CPU-shaped model and what was fused in it."""

    model: onnx.ModelProto
    model_type: str | None  # the optimizer's model type (None: not a transformer it knows)
    fused: dict[str, int]  # fused operator -> count (zeros kept: a non-match shows)
    # each fused Attention node -> the names of the Q, K, V MatMuls it replaced
    attention_sources: dict[str, list[str]] = field(default_factory=dict)
    # SkipLayerNormalization nodes written back as Sum + LayerNormalization (faster on CPU)
    skip_layer_norms_split: int = 0


def optimizer_model_type(config_model_type: str | None) -> str | None:
    return OPTIMIZER_MODEL_TYPES.get((config_model_type or "").lower())


def fused_counts(model: onnx.ModelProto) -> dict[str, int]:
    ops = [n.op_type for n in model.graph.node]
    return {op: ops.count(op) for op in FUSED_OPERATORS}


class GraphShape(TypedDict):
    """What the fusion is told of the model (``cpu_graph``'s keywords): its config's model
    type, attention heads and hidden size (None: read from the graph where it can), and the
    graph input holding the 0/1 attention mask."""

    config_model_type: str | None
    num_heads: int | None
    hidden_size: int | None
    mask_input: str | None


def cpu_graph(source: Path, *, config_model_type: str | None, num_heads: int | None,
              hidden_size: int | None, mask_input: str | None,
              load_weights: bool = True) -> CpuGraph:
    """``source`` (an FP32 model file; its sidecar must not be hard-linked: onnx refuses it)
    fused for ONNX Runtime on the CPU. ``num_heads``/``hidden_size`` from the model's config
    (None: the optimizer and the attention fusion read them from the graph, where they can);
    ``mask_input``: the graph input holding the 0/1 attention mask.

    The fusions run on the graph with its weights left in ``source``'s sidecar (ONNX
    Runtime's optimizer copies the model several times over, in its shape inference: on the
    loaded weights that was 6x the weights); the few it reads (the packed attention
    projections) are read from the file. ``load_weights=False``: the model returned still
    refers to that sidecar for its weights (save it with ``files.save_model(...,
    weights_dir=source.parent)``), else its weights are loaded."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    model = onnx.load(str(source), load_external_data=False)
    model_type = optimizer_model_type(config_model_type)
    if model_type is None:
        found = CpuGraph(model, None, {})
    else:
        from onnxruntime.transformers.fusion_options import FusionOptions
        from onnxruntime.transformers.optimizer import optimize_model

        # the optimizer reads a weight's values by onnx's loader relative to the working
        # folder (it is given no base folder): run it in the model's (this stage's process)
        with _working_folder(source.parent):
            model = optimize_model(
                model, model_type=model_type, num_heads=num_heads or 0,
                hidden_size=hidden_size or 0, optimization_options=FusionOptions(model_type),
                opt_level=0, use_gpu=False, only_onnxruntime=False).model
            sources = fuse_dynamo_attention(model, num_heads, mask_input) if num_heads else {}
        fused = fused_counts(model)  # what matched, before the kernel choice below
        add_missing_opset_imports(model)
        found = CpuGraph(model, model_type, fused, sources, split_skip_layer_norms(model))
    if load_weights:
        load_external_data_for_model(found.model, str(source.parent))
    return found


@contextmanager
def _working_folder(folder: Path) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def add_missing_opset_imports(model: onnx.ModelProto) -> list[str]:
    """Declare every operator domain the graph's nodes use (version 1 for a contrib domain):
    ONNX Runtime's optimizer writes ``com.microsoft`` Gelu into a ViT graph without importing
    the domain, which ONNX Runtime tolerates and onnx's shape inference (the INT8
    quantizer's first step) refuses. Returns the domains added."""
    from onnx import helper

    declared = {o.domain for o in model.opset_import}
    missing = sorted({n.domain for n in model.graph.node if n.domain not in declared}
                     - {"", "ai.onnx"})
    model.opset_import.extend(helper.make_opsetid(domain, 1) for domain in missing)
    return missing


def fuse_dynamo_attention(model: onnx.ModelProto, num_heads: int, mask_input: str | None
                          ) -> dict[str, list[str]]:
    """Replace each ``softmax(scale_q*Q @ scale_k*K^T + mask) @ V`` (Q, K, V biased
    projections of one input, through Transpose/Reshape) by ONNX Runtime's ``Attention``
    with the three projections packed; returns each new node's Q, K, V MatMul names. The
    mask becomes the 0/1 ``mask_input`` (the additive mask it was built from is then unused
    and pruned)."""
    import numpy as np
    from onnx import helper, numpy_helper

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)

    def constant(name: str) -> np.ndarray | None:
        if name in inits:
            return numpy_helper.to_array(inits[name])
        node = producer.get(name)
        if node is not None and node.op_type == "Constant":
            return numpy_helper.to_array(node.attribute[0].t)
        return None

    def projection(name: str) -> tuple[onnx.NodeProto, str, str | None, float] | None:
        """(MatMul node, weight, bias, scale) feeding ``name`` through the path ops (bias
        None: no bias Add, e.g. a zero bias the simplifier removed)."""
        scale = 1.0
        while True:
            node = producer.get(name)
            if node is None:
                return None
            if node.op_type == "MatMul":
                return (node, node.input[1], None, scale) if node.input[1] in inits else None
            if node.op_type == "Add":
                matmul = [producer.get(i) for i in node.input]
                bias = [i for i in node.input if i in inits and len(inits[i].dims) == 1]
                mm = next((m for m in matmul if m is not None and m.op_type == "MatMul"), None)
                if mm is None or not bias or mm.input[1] not in inits:
                    return None
                return mm, mm.input[1], bias[0], scale
            if node.op_type not in _PATH_OPS:
                return None
            if node.op_type in ("Mul", "Div"):
                values = [(i, constant(i)) for i in node.input]
                found = [(i, v) for i, v in values if v is not None and v.size == 1]
                if len(found) != 1:
                    return None
                factor = float(found[0][1].reshape(()))
                scale = scale * factor if node.op_type == "Mul" else scale / factor
                name = next(i for i in node.input if i != found[0][0])
            else:
                name = node.input[0]

    mask_index: str | None = None
    fused: dict[str, list[str]] = {}
    removed: list[onnx.NodeProto] = []
    for softmax in [n for n in graph.node if n.op_type == "Softmax"]:
        add = producer.get(softmax.input[0])
        if add is None or add.op_type != "Add":
            continue
        scores = next((producer[i] for i in add.input
                       if i in producer and producer[i].op_type == "MatMul"), None)
        if scores is None:
            continue
        probs = softmax.output[0]
        # the exporter's guard against fully masked rows: Where(IsNaN(p), 0, p)
        after = consumers.get(probs, [])
        where = next((n for n in after if n.op_type == "Where" and n.input[2] == probs), None)
        if where is not None:
            probs = where.output[0]
        context = next((n for n in consumers.get(probs, []) if n.op_type == "MatMul"), None)
        if context is None or context.input[0] != probs:
            continue
        parts = [projection(scores.input[0]), projection(scores.input[1]),
                 projection(context.input[1])]
        if any(p is None for p in parts):
            continue
        (q_mm, q_w, q_b, q_s), (k_mm, k_w, k_b, k_s), (v_mm, v_w, v_b, _) = parts  # type: ignore[misc]
        if not q_mm.input[0] == k_mm.input[0] == v_mm.input[0]:
            continue
        # the context's Transpose(0,2,1,3) and Reshape back to (batch, sequence, hidden)
        transpose = _only(consumers.get(context.output[0], []), "Transpose")
        reshape = _only(consumers.get(transpose.output[0], []) if transpose else [], "Reshape")
        if reshape is None:
            continue
        found = [constant(w) for w in (q_w, k_w, v_w)]
        weights: list[np.ndarray] = [w for w in found if w is not None and w.ndim == 2]
        if len(weights) != 3:
            continue
        weight: np.ndarray = np.concatenate(weights, axis=1)
        bias = np.concatenate([
            constant(b) if b is not None else np.zeros(w.shape[1], w.dtype)
            for b, w in zip((q_b, k_b, v_b), weights, strict=True)])
        prefix = f"{q_mm.name}_attention"
        graph.initializer.extend([numpy_helper.from_array(weight, f"{prefix}.qkv_weight"),
                                  numpy_helper.from_array(bias, f"{prefix}.qkv_bias")])
        inputs = [q_mm.input[0], f"{prefix}.qkv_weight", f"{prefix}.qkv_bias"]
        if mask_input is not None:
            if mask_index is None:
                mask_index = f"{mask_input}_int32"
                graph.node.append(helper.make_node("Cast", [mask_input], [mask_index],
                                                   name=f"{mask_input}_to_int32", to=6))
            inputs.append(mask_index)
        graph.node.append(helper.make_node(
            "Attention", inputs, [reshape.output[0]], name=prefix, domain=MS_DOMAIN,
            num_heads=num_heads, scale=q_s * k_s, mask_filter_value=MASK_FILTER_VALUE))
        removed.append(reshape)
        fused[prefix] = [q_mm.name, k_mm.name, v_mm.name]
    for node in removed:
        graph.node.remove(node)
    if fused:
        if not any(o.domain == MS_DOMAIN for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
        prune(model)
        _topological_sort(model)
    return fused


def _only(nodes: Iterable[onnx.NodeProto], op_type: str) -> onnx.NodeProto | None:
    found = list(nodes)
    return found[0] if len(found) == 1 and found[0].op_type == op_type else None


def prune(model: onnx.ModelProto) -> None:
    """Remove the nodes and initializers no graph output depends on."""
    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    needed: set[str] = set()
    keep: set[int] = set()
    stack = [o.name for o in graph.output]
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        needed.add(name)
        node = producer.get(name)
        if node is not None and id(node) not in keep:
            keep.add(id(node))
            stack.extend(i for i in node.input if i)
    for node in [n for n in graph.node if id(n) not in keep]:
        graph.node.remove(node)
    for init in [i for i in graph.initializer if i.name not in needed]:
        graph.initializer.remove(init)


def _topological_sort(model: onnx.ModelProto) -> None:
    graph = model.graph
    available = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending = list(graph.node)
    ordered: list[onnx.NodeProto] = []
    while pending:
        ready = [n for n in pending if all(i in available for i in n.input)]
        if not ready:
            raise ValueError("the fused graph has a cycle")
        for node in ready:
            available.update(node.output)
        ordered.extend(ready)
        taken = {id(n) for n in ready}
        pending = [n for n in pending if id(n) not in taken]
    copies = [type(n)() for n in ordered]
    for copy, node in zip(copies, ordered, strict=True):
        copy.CopyFrom(node)
    del graph.node[:]
    graph.node.extend(copies)
