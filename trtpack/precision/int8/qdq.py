"""trtpack's own INT8 Q/DQ for MatMul/Gemm/Conv: the model ModelOpt 0.47 builds, without
ModelOpt's copies of the weights.

ModelOpt's ``quantize`` (with ``op_types_to_quantize`` given, ``max`` calibration, FP32 kept
in high precision) loads the weights about ten times before it calibrates, and its
calibration session holds a whole batch's activations of every calibrated tensor: 18.7 GB
for bert-large's 1.3 GB of weights (benchmarks/README.md, "INT8's precision stage"). The
same model is built here from the graph alone (``onnx.load(load_external_data=False)``):

- **Placement**: ModelOpt's rules for these op types (``trtpack.precision.int8.placement``).
- **Q/DQ**, as ONNX Runtime's QDQ quantizer writes them under ModelOpt's settings: one
  QuantizeLinear/DequantizeLinear pair per activation read by a quantized node (symmetric
  INT8, zero point 0, a scalar FP32 scale), shared by the quantized nodes that read it; a
  pair on each weight, per output channel (MatMul axis 1, Gemm 1 or 0 when ``transB``, Conv
  0), the FP32 weight kept in the graph; biases unquantized. Names are ONNX Runtime's
  (``<tensor>_QuantizeLinear``, ``<tensor>_scale`` ...).
- **Scales**, from ``max`` calibration: the largest absolute value of each activation over
  the calibration batches, which the graph itself computes (``absmax_outputs``) in one ONNX
  Runtime session, one batch at a time: the run frees each activation after its reduction,
  so the peak is the weights, the session and one batch's activations. scale = absmax / 127,
  as ``onnxruntime.quantization.quant_utils.compute_scale_zp`` computes it; a Softmax
  output's absmax is 1 (``placement.FIXED_RANGE_OP_TYPES``), as ModelOpt sets it.
  With ``mse`` calibration (trtpack's, not ModelOpt's ONNX path), each other activation is
  also fetched, one batch at a time, and counted into a histogram
  (``activation_ranges.ActivationHistogram``); its range is the least-squared-error one
  (``activation_ranges.mse_amax``): the peak adds one batch's activations.

The weights are read one at a time (for a weight's per-channel scale) and copied into the
output's data file one at a time (``save_model(weights_dir=...)``).
onnx and onnxruntime are imported inside the functions.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trtpack.precision.graph import COMPUTE_OP_TYPES
from trtpack.precision.int8.activation_ranges import ActivationHistogram
from trtpack.precision.int8.placement import (
    Calibration,
    Placement,
    place,
    prepare_graph,
    quantized_inputs,
    shape_exclusions,
    weight_inputs,
)

if TYPE_CHECKING:
    import onnx

    from trtpack.options import BuildPlan

INT8_SYMMETRIC_RANGE = 254.0  # qmax - qmin of symmetric INT8 (-127..127)
QDQ_OP_TYPES = frozenset(COMPUTE_OP_TYPES)  # any other op type goes to ModelOpt

OWN_METHODS = ("max", "mse", "percentile", "auto")  # calibration methods of trtpack's own Q/DQ
HISTOGRAM_METHODS = ("mse", "auto")  # their calibration run counts histograms (auto: for mse)
QUANTIZER_VARIABLE = "TRTPACK_INT8_QUANTIZER"
"""Set to ``modelopt``, every INT8 Q/DQ conversion goes through ModelOpt's ``quantize`` (the
path before trtpack's own Q/DQ): for comparisons (``benchmarks/scaling.py`` run with it set)."""


def own_qdq(op_types: Iterable[str], method: str, high_precision: str) -> bool:
    """Whether trtpack's own Q/DQ builds this conversion (else ModelOpt does): MatMul, Gemm
    and Conv only, ``max``, ``mse`` or ``auto`` (both) calibration (``percentile`` rescales
    a max model afterwards), FP32 kept in high precision, and ``QUANTIZER_VARIABLE`` not asking for
    ModelOpt."""
    types = set(op_types)
    return os.environ.get(QUANTIZER_VARIABLE) != "modelopt" and bool(types) \
        and types <= QDQ_OP_TYPES and method in OWN_METHODS \
        and high_precision == "fp32"


def first_conversion_is_own(plan: BuildPlan) -> bool:
    """Whether the first INT8 conversion of ``plan`` is trtpack's own (needs no ModelOpt
    worker)."""
    from trtpack.precision.int8.fallback import FALLBACK_QUANTIZE_OP_TYPES

    s = plan.recipe.precision_options.int8
    return own_qdq(list(s.quantize_op_types) or list(FALLBACK_QUANTIZE_OP_TYPES),
                   plan.calibration_method or s.calibration_method,
                   "fp32" if plan.fallback == "auto" else s.high_precision)


def probe_outputs(model: onnx.ModelProto, placement: Placement, keep_outputs: bool,
                  histograms: bool = False) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """Make ``model`` (graph only, changed in place) compute each activation's largest
    absolute value and the shape of each tensor the rules need, as extra outputs
    (``keep_outputs``: its own outputs stay first); with ``histograms``, each float
    activation whose range is not fixed by rule is an output too. Returns (tensor -> absmax
    output, tensor -> shape output, the activations output whole)."""
    import onnx
    from onnx import TensorProto, helper

    from trtpack.precision.graph import absmax_outputs, tensor_types

    types = tensor_types(model)
    floats = [t for t in placement.activations if types.get(t) == TensorProto.FLOAT]
    own = list(model.graph.output)
    absmax = absmax_outputs(model, floats)
    shapes: dict[str, str] = {}
    nodes = list(model.graph.node)
    for k, name in enumerate(placement.shaped):
        out = f"trtpack_shape/{k}"
        nodes.append(helper.make_node("Shape", [name], [out], name=f"trtpack_shape/{k}/Shape"))
        shapes[name] = out
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.output.extend(helper.make_tensor_value_info(o, TensorProto.INT64, [None])
                              for o in shapes.values())
    whole = [t for t in floats if t not in placement.fixed] if histograms else []
    model.graph.output.extend(onnx.ValueInfoProto(name=t) for t in whole)
    if keep_outputs:
        probes = list(model.graph.output)
        del model.graph.output[:]
        model.graph.output.extend([*own, *probes])
    return absmax, shapes, whole


class CalibrationRun:
    """One ONNX Runtime session over the graph beside its weight file that measures a
    ``Placement`` (and, with ``keep_outputs``, returns the model's own outputs too); with
    ``histograms`` (``mse`` calibration), the histogram of each measured activation."""

    def __init__(self, source: Path, placement: Placement, keep_outputs: bool = False,
                 threads: int | None = None, histograms: bool = False) -> None:
        import onnx

        from trtpack.runtimes.onnxruntime import cpu_session

        model = onnx.load(str(source), load_external_data=False)
        self.own = [o.name for o in model.graph.output] if keep_outputs else []
        self.absmax, self.shapes, self.whole = probe_outputs(model, placement, keep_outputs,
                                                             histograms)
        probe = source.with_name("calibration-" + source.name)  # beside it: same weights
        onnx.save_model(model, str(probe))
        del model
        try:
            # unoptimized, as ModelOpt's calibrator runs it: fused kernels change the
            # activations' last bits, and an INT8 model's per-sample figures move with its
            # scales' last bits (benchmarks/README.md, "Looking for that difference")
            self.session = cpu_session(probe, threads, few_runs=True, prepacked=True,
                                       optimized=False)
        finally:
            probe.unlink(missing_ok=True)
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.calibration = Calibration()
        self.histograms = {t: ActivationHistogram() for t in self.whole}
        self.calibration.histograms.update(self.histograms)  # the same objects, filled here

    def run(self, feed: Mapping[str, np.ndarray], calibrate: bool = True, outputs: bool = True
            ) -> dict[str, np.ndarray]:
        """The model's own outputs for ``feed`` (``outputs``: else none); with ``calibrate``
        its measurements are added to ``calibration``. ONNX Runtime computes only what the
        names asked for need."""
        probes = [*self.absmax.values(), *self.shapes.values()] if calibrate else []
        whole = self.whole if calibrate else []
        names = [*(self.own if outputs else []), *probes]
        values = self.session.run([*names, *whole],
                                  {k: v for k, v in feed.items() if k in self.inputs})
        for tensor in reversed(whole):  # counted, then freed, one tensor at a time
            self.histograms[tensor].add(values.pop())
        got = dict(zip(names, values, strict=True))
        if calibrate:
            self.calibration.add(
                {t: float(got[o]) for t, o in self.absmax.items()},
                {t: tuple(int(d) for d in got[o]) for t, o in self.shapes.items()})
        return {name: got[name] for name in self.own if name in got}

    def close(self) -> None:
        del self.session


def calibrate(source: Path, placement: Placement, feeds: Iterable[Mapping[str, np.ndarray]],
              method: str = "max") -> Calibration:
    """``placement``'s measurements over ``feeds``, one batch at a time (``mse``: with the
    histograms)."""
    if not placement.activations and not placement.shaped:
        return Calibration()  # nothing to measure
    run = CalibrationRun(source, placement, histograms=method in HISTOGRAM_METHODS)
    try:
        for feed in feeds:
            run.run(feed)
        return run.calibration
    finally:
        run.close()


def references_and_calibration(source: Path,
                               parts: Sequence[tuple[str, Sequence[Mapping[str, np.ndarray]]]],
                               op_types: Iterable[str],
                               calibration: Sequence[Mapping[str, np.ndarray]],
                               method: str = "max"
                               ) -> tuple[list[dict[str, np.ndarray]], Calibration]:
    """The FP32 outputs of every feed of ``parts`` ((name, feeds) in order), and, over the
    ``calibration`` batches, the measurements of every candidate of ``op_types`` (no
    exclusion: a superset for any later conversion), in one session a batch at a time.
    A part that is ``calibration`` itself is measured in its references' runs; else the
    calibration batches run once more, for their measurements only. ``mse`` (and ``auto``,
    which may choose mse): the calibration batches' histograms too."""
    import onnx

    graph = onnx.load(str(source), load_external_data=False).graph
    placement = place(graph, op_types, [], [])
    del graph
    run = CalibrationRun(source, placement, keep_outputs=True,
                      histograms=method in HISTOGRAM_METHODS)
    try:
        refs = [run.run(feed, calibrate=part is calibration) for _, part in parts
                for feed in part]
        if not any(part is calibration for _, part in parts):
            for feed in calibration:
                run.run(feed, outputs=False)
    finally:
        run.close()
    return refs, run.calibration


def _scale(absmax: np.ndarray | np.floating[Any]) -> np.ndarray:
    """ONNX Runtime's symmetric INT8 scale of a range [-absmax, absmax] (FP32): 1.0 where
    the range is (nearly) zero."""
    scale = (np.asarray(absmax, dtype=np.float64) * 2.0 / INT8_SYMMETRIC_RANGE)
    tiny = np.finfo(np.float32).tiny
    return np.where(scale < tiny, 1.0, scale).astype(np.float32)


def weight_scale(values: np.ndarray, axis: int) -> np.ndarray:
    """Per-channel scale of a weight along ``axis`` (every other axis reduced)."""
    reduce = tuple(i for i in range(values.ndim) if i != axis)
    high = np.max(values, axis=reduce).astype(np.float32)
    low = np.min(values, axis=reduce).astype(np.float32)
    return _scale(np.maximum(np.abs(np.minimum(low, 0)), np.abs(np.maximum(high, 0))))


def insert_qdq(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto],
               ranges: Mapping[str, float], weights_dir: Path,
               fixed: Mapping[str, float] | None = None) -> int:
    """Q/DQ before ``nodes`` of ``model`` (graph only, changed in place; its weights are
    read one at a time from ``weights_dir``); returns how many tensors got a pair.
    ``ranges``: each activation's calibrated range (``Calibration.ranges``); ``fixed``:
    activations whose absmax is set by a rule (``Placement.fixed``), not calibrated."""
    from onnx import helper, numpy_helper

    from trtpack.onnx_tools.files import initializer_array

    fixed = fixed or {}

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    pairs: dict[str, str] = {}  # tensor -> its DequantizeLinear output
    before: dict[int, list[onnx.NodeProto]] = {}  # id(consumer) -> Q/DQ placed before it
    new_inits = []
    for node in nodes:
        axes = dict(weight_inputs(node))
        for i in quantized_inputs(node):
            t = node.input[i]
            if t in pairs:
                continue
            if t in inits:
                axis = axes.get(i)
                values = initializer_array(inits[t], weights_dir)
                if axis is None or values.ndim <= axis:
                    scale = _scale(np.max(np.abs(values)))  # per tensor
                    zero = np.zeros((), dtype=np.int8)
                else:
                    scale = weight_scale(values, axis)
                    zero = np.zeros(scale.shape, dtype=np.int8)
                del values
            else:
                axis = None
                scale = _scale(np.asarray(fixed.get(t, ranges[t]),
                                          dtype=np.float32))
                zero = np.zeros((), dtype=np.int8)
            per_channel = axis is not None and bool(scale.ndim)
            new_inits += [numpy_helper.from_array(scale, f"{t}_scale"),
                          numpy_helper.from_array(zero, f"{t}_zero_point")]
            q = helper.make_node("QuantizeLinear", [t, f"{t}_scale", f"{t}_zero_point"],
                                 [f"{t}_QuantizeLinear_Output"], name=f"{t}_QuantizeLinear")
            dq = helper.make_node("DequantizeLinear", [f"{t}_QuantizeLinear_Output",
                                                       f"{t}_scale", f"{t}_zero_point"],
                                  [f"{t}_DequantizeLinear_Output"],
                                  name=f"{t}_DequantizeLinear")
            if per_channel:  # the weight's channel axis, on both nodes
                for made in (q, dq):
                    made.attribute.append(helper.make_attribute("axis", axis))
            before.setdefault(id(node), []).extend([q, dq])
            pairs[t] = f"{t}_DequantizeLinear_Output"
    targets = {id(n) for n in nodes}
    ordered = []
    for node in graph.node:
        ordered += before.get(id(node), [])
        if id(node) in targets:
            for i in quantized_inputs(node):
                node.input[i] = pairs[node.input[i]]
        ordered.append(node)
    del graph.node[:]
    graph.node.extend(ordered)
    graph.initializer.extend(new_inits)
    return len(pairs)


def quantize(source: Path, output: Path, op_types: Iterable[str], excluded: Iterable[str],
             excluded_op_types: Iterable[str], feeds: Sequence[Mapping[str, np.ndarray]],
             calibration: Calibration | None = None, method: str = "max"
             ) -> dict[str, object]:
    """The Q/DQ model of ``source`` (its weights in its folder) written to ``output`` (its
    data file beside it), its activation ranges by ``method`` (``max`` or ``mse``).
    ``calibration``: measured already (for every candidate of these op types, with the
    histograms ``mse`` needs); else measured here over ``feeds``. Returns what was done."""
    import onnx

    from trtpack.onnx_tools.files import save_model

    model = prepare_graph(onnx.load(str(source), load_external_data=False))
    placement = place(model.graph, op_types, excluded, excluded_op_types)
    if calibration is None:
        calibration = calibrate(source, placement, feeds, method)
    inits = {i.name: i for i in model.graph.initializer}
    by_shape = set(shape_exclusions(placement, calibration, inits))
    nodes = [n for n in placement.nodes if n.name not in by_shape]
    pairs = insert_qdq(model, nodes, calibration.ranges(method), source.parent, placement.fixed)
    save_model(model, output, weights_dir=source.parent)
    return {"quantized_nodes": len(nodes), "qdq_pairs": pairs,
            "excluded_by_shape": sorted(by_shape), "calibration_batches": calibration.batches}
