"""torch.onnx's dynamo exporter, without the work a trtpack export does not need.

Inside ``torch.onnx.export``, the decompositions, the optimizer and the save are most of the
time on the BERT family (figures: benchmarks/README.md). What is done here:

- **Decompositions.** The exporter re-traces the whole captured graph to decompose the ATen
  ops ONNX has no translation for. When the captured graph has none (the BERT family: every
  op is in the exporter's registry once three spellings are mapped to the ones it knows),
  the re-trace changes nothing the translation needs, and is skipped. Otherwise it runs as
  always. The patch is scoped to one export and applies to the pinned torch only (the
  function it wraps is private); the verify stage compares the ONNX model with PyTorch at
  every profile corner either way.
- **Type promotion.** The exporter's type-promotion pass re-runs every node of the graph on
  fake tensors to find the ones whose inputs need a cast (the BERT family has none). The
  dtypes torch.export recorded on every node (``meta["val"]``) answer that first, by the
  pass's own rules; the pass runs when some node needs a cast, or when a node's dtype is not
  recorded (``promotion_only_where_needed``). Where it is not run it cannot fail either: on
  Swin with a dynamic batch its re-run of a view on symbolic shapes raised "Cannot view a
  tensor", and the dynamo export failed over to the TorchScript exporter; it now exports
  (verified at every corner as always).
- **Stack traces.** torch's tracer records the Python stack of every graph node it makes
  (``torch.fx.config.do_not_emit_stack_traces``), and the exporter writes each into the
  node's metadata (``pkg.torch.onnx.stack_trace``): most of a small model's graph proto
  (minilm: 772 KB with them, 489 KB without; the checkout's paths in them, so the bytes
  differed from checkout to checkout), read by nothing trtpack does, and about 7% of the
  exporter's Python (``without_stack_traces``). The module scopes the precision stage reads
  (``pkg.torch.onnx.name_scopes``) are recorded as before.
- **onnxscript's side** (the registry's listing, one optimizer round, anchored rewrite
  rules): ``pytorch/onnxscript_speedups.py``.
- **Saving.** Folding ``Transpose`` of a weight leaves a transposed numpy view, which numpy
  writes element by element; each such weight is made contiguous just before it is
  written, one at a time, so no second copy of the weights is held.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx_ir
    import torch
    from torch._ops import OpOverload
    from torch.fx.node import Argument
    from torch.onnx._internal.exporter._registration import ONNXRegistry

TORCH_VERSION = "2.13.0"  # the version whose private decomposition step is wrapped


@dataclass
class Decomposition:
    """What happened to the exporter's decomposition step in one export."""

    skipped: bool = False
    reason: str = "not reached"

    def summary(self) -> str:
        """``skipped: <why>`` or ``ran: <why>`` (the export metrics and log say this)."""
        return f"{'skipped' if self.skipped else 'ran'}: {self.reason}"


def rewrites() -> dict[OpOverload, OpOverload]:
    """ATen overloads the captured graph spells differently from the exporter's registry,
    mapped to the registered overload that computes the same thing."""
    import torch

    aten = torch.ops.aten
    return {aten.__and__.Tensor: aten.bitwise_and.Tensor,
            aten.__or__.Tensor: aten.bitwise_or.Tensor}


def _to_copy_dtype(node: torch.fx.Node) -> tuple[bool, Argument]:
    """(whether ``node`` is a ``Tensor.to`` that only converts the type, its dtype)."""
    import torch

    aten = torch.ops.aten
    if node.target == aten.to.dtype_layout:
        extra = set(node.kwargs) - {"dtype", "layout", "device", "pin_memory", "non_blocking",
                                    "copy"}
        return not extra and len(node.args) == 1, node.kwargs.get("dtype")
    if node.target == aten.to.dtype:
        return len(node.args) >= 2 and "memory_format" not in node.kwargs, node.args[1]
    if node.target == aten.to.device:
        dtype = node.args[2] if len(node.args) > 2 else node.kwargs.get("dtype")
        return "memory_format" not in node.kwargs, dtype
    return False, None


def _assertion_targets() -> set[OpOverload]:
    import torch

    aten = torch.ops.aten
    return {aten.sym_constrain_range_for_size.default, aten._assert_async.default,
            aten._assert_async.msg, aten._assert_scalar.default,
            aten._assert_tensor_metadata.default}


def untranslatable_ops(program: torch.export.ExportedProgram, registry: ONNXRegistry
                       ) -> list[str]:
    """The ATen ops of an exported program that have no ONNX translation (after the
    spellings of ``rewrites``/``Tensor.to`` are mapped); empty when the decomposition
    re-trace can be skipped. Also non-empty for a program that mutates inputs or buffers."""
    signature = program.graph_signature
    if signature.buffers_to_mutate or signature.user_inputs_to_mutate:
        return ["(mutates its inputs or buffers)"]
    renames, asserts = rewrites(), _assertion_targets()
    missing = set()
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target in asserts or node.target in renames:
            continue
        if _to_copy_dtype(node)[0]:
            continue
        schema = getattr(node.target, "_schema", None)
        mutates = schema is not None and schema.is_mutable
        if mutates or not registry.is_registered(node.target):
            missing.add(str(node.target))
    return sorted(missing)


def _same_shape(a: torch.fx.Node, b: torch.fx.Node) -> bool:
    """Whether two traced values have the same (symbolic) shape, judged conservatively by
    the printed size expressions."""
    va, vb = a.meta.get("val"), b.meta.get("val")
    if va is None or vb is None or not hasattr(va, "shape") or not hasattr(vb, "shape"):
        return False
    return [str(d) for d in va.shape] == [str(d) for d in vb.shape]


def respell(program: torch.export.ExportedProgram) -> None:
    """Map the spellings of ``rewrites`` and dtype-only ``Tensor.to`` to registered ops, and
    drop reshapes to the shape a tensor already has (the re-trace drops them too; with
    dynamic axes onnxsim cannot)."""
    import torch

    aten = torch.ops.aten
    renames = rewrites()
    for node in list(program.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target in (aten.reshape.default, aten.view.default) \
                and hasattr(node.args[0], "meta") and _same_shape(node, node.args[0]):
            node.replace_all_uses_with(node.args[0])
            program.graph.erase_node(node)
            continue
        if node.target in renames:
            node.target = renames[node.target]
            continue
        only_dtype, dtype = _to_copy_dtype(node)
        if only_dtype:
            node.target = torch.ops.aten._to_copy.default
            node.args = (node.args[0],)
            node.kwargs = {"dtype": dtype} if dtype is not None else {}
    program.graph_module.recompile()


def torch_is_pinned() -> bool:
    """Whether torch is ``TORCH_VERSION`` (a local build such as ``+cpu`` aside), the version
    whose private export functions this module wraps."""
    import torch

    return str(torch.__version__).split("+")[0] == TORCH_VERSION


@contextlib.contextmanager
def skip_needless_decomposition() -> Iterator[Decomposition]:
    """Within the block, ``torch.onnx.export`` skips its decomposition re-trace when every op
    of the captured graph has an ONNX translation (see the module docstring)."""
    import torch

    record = Decomposition()
    if not torch_is_pinned():
        record.reason = f"torch {torch.__version__} (the skip is written for {TORCH_VERSION})"
        yield record
        return
    from torch.onnx._internal.exporter import _fx_passes

    original = _fx_passes.decompose_with_registry

    def decompose(program: torch.export.ExportedProgram, registry: ONNXRegistry
                  ) -> torch.export.ExportedProgram:
        missing = untranslatable_ops(program, registry)
        if missing:
            record.reason = "ops without an ONNX translation: " + ", ".join(missing[:5])
            return original(program, registry)
        respell(program)
        record.skipped, record.reason = True, "every op has an ONNX translation"
        return program

    _fx_passes.decompose_with_registry = decompose  # type: ignore[assignment]
    try:
        yield record
    finally:
        _fx_passes.decompose_with_registry = original


@contextlib.contextmanager
def without_stack_traces() -> Iterator[None]:
    """Within the block, torch's tracer records no Python stack trace per graph node (see the
    module docstring); its setting as it was after."""
    import torch.fx.config

    before = getattr(torch.fx.config, "do_not_emit_stack_traces", False)
    torch.fx.config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        torch.fx.config.do_not_emit_stack_traces = before


@contextlib.contextmanager
def promotion_only_where_needed() -> Iterator[None]:
    """Within the block, the exporter's type-promotion pass runs only on a graph where a node
    needs a cast (``needs_promotion``); otherwise it would change nothing. Pinned torch only
    (the pass and its rules are private); otherwise nothing changes."""
    if not torch_is_pinned():
        yield
        return
    from torch.onnx._internal.exporter import _fx_passes

    original = _fx_passes.insert_type_promotion_nodes

    def insert(graph_module: torch.fx.GraphModule) -> None:
        if needs_promotion(graph_module):
            original(graph_module)

    _fx_passes.insert_type_promotion_nodes = insert
    try:
        yield
    finally:
        _fx_passes.insert_type_promotion_nodes = original


def needs_promotion(graph_module: torch.fx.GraphModule) -> bool:
    """Whether the exporter's type-promotion pass (``InsertTypePromotion``) would insert a cast
    in ``graph_module``: its rule for each node, previewed on the values torch.export
    recorded (``meta["val"]``) instead of re-running the graph, and its test for each argument
    (``_maybe_promote_arg``). True as well where the pass would have to decide (a value not
    recorded, an argument of a kind it does not promote)."""
    import torch
    from torch.onnx._internal.fx.passes.type_promotion import (
        TypePromotionTable,
        get_type_promotion_rule,
    )

    table = TypePromotionTable()
    for module in graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            return True
        for node in module.graph.nodes:
            if node.op != "call_function":
                continue
            rule = get_type_promotion_rule(node, table)
            if rule is None:
                continue
            if any("val" not in arg.meta for arg in node.all_input_nodes):
                return True
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs),
                                                 lambda arg: arg.meta["val"])
            preview = rule.preview_type_promotion(args, kwargs)
            wanted = [*((arg, preview.args_dtypes.get(i)) for i, arg in enumerate(node.args)),
                      *((arg, preview.kwargs_dtypes.get(name))
                        for name, arg in node.kwargs.items())]
            if any(_cast_needed(arg, dtype) for arg, dtype in wanted):
                return True
    return False


def _cast_needed(arg: Argument, dtype: torch.dtype | None) -> bool:
    """``InsertTypePromotion._maybe_promote_arg``'s test: whether ``arg`` becomes a cast (or a
    scalar tensor) of ``dtype``; True where that function would fail."""
    import torch
    from torch.onnx._internal.fx import type_utils

    if dtype is None:
        return False
    if isinstance(arg, torch.fx.Node):
        value = arg.meta["val"]
        if isinstance(value, torch.Tensor):
            return bool(value.dtype != dtype)
        if type_utils.is_torch_symbolic_type(value):
            return type_utils.from_scalar_type_to_torch_dtype(type(value)) != dtype
        return True
    if isinstance(arg, (tuple, list)):
        return any(_cast_needed(element, dtype) for element in arg)
    equivalent = type_utils.from_scalar_type_to_torch_dtype(type(arg))
    return equivalent is None or equivalent != dtype


def save_program(program: torch.onnx.ONNXProgram, path: Path) -> None:
    """Write an exported model to ``path`` with its weights in ``path.data``."""
    import onnx_ir as ir

    for value in program.model.graph.initializers.values():
        tensor = value.const_value
        if isinstance(tensor, ir.Tensor) and isinstance(tensor.raw, np.ndarray) \
                and not tensor.raw.flags.c_contiguous:
            value.const_value = ir.LazyTensor(
                functools.partial(_contiguous_tensor, tensor.raw), dtype=tensor.dtype,
                shape=tensor.shape, name=tensor.name)
    program.save(str(path), external_data=True)


def _contiguous_tensor(array: np.ndarray) -> onnx_ir.Tensor:
    import onnx_ir as ir

    return ir.Tensor(np.ascontiguousarray(array))


def exporter_failure(error: BaseException) -> str:
    """One line for an exporter's exception: the summary line torch.onnx's own errors carry
    (``<class 'ValueError'>: Cannot view ...``), else the first line of the message."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    summary = next((line for line in lines if line.startswith("<class '")), None)
    if summary is not None:
        kind, _, text = summary.partition(">: ")
        return f"{kind.removeprefix('<class ').strip(chr(39))}: {text}"[:300]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]


@contextlib.contextmanager
def torch_logs_to(log: logging.Logger) -> Iterator[None]:
    """torch logs through ``logging`` (with handlers of its own on some loggers) to the
    terminal; send all of it to the stage log instead while exporting."""
    import torch  # noqa: F401  (its loggers exist once it is imported)

    loggers = [logging.getLogger("torch")] + [
        logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
        if name.startswith("torch.")
    ]
    saved = [(lg, lg.handlers[:], lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.handlers = list(log.handlers) if lg.name == "torch" else []
        lg.propagate = lg.name != "torch"
    try:
        yield
    finally:
        for lg, handlers, propagate in saved:
            lg.handlers, lg.propagate = handlers, propagate
