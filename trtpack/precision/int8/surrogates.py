"""Surrogates: variants of a quantized model with some nodes back in high precision,
without a new ModelOpt conversion.

A node is taken back to high precision by wiring its inputs to the FP32 tensors again (the
activation ranges of max calibration do not depend on which nodes are quantized, so this is
the model ModelOpt builds with that node excluded). ``SurrogateBuilder`` builds one such
model; ``ToggledSurrogates`` is one ONNX Runtime session over the quantized model in which
each *node group*'s result is ``Where(flag, quantized node, FP32 node)``, the flags being
graph inputs, so a candidate is a set of flags and its evaluation one ``session.run``.
A group is the quantized nodes that read the same activation (or one node, per node).

onnx is imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from trtpack.precision.graph import model_shell, node_hint, prune
from trtpack.runtimes.onnxruntime import cpu_session, run_session

if TYPE_CHECKING:
    import onnx

    from trtpack.runtimes.onnxruntime import CpuSession


@dataclass
class NodeGroup:
    key: str  # the activation the group's nodes read
    nodes: list[str]
    hints: list[str]

    @property
    def label(self) -> str:
        return ", ".join(self.hints)


def node_groups(fp32: onnx.ModelProto, candidates: Iterable[str], per_node: bool = False
                ) -> list[NodeGroup]:
    """Candidate nodes grouped by the activation (first input) they read, in graph order;
    with ``per_node`` every node is its own group (e.g. a layer's V projection kept in
    FP32 while its Q and K, reading the same quantized activation, stay INT8)."""
    wanted = set(candidates)
    inits = {i.name for i in fp32.graph.initializer}
    groups: dict[str, NodeGroup] = {}
    for node in fp32.graph.node:
        if node.name in wanted:
            key = node.name if per_node else node.input[0]
            g = groups.setdefault(key, NodeGroup(key, [], []))
            g.nodes.append(node.name)
            g.hints.append(node_hint(node, inits))
    return list(groups.values())


class SurrogateBuilder:
    """Builds variants of a quantized model with some nodes back in high precision."""

    def __init__(self, quantized: onnx.ModelProto, fp32: onnx.ModelProto) -> None:
        self.quantized = quantized
        self.fp32_inputs = {n.name: list(n.input) for n in fp32.graph.node}
        self.fp32_inits = {i.name: i for i in fp32.graph.initializer}

    def build(self, high_precision: Iterable[str]) -> onnx.ModelProto:
        import onnx

        keep = set(high_precision)
        q = self.quantized
        model = model_shell(q)
        graph = model.graph
        graph.input.extend(q.graph.input)
        graph.output.extend(q.graph.output)
        nodes = []
        for node in q.graph.node:
            if node.name in keep and node.name in self.fp32_inputs:
                rewired = onnx.NodeProto()
                rewired.CopyFrom(node)
                del rewired.input[:]
                rewired.input.extend(self.fp32_inputs[node.name])
                nodes.append(rewired)
            else:
                nodes.append(node)
        nodes = prune(nodes, {o.name for o in q.graph.output})
        attach_initializers(graph, nodes, q, self.fp32_inits)
        return model


TOGGLE_INPUT_PREFIX = "trtpack_quantize_group_"


@dataclass(frozen=True)
class ToggledCandidate:
    """A candidate of ``ToggledSurrogates``: which groups stay quantized."""

    owner: ToggledSurrogates
    quantized: frozenset[int]

    def run(self, feeds: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        return self.owner.run(self.quantized, feeds)


class ToggledSurrogates:
    """Every surrogate of a quantized model in one ONNX Runtime session (see the module
    docstring); ``build`` has ``SurrogateBuilder.build``'s meaning."""

    def __init__(self, quantized: onnx.ModelProto, fp32: onnx.ModelProto,
                 groups: Sequence[NodeGroup], threads: int | None = None) -> None:
        import onnx
        from onnx import helper

        self.group_of = {n: k for k, g in enumerate(groups) for n in g.nodes}
        self.groups = list(groups)
        fp32_inputs = {n.name: list(n.input) for n in fp32.graph.node}
        fp32_inits = {i.name: i for i in fp32.graph.initializer}
        q = quantized
        model = model_shell(q)
        graph = model.graph
        graph.input.extend(q.graph.input)
        graph.output.extend(q.graph.output)
        for index in range(len(groups)):
            graph.input.append(helper.make_tensor_value_info(
                f"{TOGGLE_INPUT_PREFIX}{index}", onnx.TensorProto.BOOL, []))
        # Each candidate node runs twice: as quantized (its Q/DQ operands, which ONNX
        # Runtime fuses into its integer kernels, as in the served model) and on the FP32
        # operands, and Where(flag, quantized, fp32) picks the result. The weights stay
        # constant initializers (pre-packed once per session).
        nodes = []
        for node in q.graph.node:
            k = self.group_of.get(node.name)
            if k is not None and node.name in fp32_inputs:
                quantized_node = onnx.NodeProto()
                quantized_node.CopyFrom(node)
                high = onnx.NodeProto()
                high.CopyFrom(node)
                high.name = f"{node.name}_high_precision"
                del high.input[:]
                high.input.extend(fp32_inputs[node.name])
                del quantized_node.output[:]
                del high.output[:]
                for out in node.output:
                    quantized_node.output.append(f"{out}_quantized")
                    high.output.append(f"{out}_high_precision")
                nodes.extend([quantized_node, high])
                for out in node.output:
                    nodes.append(helper.make_node(
                        "Where", [f"{TOGGLE_INPUT_PREFIX}{k}", f"{out}_quantized",
                                  f"{out}_high_precision"], [out], name=f"{out}_toggle"))
            else:
                nodes.append(node)
        attach_initializers(graph, nodes, q, fp32_inits)
        self.session = cpu_session(model, threads)
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.input_names = {i.name for i in self.session.get_inputs()}

    def build(self, high_precision: Iterable[str]) -> ToggledCandidate:
        off = {self.group_of[n] for n in high_precision if n in self.group_of}
        return ToggledCandidate(self, frozenset(set(range(len(self.groups))) - off))

    def run(self, quantized: frozenset[int], feeds: Sequence[Mapping[str, np.ndarray]]
            ) -> list[dict[str, np.ndarray]]:
        flags = {f"{TOGGLE_INPUT_PREFIX}{k}": np.array(k in quantized)
                 for k in range(len(self.groups))}
        results = []
        for feed in feeds:
            values = self.session.run(self.output_names, {
                **{k: v for k, v in feed.items() if k in self.input_names}, **flags})
            results.append(dict(zip(self.output_names, values, strict=True)))
        return results


@dataclass(frozen=True)
class ModelCandidate:
    """A candidate that is a whole model, in its own ONNX Runtime session."""

    session: CpuSession

    def run(self, feeds: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        return run_session(self.session, feeds)


def attach_initializers(graph: onnx.GraphProto, nodes: list[onnx.NodeProto],
                        quantized: onnx.ModelProto, fp32_inits: dict[str, onnx.TensorProto]
                        ) -> None:
    """Add ``nodes`` to ``graph`` with the initializers they read: the quantized model's
    where it has them, else the FP32 model's (the weights of layers kept in FP32)."""
    used = {t for n in nodes for t in n.input}
    have = set()
    for init in quantized.graph.initializer:
        if init.name in used:
            graph.initializer.append(init)
            have.add(init.name)
    for name in sorted(used - have):
        if name in fp32_inits:
            graph.initializer.append(fp32_inits[name])
    graph.node.extend(nodes)
