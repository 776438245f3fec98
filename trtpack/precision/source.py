"""The FP32 model a conversion starts from, and the nodes a recipe names in it."""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trtpack.onnx_tools.files import all_tensors, link_or_copy

if TYPE_CHECKING:
    import onnx


def external_locations(model: onnx.ModelProto) -> set[str]:
    """The external data files a model refers to: of its initializers and of its nodes'
    tensor attributes (a ``Constant`` node's weight), subgraphs included."""
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data


    found = set()
    for tensor in all_tensors(model.graph):
        if uses_external_data(tensor):
            found.add(ExternalDataInfo(tensor).location)
    return found


def prepare_source(onnx_path: Path, folder: Path) -> Path:
    """The FP32 model in a folder of our own, every node with a unique name.

    ModelOpt writes temporary files beside its input, and names unnamed nodes itself; the
    exclusions written to the overlay must name the nodes the same way on the next build,
    so unnamed nodes get deterministic names (``<op type>_<index>``) here first.
    """
    import onnx

    folder.mkdir(parents=True)
    model = onnx.load(str(onnx_path), load_external_data=False)
    for location in external_locations(model):
        # A copy, not a link: onnx (>= 1.23) refuses external data files that are symlinks
        # or have more than one hard link, and the stage cache hard-links build files.
        shutil.copyfile(onnx_path.parent / location, folder / location)
    dst = folder / "model.onnx"
    seen: set[str] = set()
    renamed = False
    for i, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            base = f"{node.op_type}_{i}"
            name = base
            while name in seen:
                name += "_"
            node.name = name
            renamed = True
        seen.add(node.name)
    if renamed:
        onnx.save_model(model, str(dst))
    else:
        link_or_copy(onnx_path, dst)
    return dst


def resolve_node_patterns(names: Sequence[str], patterns: Sequence[str]
                          ) -> tuple[list[str], list[str]]:
    """(matched node names, patterns that matched nothing). A pattern is an exact node name
    or a regular expression matching a whole name."""
    matched: list[str] = []
    unmatched: list[str] = []
    name_set = set(names)
    for pattern in patterns:
        if pattern in name_set:
            hits = [pattern]
        else:
            try:
                regex = re.compile(pattern)
            except re.error:
                hits = []
            else:
                hits = [n for n in names if regex.fullmatch(n)]
        if not hits:
            unmatched.append(pattern)
        matched.extend(h for h in hits if h not in matched)
    return matched, unmatched
