"""The onnxscript side of torch.onnx's dynamo exporter, without work a trtpack export does
not need (``pytorch.onnx_export`` holds the torch side; figures: benchmarks/README.md):

- **The registry's listing.** The exporter builds its op registry from onnxscript's list of
  torchlib functions, which parses the source of every traced function to read a field (the
  domain) that is its opset's; the list is made without the parse.
- **Optimizer.** One round of the exporter's optimizer instead of two: the second round of
  its rewrite rules changed nothing on the BERT family and the simplify stage folds what a
  second round of constant folding would. Each of its rewrite rules is tried only on the
  nodes its pattern's first output node can match (``anchored_rules``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from trtpack.pytorch.onnx_export import torch_is_pinned

if TYPE_CHECKING:
    import onnx_ir
    from onnxscript._framework_apis.torch_2_5 import _OnnxFunctionMeta
    from onnxscript._internal.values import OnnxFunction, TracedOnnxFunction

ONNXSCRIPT_VERSION = "0.7.2"  # the version whose private torchlib listing is replaced


def torchlib_ops_without_parsing() -> list[_OnnxFunctionMeta]:
    """What onnxscript's ``get_torchlib_ops`` returns (every torchlib function, for the
    exporter's registry), without parsing each traced function's source to read its domain:
    a traced function's domain is its opset's (a test checks every one). The parse is most
    of the time of each export's registry, for a field the registry does not read."""
    from onnxscript._framework_apis.torch_2_5 import _OnnxFunctionMeta
    from onnxscript._internal.values import TracedOnnxFunction
    from onnxscript.function_libs.torch_lib import ops, registration

    del ops  # imported for its registrations

    def domain(function: OnnxFunction | TracedOnnxFunction) -> str:
        if isinstance(function, TracedOnnxFunction):
            return str(function.opset.domain)
        return str(function.function_ir.domain)

    metas = []
    for qualified_name, functions in registration.default_registry.items():
        if qualified_name.startswith("internal::"):
            continue
        metas += [_OnnxFunctionMeta(qualified_name=qualified_name, function=f,
                                    domain=domain(f), name=f.name, is_complex=False)
                  for f in functions.overloads]
        metas += [_OnnxFunctionMeta(qualified_name=qualified_name, function=f,
                                    domain=domain(f), name=f.name, is_complex=True)
                  for f in functions.complex]
    return metas


@contextlib.contextmanager
def quick_torchlib_registry() -> Iterator[None]:
    """Within the block, the exporter lists torchlib's functions with
    ``torchlib_ops_without_parsing`` (pinned torch and onnxscript only: the function it
    replaces is private; otherwise nothing changes)."""
    import importlib.metadata

    if not torch_is_pinned() or importlib.metadata.version("onnxscript") != ONNXSCRIPT_VERSION:
        yield
        return
    from torch.onnx._internal._lazy_import import onnxscript_apis

    apis = importlib.import_module(onnxscript_apis.__name__)
    original = getattr(apis, "get_torchlib_ops")  # noqa: B009 (a module mypy cannot see)
    setattr(apis, "get_torchlib_ops", torchlib_ops_without_parsing)  # noqa: B010
    try:
        yield
    finally:
        setattr(apis, "get_torchlib_ops", original)  # noqa: B010


def optimize_program(model: onnx_ir.Model) -> None:
    """The exporter's optimizer (constant folding, its rewrite rules, dead code, common
    subexpressions): one round instead of its default two."""
    import onnxscript.optimizer
    import onnxscript.rewriter.onnx_fusions

    with anchored_rules():
        onnxscript.optimizer.optimize_ir(model, num_iterations=1)
    onnxscript.rewriter.onnx_fusions.fuse(model)


@contextlib.contextmanager
def anchored_rules() -> Iterator[None]:
    """Within the block, each of the optimizer's rewrite rules whose pattern's (first) output
    node is one op type is not tried on a node of another op type: the matcher fixes that
    pattern node to the node it is given and fails at once on another op type, but only
    after the rule's own set-up, every rule on every node. For a rule with several output
    nodes (``SlicesSplit``: two ``Slice`` nodes of one tensor become a ``Split``) the matcher
    first listed every node of the graph for each node tried. The
    graph comes out the same. Pinned onnxscript only (the rule's pattern is private);
    otherwise nothing changes."""
    import importlib.metadata

    if importlib.metadata.version("onnxscript") != ONNXSCRIPT_VERSION:
        yield
        return
    import onnxscript.rewriter

    patched = []
    for rule in onnxscript.rewriter._DEFAULT_REWRITE_RULES:
        pattern = getattr(rule, "_target_pattern", None)
        if pattern is None or pattern.output_nodes[0].op_identifier() is None:
            continue
        op_type = pattern.output_nodes[0].op_type
        original = rule.try_rewrite

        def try_rewrite(model: onnx_ir.Model, graph: onnx_ir.Graph | onnx_ir.Function,
                        node: onnx_ir.Node, *, _try: Any = original, _op: str = op_type,
                        **kwargs: Any) -> Any:
            return None if node.op_type != _op else _try(model, graph, node, **kwargs)

        rule.try_rewrite = try_rewrite  # type: ignore[method-assign,assignment]
        patched.append(rule)
    try:
        yield
    finally:
        for rule in patched:
            del rule.try_rewrite  # the class's own again
