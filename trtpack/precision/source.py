"""The FP32 model a conversion starts from, and the nodes a recipe names in it."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from trtpack.onnx_tools.files import link_or_copy

if TYPE_CHECKING:
    import onnx


def external_locations(model: onnx.ModelProto) -> set[str]:
    """The external data files a model refers to: of its initializers and of its nodes'
    tensor attributes (a ``Constant`` node's weight), subgraphs included."""
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    from trtpack.onnx_tools.files import all_tensors

    found = set()
    for tensor in all_tensors(model.graph):
        if uses_external_data(tensor):
            found.add(ExternalDataInfo(tensor).location)
    return found


def prepare_source(onnx_path: Path, folder: Path, link_data: bool = False) -> Path:
    """The FP32 model in a folder of our own, every node with a unique name.

    ModelOpt writes temporary files beside its input, and names unnamed nodes itself; the
    exclusions written to the overlay must name the nodes the same way on the next build,
    so unnamed nodes get deterministic names (``<op type>_<index>``) here first.

    The weights are copied: onnx (>= 1.23) refuses external data files that are symlinks or
    have more than one hard link, and the stage cache hard-links build files. ``link_data``:
    hard-linked instead, for a conversion that reads them only with ONNX Runtime and numpy
    (the FP16 one: bert-large's 1.3 GB copy took 2-4 s); what would load them with onnx
    calls ``own_data`` first.
    """
    import onnx

    folder.mkdir(parents=True)
    model = onnx.load(str(onnx_path), load_external_data=False)
    for location in external_locations(model):
        if link_data:
            link_or_copy(onnx_path.parent / location, folder / location)
        else:
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


def own_data(onnx_path: Path) -> None:
    """Make the external data files of ``onnx_path`` files of their own (a copy in place of
    a hard link: ``prepare_source``'s ``link_data``), so that onnx loads its weights."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    for location in external_locations(model):
        path = onnx_path.parent / location
        if path.stat().st_nlink > 1:
            copy = path.with_name(path.name + ".copy")
            shutil.copyfile(path, copy)
            os.replace(copy, path)


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
