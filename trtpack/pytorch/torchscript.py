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

from typing import Any

MAX_ROUNDS = 20


def _module_path(value: Any, root: Any) -> tuple[str, ...] | None:
    names: list[str] = []
    while value is not root:
        node = value.node()
        if node.kind() != "prim::GetAttr":
            return None
        names.append(node.s("name"))
        value = node.input()
    return tuple(reversed(names))


def _attribute(module: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        module = getattr(module, name)
    return module


def fold_state(graph: Any, saved: Any) -> int:
    """Fold attribute reads and writes in ``graph`` (a traced wrapper's, inlined) with the
    values of ``saved`` (an untouched copy of the wrapper: tracing ran ``forward`` once and
    moved the traced copy's state). Returns how many writes were dropped."""
    import torch

    root = next(iter(graph.inputs()))
    for _ in range(MAX_ROUNDS):
        changed = False
        written: dict[tuple[str, ...], Any] = {}
        for node in list(graph.nodes()):
            if node.kind() == "prim::SetAttr":
                owner = _module_path(next(iter(node.inputs())), root)
                if owner is not None:
                    written[(*owner, node.s("name"))] = list(node.inputs())[1]
                continue
            if node.kind() != "prim::GetAttr":
                continue
            owner = _module_path(node.input(), root)
            if owner is None:
                continue
            path = (*owner, node.s("name"))
            value = _attribute(saved, path)
            if isinstance(value, torch.nn.Module | torch.ScriptObject | torch.nn.Parameter):
                continue
            if path in written:
                node.output().replaceAllUsesWith(written[path])
            else:
                constant = graph.insertConstant(value)
                constant.node().moveBefore(node)
                node.output().replaceAllUsesWith(constant)
            node.destroy()
            changed = True
        torch._C._jit_pass_constant_propagation(graph)
        torch._C._jit_pass_dce(graph)
        if not changed:
            break
    writes = graph.findAllNodes("prim::SetAttr")
    for node in writes:
        node.destroy()
    torch._C._jit_pass_dce(graph)
    return len(writes)


def traced_for_export(wrapper: Any, saved: Any, args: tuple[Any, ...]) -> Any:
    """``wrapper`` (a Python module around the TorchScript one) traced on ``args`` with its
    state folded (``fold_state``), ready for the TorchScript exporter."""
    import torch

    traced = torch.jit.trace(wrapper, args, check_trace=False)
    graph = traced.graph
    torch._C._jit_pass_inline(graph)
    fold_state(graph, saved)
    return traced
