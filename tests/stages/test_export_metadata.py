"""What the export writes into each ONNX node's metadata: the module scopes the precision
stage reads, and no Python stack traces (``pytorch.onnx_export.without_stack_traces``, issue
47: one per node, most of a small model's graph, with the checkout's paths)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")


def test_nodes_keep_their_module_scopes_and_no_stack_trace(tmp_path: Path) -> None:
    import torch.fx.config

    from trtpack.api import BuildRequest, resolve_options
    from trtpack.precision.module_paths import NAME_SCOPES_KEY
    from trtpack.pytorch.models import load_model
    from trtpack.stages.export import output_selector
    from trtpack.stages.torch_export import export_onnx

    plan, _ = resolve_options(BuildRequest("tiny-bert", target="cpu",
                                           profiles=["1x4:2x8:4x16"]))
    loaded = load_model(plan.recipe, random_weights=True, seed=plan.seed)
    path = tmp_path / "model.onnx"
    exported = export_onnx(output_selector(loaded.module, plan.recipe), plan, path,
                           logging.getLogger("test"))
    assert exported.exporter == "dynamo"
    assert torch.fx.config.do_not_emit_stack_traces is False  # as it was before
    nodes = onnx.load(str(path), load_external_data=False).graph.node
    props = [{p.key: p.value for p in node.metadata_props} for node in nodes]
    assert sum(NAME_SCOPES_KEY in p for p in props) > len(nodes) // 2
    # (a few nodes a torch pass inserts name that pass; none the model's code or trtpack's)
    traces = [p["pkg.torch.onnx.stack_trace"] for p in props
              if p.get("pkg.torch.onnx.stack_trace")]
    assert len(traces) < len(nodes) // 4
    assert not [t for t in traces if "modeling_bert" in t or "trtpack" in t], traces[:1]
    assert str(Path(__file__).parent.parent.parent) not in path.read_text(errors="replace")
