"""Finding the nodes to keep in high precision when a precision variant fails its gate.

INT8: which MatMul/Gemm/Conv nodes may stay quantized is measured, per *node group*, on
the model and its data (on MiniLM, keeping whole op types such as Softmax, LayerNorm or Add
in FP32 did not help, and which MatMuls hurt most differed by layer). A group is the set of
quantized nodes that read the same activation (e.g. the Q, K and V projections of one
layer), since they share one Q/DQ pair on it. The search works on *surrogates*: the model
quantized once with every candidate node quantized, from which a node is taken back to high
precision by wiring its inputs to the FP32 tensors again (the activation ranges of max
calibration do not depend on which nodes are quantized, so this is the model ModelOpt
builds with that node excluded). Evaluating a surrogate costs one ONNX Runtime run instead
of a ModelOpt conversion. During the search the surrogates are not even rebuilt:
``ToggledSurrogates`` is one ONNX Runtime session over the quantized model in which each
group's result is ``Where(flag, quantized node, FP32 node)``, the flags being graph
inputs, so a candidate is a set of flags and its evaluation one ``session.run`` (each
candidate node computed both ways, the Where picking one; the chosen model is built by
``SurrogateBuilder`` and verified as it is served).

  1. sensitivity: quantize one group alone, measure the damage (1 - worst cosine);
  2. rank the groups from least to most damaging and find, by bisection, the longest
     prefix whose combined model passes the gate with a margin;
  3. greedy: try each remaining group on top; keep it if the model still passes.

FP16: nodes are ranked by how much relative error each adds on top of its inputs'
(comparing every intermediate tensor of the FP16 model with the FP32 one) and the worst
are kept in FP32.

Heavy packages (onnx, onnxruntime) are imported inside the functions.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trtpack.cases import Case
from trtpack.recipe import Recipe, Tolerance, VerifySettings
from trtpack.runtimes.onnxruntime import cpu_session, run_session
from trtpack.verification import TOP1_METRICS, task_metric

if TYPE_CHECKING:
    import onnx

COMPUTE_OP_TYPES = ("MatMul", "Gemm", "Conv")
# Ops that carry a dequantized tensor to a MatMul input unchanged in value (K^T, casts).
_PASS_THROUGH = {"Cast", "Transpose", "Reshape", "Squeeze", "Unsqueeze", "Identity"}
# Ops that only move or select values: FP16 cannot add error in them.
_DATA_MOVEMENT = _PASS_THROUGH | {"Shape", "Constant", "Concat", "Slice", "Expand", "Flatten",
                                  "Where", "Range"}


# ----------------------------------------------------------------------------- inspection


def producers(model: onnx.ModelProto) -> dict[str, Any]:
    return {out: node for node in model.graph.node for out in node.output}


def _from_dequantize(tensor: str, produced_by: Mapping[str, Any]) -> bool:
    seen = 0
    node = produced_by.get(tensor)
    while node is not None and node.op_type in _PASS_THROUGH and seen < 8:
        node = produced_by.get(node.input[0])
        seen += 1
    return node is not None and node.op_type == "DequantizeLinear"


def int8_quantized_nodes(model: onnx.ModelProto) -> set[str]:
    """MatMul/Gemm/Conv nodes whose two operands both come from DequantizeLinear."""
    produced_by = producers(model)
    return {
        n.name for n in model.graph.node
        if n.op_type in COMPUTE_OP_TYPES and len(n.input) >= 2
        and all(_from_dequantize(t, produced_by) for t in n.input[:2])
    }


def dedicate_qdq(model: onnx.ModelProto, op_types: Sequence[str]) -> list[str]:
    """Keep Q/DQ only where a quantized node reads it; returns the nodes rewired.

    ONNX Runtime's quantizer (which ModelOpt drives) puts one Q/DQ pair on a tensor and
    makes *every* consumer read the dequantized copy: a residual Add reading the same
    LayerNorm output as a quantized MatMul gets quantized too, and so does a MatMul that was
    excluded. Consumers that are not quantized nodes are wired back to the original tensor
    (edits ``model`` in place; Q/DQ nodes left unused are removed).
    """
    quantized = int8_quantized_nodes(model)
    produced_by = producers(model)
    kept_types = set(op_types) | _PASS_THROUGH | {"QuantizeLinear", "DequantizeLinear"}
    rewired: list[str] = []
    for node in model.graph.node:
        if node.name in quantized:
            continue
        if node.op_type in kept_types and node.op_type not in COMPUTE_OP_TYPES:
            continue
        for i, tensor in enumerate(node.input):
            dq = produced_by.get(tensor)
            if dq is None or dq.op_type != "DequantizeLinear":
                continue
            q = produced_by.get(dq.input[0])
            if q is None or q.op_type != "QuantizeLinear":
                continue
            node.input[i] = q.input[0]
            if not rewired or rewired[-1] != node.name:
                rewired.append(node.name)
    if rewired:
        outputs = {o.name for o in model.graph.output}
        nodes = _prune(list(model.graph.node), outputs)
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        used = {t for n in nodes for t in n.input}
        unused = [i for i in model.graph.initializer if i.name not in used]
        for init in unused:
            model.graph.initializer.remove(init)
    return rewired


def fp16_nodes(model: onnx.ModelProto) -> set[str]:
    """MatMul/Gemm/Conv nodes that compute in float16 (their first operand is float16)."""
    import onnx

    types = tensor_types(model)
    return {n.name for n in model.graph.node if n.op_type in COMPUTE_OP_TYPES
            and types.get(n.input[0]) == onnx.TensorProto.FLOAT16}


def tensor_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor ONNX shape inference can type (weights not needed)."""
    import onnx

    light = model_shell(model)
    g = light.graph
    g.node.extend(model.graph.node)
    g.input.extend(model.graph.input)
    g.output.extend(model.graph.output)
    g.value_info.extend(model.graph.value_info)
    for init in model.graph.initializer:  # metadata only: inference needs no values
        g.initializer.append(onnx.TensorProto(name=init.name, data_type=init.data_type,
                                              dims=init.dims))
    # best effort: where inference fails, the Cast and initializer types below remain
    with contextlib.suppress(Exception):
        light = onnx.shape_inference.infer_shapes(light, strict_mode=False)
    types: dict[str, int] = {}
    for vi in [*light.graph.input, *light.graph.value_info, *light.graph.output]:
        if vi.type.HasField("tensor_type"):
            types[vi.name] = vi.type.tensor_type.elem_type
    for init in model.graph.initializer:
        types[init.name] = init.data_type
    for node in model.graph.node:
        if node.op_type == "Cast":
            to = next((a.i for a in node.attribute if a.name == "to"), None)
            if to is not None:
                types[node.output[0]] = to
    return types


def model_shell(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of a model's metadata and opsets with an empty graph (name kept)."""
    import onnx

    shell = onnx.ModelProto(
        ir_version=model.ir_version, producer_name=model.producer_name,
        producer_version=model.producer_version, domain=model.domain,
        model_version=model.model_version, doc_string=model.doc_string)
    shell.opset_import.extend(model.opset_import)
    shell.metadata_props.extend(model.metadata_props)
    shell.functions.extend(model.functions)
    shell.graph.name = model.graph.name
    return shell


@dataclass
class LowPrecisionStats:
    """How much of a model's MatMul/Gemm/Conv work runs in the low precision."""

    total: int
    low: int
    matmul_gemm_total: int
    matmul_gemm_low: int
    by_op_type: dict[str, list[int]] = field(default_factory=dict)  # op -> [low, total]

    @property
    def share(self) -> float:
        return self.low / self.total if self.total else 0.0

    @property
    def matmul_gemm_share(self) -> float:
        return self.matmul_gemm_low / self.matmul_gemm_total if self.matmul_gemm_total else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "compute_nodes": self.total, "low_precision_nodes": self.low,
            "share": round(self.share, 4),
            "matmul_gemm_nodes": self.matmul_gemm_total,
            "matmul_gemm_low_precision": self.matmul_gemm_low,
            "matmul_gemm_share": round(self.matmul_gemm_share, 4),
            "by_op_type": self.by_op_type,
        }


def low_precision_stats(model: onnx.ModelProto, precision: str) -> LowPrecisionStats:
    """MatMul and Gemm are counted together: onnxsim fuses MatMul+Add into Gemm."""
    low_names = int8_quantized_nodes(model) if precision == "int8" else fp16_nodes(model)
    by_op: dict[str, list[int]] = {}
    for n in model.graph.node:
        if n.op_type in COMPUTE_OP_TYPES:
            entry = by_op.setdefault(n.op_type, [0, 0])
            entry[0] += n.name in low_names
            entry[1] += 1
    mm = [by_op.get(op, [0, 0]) for op in ("MatMul", "Gemm")]
    return LowPrecisionStats(
        total=sum(v[1] for v in by_op.values()), low=sum(v[0] for v in by_op.values()),
        matmul_gemm_total=sum(v[1] for v in mm), matmul_gemm_low=sum(v[0] for v in mm),
        by_op_type=by_op,
    )


def node_hint(node: Any, initializer_names: set[str]) -> str:
    """A human name for a node: its weight's name (e.g. encoder.layer.3.output.dense)."""
    for name in node.input[1:]:
        if name in initializer_names and "." in name and not name.startswith(("onnx::", "val_")):
            for suffix in (".weight", ".bias"):
                name = name.removesuffix(suffix)
            return name
    return node.name


# ----------------------------------------------------------------------------- surrogates


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
        nodes = _prune(nodes, {o.name for o in q.graph.output})
        used = {t for n in nodes for t in n.input}
        have = set()
        for init in q.graph.initializer:
            if init.name in used:
                graph.initializer.append(init)
                have.add(init.name)
        for name in sorted(used - have):
            if name in self.fp32_inits:
                graph.initializer.append(self.fp32_inits[name])
        graph.node.extend(nodes)
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
        used = {t for n in nodes for t in n.input}
        have = set()
        for init in q.graph.initializer:
            if init.name in used:
                graph.initializer.append(init)
                have.add(init.name)
        for name in sorted(used - have):
            if name in fp32_inits:
                graph.initializer.append(fp32_inits[name])
        graph.node.extend(nodes)
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


def _prune(nodes: list[Any], outputs: set[str]) -> list[Any]:
    """Drop nodes none of whose outputs is used (Q/DQ left behind by a rewired node)."""
    while True:
        used = {t for n in nodes for t in n.input} | outputs
        kept = [n for n in nodes if any(o in used for o in n.output)]
        if len(kept) == len(nodes):
            return kept
        nodes = kept


# ----------------------------------------------------------------------------- evaluation


def tightened(recipe: Recipe, precision: str, margin: float) -> Recipe:
    """The recipe with its cosine gates moved ``margin`` of the way towards 1.0."""
    if margin <= 0:
        return recipe
    per_output: dict[str, dict[str, Tolerance]] = {
        k: dict(v) for k, v in recipe.verify.per_output.items()
    }
    for out in recipe.outputs:
        tol = recipe.verify.tolerance(precision, out.name)
        if tol.min_cosine is not None:
            stricter = 1.0 - (1.0 - tol.min_cosine) * (1.0 - margin)
            per_output.setdefault(out.name, {})[precision] = tol.model_copy(
                update={"min_cosine": stricter})
    verify = VerifySettings.model_validate(
        {**recipe.verify.model_dump(), "per_output": {
            k: {p: t.model_dump() for p, t in v.items()} for k, v in per_output.items()}})
    return recipe.model_copy(update={"verify": verify})


@dataclass
class Score:
    passed: bool
    worst: float | None  # worst task metric over cases and outputs (cosine or top-1)
    damage: float  # 1 - worst cosine of any output (continuous, for ranking)
    reasons: list[str] = field(default_factory=list)


def score_outputs(recipe: Recipe, precision: str, cases: Sequence[Case],
                  outputs: Sequence[Mapping[str, np.ndarray]]) -> Score:
    """The recipe's gate on many cases, fast (the search's judge; the stage's verification
    rows come from polygraphy's comparator in ``compare_cases``)."""
    metric_of = {o.name: o.metric for o in recipe.outputs}
    mask_input = next((i.name for i in recipe.inputs if i.kind == "attention_mask"), None)
    damage = 0.0
    worst: float | None = None
    reasons: list[str] = []
    for case, out in zip(cases, outputs, strict=True):
        for name, ref in case.outputs.items():
            got = out.get(name)
            if got is None or np.shape(got) != np.shape(ref):
                damage = 2.0
                reasons.append(f"{case.label}/{name}: missing or wrong shape")
                continue
            got = np.asarray(got, dtype=np.float64)
            want = np.asarray(ref, dtype=np.float64)
            if not np.isfinite(got).all():
                damage = 2.0
                reasons.append(f"{case.label}/{name}: non-finite outputs")
                continue
            metric = metric_of.get(name, "none")
            tol = recipe.verify.tolerance(precision, name)
            cosine_kind = metric if metric in ("cosine", "pooled_cosine") else "cosine"
            cosine = task_metric(cosine_kind, want, got, case.inputs, mask_input)
            damage = max(damage, 1.0 - cosine if cosine is not None else 0.0)
            value = task_metric(metric, want, got, case.inputs, mask_input)
            if value is not None:
                worst = value if worst is None else min(worst, value)
            if metric in ("cosine", "pooled_cosine") and tol.min_cosine is not None \
                    and value is not None and value < tol.min_cosine:
                reasons.append(f"{case.label}/{name}: cosine {value:.6f} < {tol.min_cosine}")
            if metric in TOP1_METRICS and tol.min_top1 is not None \
                    and value is not None and value < tol.min_top1:
                reasons.append(f"{case.label}/{name}: top-1 {value:.4f} < {tol.min_top1}")
            if tol.atol is not None or tol.rtol is not None:
                diff = np.abs(got - want)
                ok = np.zeros(diff.shape, dtype=bool)
                if tol.atol is not None:
                    ok |= diff <= tol.atol
                if tol.rtol is not None:
                    ok |= diff <= tol.rtol * np.abs(want)
                if not ok.all():
                    reasons.append(f"{case.label}/{name}: max abs diff {diff.max():.3g} over "
                                   f"atol {tol.atol} / rtol {tol.rtol}")
    return Score(not reasons, worst, damage, reasons)


def run_model(model: onnx.ModelProto | Path, feeds: Sequence[Mapping[str, np.ndarray]],
              threads: int | None = None) -> list[dict[str, np.ndarray]]:
    """ONNX Runtime CPU outputs of an in-memory model (or a path) for each feed."""
    return run_session(cpu_session(model, threads), feeds)


def evaluation_workers() -> int:
    """Evaluations the search runs at a time: one per core (at most 4), each in one ONNX
    Runtime thread. Its batches are small (a few short samples): on 2 cores two
    single-threaded runs side by side take about half the time of one run on both, with the
    same results."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


class Evaluator:
    """Scores candidate models on fixed cases (inputs + FP32 reference outputs); may be
    called from several threads (``workers`` at a time).

    With ``fail_fast`` the cases are run ``workers`` at a time and a candidate is failed at
    the first failing case (the pass/fail verdict is the same; a failed score's ``worst``
    and ``damage`` then cover the cases run so far): a search judge, not a ranking."""

    def __init__(self, recipe: Recipe, precision: str, cases: Sequence[Case],
                 margin: float = 0.0, fail_fast: bool = False, workers: int = 1) -> None:
        self.recipe = recipe
        self.precision = precision
        self.cases = list(cases)
        self.margin = margin
        self.fail_fast = fail_fast
        self.workers = workers
        self.gate = tightened(recipe, precision, margin)
        self.evaluations = 0
        self._count = threading.Lock()

    def __call__(self, model: onnx.ModelProto | Path | ToggledCandidate) -> Score:
        with self._count:
            self.evaluations += 1
        candidate = model if isinstance(model, ToggledCandidate) \
            else ModelCandidate(cpu_session(model))
        if not self.fail_fast:
            outputs = candidate.run([c.inputs for c in self.cases])
            return score_outputs(self.gate, self.precision, self.cases, outputs)

        def score(case: Case) -> Score:
            return score_outputs(self.gate, self.precision, [case], candidate.run([case.inputs]))

        scores: list[Score] = []
        with ThreadPoolExecutor(self.workers) as pool:
            for start in range(0, len(self.cases), self.workers):
                scores.extend(pool.map(score, self.cases[start:start + self.workers]))
                if not all(sc.passed for sc in scores):
                    break
        worst = [sc.worst for sc in scores if sc.worst is not None]
        return Score(all(sc.passed for sc in scores), min(worst) if worst else None,
                     max(sc.damage for sc in scores),
                     [r for sc in scores for r in sc.reasons])


@dataclass(frozen=True)
class ModelCandidate:
    """A candidate that is a whole model, in its own ONNX Runtime session."""

    session: Any

    def run(self, feeds: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        return run_session(self.session, feeds)


# ----------------------------------------------------------------------------- INT8 search


@dataclass
class Sensitivity:
    group: NodeGroup
    damage: float
    worst: float | None


@dataclass
class Selection:
    quantized_groups: list[NodeGroup]
    excluded: list[str]  # node names kept in high precision
    score: Score | None
    history: list[dict[str, Any]] = field(default_factory=list)


Progress = Callable[[str], None]


def measure_sensitivity(builder: SurrogateBuilder | ToggledSurrogates, groups: Sequence[NodeGroup],
                        evaluate: Evaluator, progress: Progress) -> list[Sensitivity]:
    """Damage of quantizing each group alone, least damaging first (``evaluate.workers``
    groups measured at a time)."""
    all_nodes = [n for g in groups for n in g.nodes]

    def measure(group: NodeGroup) -> Sensitivity:
        mine = set(group.nodes)
        score = evaluate(builder.build(n for n in all_nodes if n not in mine))
        return Sensitivity(group, score.damage, score.worst)

    found: list[Sensitivity] = []
    with ThreadPoolExecutor(evaluate.workers) as pool:
        for i, sensitivity in enumerate(pool.map(measure, groups), 1):
            found.append(sensitivity)
            if i % 8 == 0 or i == len(groups):
                progress(f"sensitivity: {i}/{len(groups)} node groups measured")
    return sorted(found, key=lambda s: s.damage)


def select_groups(builder: SurrogateBuilder | ToggledSurrogates, ranked: Sequence[Sensitivity],
                  evaluate: Evaluator, progress: Progress, max_evaluations: int,
                  greedy_failures: int = 6) -> Selection:
    """The most groups (least damaging first) whose combined surrogate passes ``evaluate``."""
    order = [s.group for s in ranked]
    all_nodes = [n for g in order for n in g.nodes]
    history: list[dict[str, Any]] = []
    budget = [max_evaluations]

    def trial(quantized: Sequence[NodeGroup]) -> Score:
        on = {n for g in quantized for n in g.nodes}
        score = evaluate(builder.build(n for n in all_nodes if n not in on))
        budget[0] -= 1
        history.append({"quantized_groups": len(quantized), "worst": score.worst,
                        "damage": round(score.damage, 6), "passed": score.passed})
        return score

    best_score: Score | None = None
    lo, hi = 0, len(order)  # invariant: prefix lo passes (0: nothing quantized), hi fails
    full = trial(order)
    if full.passed:
        return Selection(list(order), [], full, history)
    while hi - lo > 1 and budget[0] > 0:
        mid = (lo + hi) // 2
        score = trial(order[:mid])
        if score.passed:
            lo, best_score = mid, score
        else:
            hi = mid
    progress(f"search: the {lo} least sensitive of {len(order)} node groups pass together")
    chosen = list(order[:lo])
    failures = 0
    for group in order[lo + 1:]:
        if budget[0] <= 0 or failures >= greedy_failures:
            break
        score = trial([*chosen, group])
        if score.passed:
            chosen.append(group)
            best_score = score
            failures = 0
        else:
            failures += 1
    on = {n for g in chosen for n in g.nodes}
    return Selection(chosen, [n for n in all_nodes if n not in on], best_score, history)


# ----------------------------------------------------------------------------- FP16 ranking


def rank_fp16_nodes(fp32_path: Path, fp16_path: Path, feed: Mapping[str, np.ndarray],
                    skip: Iterable[str] = ()) -> list[tuple[str, float]]:
    """Nodes of the FP32 model ranked by the relative error they add in the FP16 model.

    Every float tensor both models compute is compared; a node's added error is its output
    error minus the largest error of its float inputs.
    """
    import onnx

    fp32 = onnx.load(str(fp32_path), load_external_data=False)
    ref = _all_tensors(fp32_path, feed)
    low = _all_tensors(fp16_path, feed)

    def rel(name: str) -> float | None:
        if name not in ref or name not in low:
            return None
        a = np.asarray(ref[name], dtype=np.float64)
        b = np.asarray(low[name], dtype=np.float64)
        if a.shape != b.shape or a.size == 0 or not np.issubdtype(ref[name].dtype, np.floating):
            return None
        if not np.isfinite(b).all():
            return float("inf")
        return float(np.linalg.norm(a - b) / (np.linalg.norm(a) + 1e-12))

    skipped = set(skip)
    ranked: list[tuple[str, float]] = []
    for node in fp32.graph.node:
        if node.name in skipped or node.op_type in _DATA_MOVEMENT:
            continue
        outs = [e for e in (rel(t) for t in node.output) if e is not None]
        if not outs:
            continue
        ins = [e for e in (rel(t) for t in node.input) if e is not None]
        added = max(outs) - (max(ins) if ins else 0.0)
        if not np.isfinite(added):
            added = 1e9
        ranked.append((node.name, added))
    ranked.sort(key=lambda item: -item[1])
    return ranked


def _all_tensors(path: Path, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every intermediate tensor of a model for one feed (polygraphy marks them outputs)."""
    import onnx
    from polygraphy import constants
    from polygraphy.backend.onnx import ModifyOutputs

    from trtpack.verification import quiet_polygraphy

    model = onnx.load(str(path), load_external_data=True)
    for vi in list(model.graph.value_info):
        if not vi.type.HasField("tensor_type"):
            model.graph.value_info.remove(vi)
    with quiet_polygraphy():
        marked = ModifyOutputs(model, outputs=constants.MARK_ALL)()
    session = cpu_session(marked)
    names = [o.name for o in session.get_outputs()]
    inputs = {i.name for i in session.get_inputs()}
    values = session.run(names, {k: v for k, v in feed.items() if k in inputs})
    return {n: v for n, v in zip(names, values, strict=True) if isinstance(v, np.ndarray)}
