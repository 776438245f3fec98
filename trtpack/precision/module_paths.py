"""Readable names for ONNX nodes: the PyTorch module each came from.

The dynamo exporter records a node's module scopes in its ``metadata_props``
(``pkg.torch.onnx.name_scopes``: ``['', 'model', 'model.encoder', ...,
'model.encoder.layer.3.attention.self.query', 'linear']``); the simplify stage carries them
through onnxsim. The module path is the deepest scope that names a module (the last entry
is the ATen op), without the export wrapper's ``model.`` prefix. Nodes without metadata
(legacy exporter, nodes a tool created) keep their ONNX name. Pure Python: no onnx import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx

NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
WRAPPER_PREFIX = "model."  # trtpack's export wrapper holds the model as ``self.model``


def module_path(node: onnx.NodeProto) -> str | None:
    """The PyTorch module path of an ONNX node (e.g. ``encoder.layer.3.attention.self.query``),
    or None when the node carries no name scopes."""
    raw = next((p.value for p in node.metadata_props if p.key == NAME_SCOPES_KEY), None)
    if raw is None:
        return None
    try:
        scopes = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return None
    if not isinstance(scopes, list) or len(scopes) < 2:
        return None
    modules = [s for s in scopes[:-1] if isinstance(s, str) and s]
    if not modules:
        return None
    path = modules[-1]
    if path.startswith(WRAPPER_PREFIX):
        path = path[len(WRAPPER_PREFIX):]
    elif path == "model":
        return None
    return path


def module_paths(nodes: Iterable[onnx.NodeProto]) -> dict[str, str]:
    """{node name: module path} for the nodes that carry one."""
    found: dict[str, str] = {}
    for node in nodes:
        path = module_path(node)
        if path is not None:
            found[node.name] = path
    return found


def display_name(node_name: str, op_type: str, paths: dict[str, str]) -> str:
    """``encoder.layer.3.attention.self.query (MatMul)``, or the ONNX name when unknown."""
    path = paths.get(node_name)
    return f"{path} ({op_type})" if path else f"{node_name} ({op_type})"
