"""A TorchScript module made exportable: traced through a Python wrapper (which passes its
non-tensor arguments as constants), with the state it keeps in attributes folded.

Scripted models often keep state between calls in attributes (a streaming model's context
and recurrent state, the last sample rate): ``self._state = ...`` inside ``forward``. No
exporter takes attribute writes and the branches that read them, so the graph is taken as
*one call from the state the file was saved with*: every read of an attribute before any
write becomes that value, a read after a write in the same call becomes the written value,
constant branches are folded, and the writes that outlive the call are dropped. Each request
to the served model then starts from the saved state; the export stage's reference does the
same (a freshly loaded module per case), so verification compares like with like.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch._C import Node, Value

MAX_ROUNDS = 20


def _module_path(value: Value, root: Value) -> tuple[str, ...] | None:
    names: list[str] = []
    while value is not root:
        node = value.node()
        if node.kind() != "prim::GetAttr":
            return None
        names.append(node.s("name"))
        value = node.input()
    return tuple(reversed(names))


def _attribute(module: torch.nn.Module, path: tuple[str, ...]) -> object:
    """The attribute at ``path`` (a submodule, a tensor, a value the module keeps)."""
    value: object = module
    for name in path:
        value = getattr(value, name)
    return value


def fold_state(graph: Any, saved: torch.nn.Module) -> int:
    """Fold attribute reads and writes in ``graph`` (a traced wrapper's ``torch._C.Graph``,
    inlined; torch's stub of it lacks ``findAllNodes`` and ``insertConstant``) with the
    values of ``saved`` (an untouched copy of the wrapper: tracing ran ``forward`` once and
    moved the traced copy's state). Returns how many writes were dropped."""
    import torch

    root = next(iter(graph.inputs()))
    stateful = {(*(_module_path(next(iter(n.inputs())), root) or ("?",)), n.s("name"))
                for n in graph.findAllNodes("prim::SetAttr")}
    for _ in range(MAX_ROUNDS):
        changed = False
        written: dict[tuple[str, ...], Value] = {}
        unsure: set[tuple[str, ...]] = set()  # written inside a branch not folded yet
        for node in list(graph.nodes()):
            if any(True for _ in node.blocks()):
                unsure |= _written_inside(node, root)
                continue
            if node.kind() == "prim::SetAttr":
                owner = _module_path(next(iter(node.inputs())), root)
                if owner is not None:
                    written[(*owner, node.s("name"))] = list(node.inputs())[1]
                    unsure.discard((*owner, node.s("name")))
                continue
            if node.kind() != "prim::GetAttr":
                continue
            owner = _module_path(node.input(), root)
            if owner is None:
                continue
            path = (*owner, node.s("name"))
            if path in unsure:
                continue
            value = _attribute(saved, path)
            if isinstance(value, torch.nn.Module | torch.ScriptObject) or (
                    isinstance(value, torch.Tensor) and path not in stateful):
                continue  # submodules, weights and buffers the call never writes
            if path in written:
                node.output().replaceAllUsesWith(written[path])
            else:
                constant = graph.insertConstant(value)
                constant.node().moveBefore(node)
                node.output().replaceAllUsesWith(constant)
            node.destroy()
            changed = True
        simplify(graph)
        if not changed:
            break
    writes = graph.findAllNodes("prim::SetAttr")
    for node in writes:
        node.destroy()
    torch._C._jit_pass_dce(graph)
    return len(writes)


def simplify(graph: Any) -> None:
    """Fold what is now known in ``graph`` (a ``torch._C.Graph``): ranks of traced tensors
    (``x.dim()``), tuples built and unpacked, constant arithmetic and the branches it
    decides."""
    import torch

    torch._C._jit_pass_peephole(graph, True)
    torch._C._jit_pass_lower_all_tuples(graph)
    outputs = list(graph.outputs())
    if len(outputs) > 1:  # lowering split the returned tuple: a method returns one value
        pack = graph.create("prim::TupleConstruct", outputs)
        pack.output().setType(torch._C.TupleType([v.type() for v in outputs]))
        graph.appendNode(pack)
        for index in reversed(range(len(outputs))):
            graph.eraseOutput(index)
        graph.registerOutput(pack.output())
    torch._C._jit_pass_constant_propagation(graph)
    torch._C._jit_pass_dce(graph)


def _written_inside(node: Node, root: Value) -> set[tuple[str, ...]]:
    """Attributes written anywhere in the blocks of ``node`` (a branch or a loop)."""
    written: set[tuple[str, ...]] = set()
    for block in node.blocks():
        for inner in block.nodes():
            if inner.kind() == "prim::SetAttr":
                owner = _module_path(next(iter(inner.inputs())), root)
                written.add((*(owner or ("?",)), inner.s("name")))
            written |= _written_inside(inner, root)
    return written


def traced_for_export(wrapper: torch.nn.Module, saved: torch.nn.Module,
                      args: tuple[torch.Tensor, ...]) -> torch.jit.ScriptModule:
    """``wrapper`` (a Python module around the TorchScript one) traced on ``args`` with its
    state folded (``fold_state``), ready for the TorchScript exporter."""
    import torch

    traced = torch.jit.trace(wrapper, args, check_trace=False)
    graph = traced.graph
    torch._C._jit_pass_inline(graph)
    fold_state(graph, saved)
    return traced
