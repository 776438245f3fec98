"""The exporter without needless work (trtpack.pytorch.onnx_export): the decomposition re-trace is
skipped only when every captured op has an ONNX translation, and the ONNX model computes what
PyTorch does either way (real torch.onnx exports, checked with ONNX Runtime)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from trtpack.pytorch.onnx_export import (  # noqa: E402
    promotion_only_where_needed,
    save_program,
    skip_needless_decomposition,
)
from trtpack.pytorch.onnxscript_speedups import (  # noqa: E402
    optimize_program,
    quick_torchlib_registry,
    torchlib_ops_without_parsing,
)


class Block(torch.nn.Module):
    """Linear layers (a folded Transpose weight), a reshape to the same shape, a mask."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.a(x))
        h = h.reshape(h.shape[0], h.shape[1], 32)  # the shape it already has
        mask = (x > 0) & (x < 1)
        return self.b(h) + mask.to(torch.float32)


class Counting(torch.nn.Module):
    """Mutates a buffer: the re-trace must run."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(1))
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return self.lin(x)


class Plain(Block):
    """Block's layers on float tensors and float scalars only: no cast to insert."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.nn.functional.gelu(self.a(x))) * 0.5


class Positions(torch.nn.Module):
    """A float tensor times int64 positions: the exporter's type promotion casts them."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1])
        return self.lin(x) * positions[None, :, None]


def export(module: torch.nn.Module, x: torch.Tensor, path: Path,
           promotion_where_needed: bool = True) -> str:
    from torch.export import Dim

    torch.manual_seed(0)
    module.eval()
    promotion = (promotion_only_where_needed() if promotion_where_needed
                 else contextlib.nullcontext())
    with skip_needless_decomposition() as decomposition, quick_torchlib_registry(), promotion:
        program = torch.onnx.export(
            module, (x,), input_names=["x"], output_names=["y"], opset_version=18,
            dynamo=True, optimize=False,
            dynamic_shapes=({0: Dim("batch", min=1, max=8), 1: Dim("seq", min=1, max=64)},))
    assert program is not None
    optimize_program(program.model)
    save_program(program, path)
    return decomposition.summary()


def run_onnx(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_translatable_graph_skips_the_retrace_and_matches_torch(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = Block()
    x = torch.randn(2, 5, 16)
    how = export(module, x, tmp_path / "m.onnx")
    assert how == "skipped: every op has an ONNX translation"
    assert (tmp_path / "m.onnx.data").is_file()  # weights written beside the model
    for shape in [(1, 1, 16), (3, 7, 16), (8, 64, 16)]:  # every corner of the dynamic axes
        sample = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
        with torch.inference_mode():
            expected = module(torch.from_numpy(sample)).numpy()
        np.testing.assert_allclose(run_onnx(tmp_path / "m.onnx", sample), expected,
                                   rtol=1e-5, atol=1e-5)


def _model_bytes(path: Path) -> bytes:
    """The model and its weights, without the node metadata (stack traces of this file)."""
    import onnx

    model = onnx.load(str(path))
    for node in model.graph.node:
        del node.metadata_props[:]
    return model.SerializeToString() + Path(f"{path}.data").read_bytes()


@pytest.mark.parametrize(("module_type", "casts"),
                         [(Plain, False), (Block, True), (Positions, True)])
def test_type_promotion_pass_runs_where_a_node_needs_a_cast(
        module_type: type[torch.nn.Module], casts: bool, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``needs_promotion`` answers what the exporter's pass does: no cast, and the pass is
    skipped with the same model written; a cast (``Block``: an int scalar compared with a
    float tensor; ``Positions``: int64 times float), and the pass runs. The model matches
    torch either way."""
    from torch.onnx._internal.fx.passes import type_promotion

    import trtpack.pytorch.onnx_export as onnx_export

    answers: list[bool] = []
    needs = onnx_export.needs_promotion
    monkeypatch.setattr(onnx_export, "needs_promotion",
                        lambda graph_module: answers.append(needs(graph_module)) or answers[-1])
    created: list[object] = []
    create = type_promotion._TypePromotionInterpreter._create_node

    def spy(self: object, *args: Any, **kwargs: Any) -> object:
        created.append(args[2])  # the op of the cast the pass inserts
        return create(self, *args, **kwargs)

    monkeypatch.setattr(type_promotion._TypePromotionInterpreter, "_create_node", spy)
    torch.manual_seed(0)
    module = module_type()
    x = torch.randn(2, 5, 16)
    export(module, x, tmp_path / "plain.onnx", promotion_where_needed=False)
    assert bool(created) == casts  # what the pass itself did
    created.clear()
    export(module, x, tmp_path / "m.onnx")
    assert answers == [casts]
    assert bool(created) == casts  # it ran only when needed
    assert _model_bytes(tmp_path / "m.onnx") == _model_bytes(tmp_path / "plain.onnx")
    sample = np.random.default_rng(2).standard_normal((3, 9, 16)).astype(np.float32)
    with torch.inference_mode():
        expected = module(torch.from_numpy(sample)).numpy()
    np.testing.assert_allclose(run_onnx(tmp_path / "m.onnx", sample), expected,
                               rtol=1e-5, atol=1e-5)


def test_mutating_graph_keeps_the_retrace(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = Counting()
    x = torch.randn(2, 3, 8)
    how = export(module, x, tmp_path / "m.onnx")
    assert how.startswith("ran: ")
    assert "add_" in how  # the in-place op (or the mutation) is why
    sample = np.random.default_rng(1).standard_normal((4, 9, 8)).astype(np.float32)
    with torch.inference_mode():
        expected = module.lin(torch.from_numpy(sample)).numpy()
    np.testing.assert_allclose(run_onnx(tmp_path / "m.onnx", sample), expected,
                               rtol=1e-5, atol=1e-5)


def test_torchlib_listing_without_parsing_is_the_listing() -> None:
    """Every torchlib function, in the same order, with the same fields (the domain read
    from its opset instead of its parsed source), as onnxscript's own listing; and within
    quick_torchlib_registry the exporter's registry is built from it."""
    from onnxscript._framework_apis import torch_2_5
    from torch.onnx._internal.exporter import _registration

    fields = ("qualified_name", "function", "domain", "name", "is_complex")
    ours = [tuple(getattr(m, f) for f in fields) for m in torchlib_ops_without_parsing()]
    theirs = [tuple(getattr(m, f) for f in fields) for m in torch_2_5.get_torchlib_ops()]
    assert len(ours) > 400 and ours == theirs
    from torch.onnx._internal._lazy_import import onnxscript_apis

    original = onnxscript_apis.get_torchlib_ops
    with quick_torchlib_registry():
        assert onnxscript_apis.get_torchlib_ops is torchlib_ops_without_parsing
        registry = _registration.ONNXRegistry.from_torchlib(18)
    assert onnxscript_apis.get_torchlib_ops is original  # restored after the block
    assert registry.is_registered(torch.ops.aten.gelu.default)
    assert registry.is_registered(torch.ops.aten.bitwise_and.Tensor)


def _two_halves(slices_read_one_tensor: bool) -> Any:
    """x -> Relu -> two Slices (first and second half of the last axis) -> Add; the Slices
    read one tensor (what SlicesSplit fuses into a Split) or two."""
    import onnx
    import onnx_ir as ir
    from onnx import TensorProto, helper, numpy_helper

    consts = {"b0": [0], "e0": [4], "b1": [4], "e1": [8], "ax": [-1]}
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["x"], ["n"]),
             helper.make_node("Slice", ["r", "b0", "e0", "ax"], ["lo"]),
             helper.make_node("Slice", ["r" if slices_read_one_tensor else "n", "b1", "e1", "ax"],
                              ["hi"]),
             helper.make_node("Add", ["lo", "hi"], ["y"])]
    graph = helper.make_graph(
        nodes, "halves", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(model))


@pytest.mark.parametrize("one_tensor", [True, False])
def test_anchored_rules_rewrite_what_the_optimizer_rewrites(one_tensor: bool) -> None:
    """With each rule tried only on nodes of its pattern's first output op, the optimizer
    makes the same graph, and each rule's matcher sees only the nodes of that op it saw
    before: SlicesSplit's (two output nodes) the Slice nodes only (it listed the whole graph
    for every node), the single-output rules theirs (they were tried on every node)."""
    import onnxscript.optimizer
    import onnxscript.rewriter

    from trtpack.pytorch.onnxscript_speedups import anchored_rules

    rules = [r for r in onnxscript.rewriter._DEFAULT_REWRITE_RULES
             if getattr(r, "_target_pattern", None) is not None
             and r._target_pattern.output_nodes[0].op_identifier() is not None]
    seen: dict[int, list[str]] = {id(r): [] for r in rules}
    matchers = {id(r): r._matcher for r in rules}

    class Spy:
        def __init__(self, key: int) -> None:
            self.key = key

        def match(self, model: object, graph: object, node: Any,
                  **kwargs: object) -> object:
            seen[self.key].append(node.op_type)
            return matchers[self.key].match(model, graph, node, **kwargs)

    plain, spied, anchored = (_two_halves(one_tensor), _two_halves(one_tensor),
                              _two_halves(one_tensor))
    onnxscript.optimizer.optimize_ir(plain, num_iterations=1)
    for r in rules:
        r._matcher = Spy(id(r))
    try:
        onnxscript.optimizer.optimize_ir(spied, num_iterations=1)
        unanchored = {key: list(ops) for key, ops in seen.items()}
        for ops in seen.values():
            ops.clear()
        with anchored_rules():
            onnxscript.optimizer.optimize_ir(anchored, num_iterations=1)
    finally:
        for r in rules:
            r._matcher = matchers[id(r)]
    assert [n.op_type for n in anchored.graph] == [n.op_type for n in plain.graph]
    (slices_split,) = [r for r in rules if r.name == "SlicesSplit"]
    assert seen[id(slices_split)] == ["Slice", "Slice"]
    for r in rules:
        op = r._target_pattern.output_nodes[0].op_type
        assert seen[id(r)] == [o for o in unanchored[id(r)] if o == op], r.name
    assert sum(map(len, unanchored.values())) > 4 * sum(map(len, seen.values()))
    # and the rules are the library's own again afterwards
    assert all("try_rewrite" not in vars(r) for r in onnxscript.rewriter._DEFAULT_REWRITE_RULES)
