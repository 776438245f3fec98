"""The export stage's exporter beside the smaller corners' PyTorch forwards (issue 47): the
exporter works on a copy that shares the weights, the forwards give the outputs they give
alone, and a forward's failure is the error shown."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from trtpack.errors import UserInputError  # noqa: E402
from trtpack.stages.torch_export import Exported  # noqa: E402

EXPORTED = Exported(exporter="dynamo", fallback="", external_data=False, decomposition="")


@pytest.fixture(scope="module")
def tiny():  # type: ignore[no-untyped-def]
    from trtpack.api import BuildRequest, resolve_options
    from trtpack.pytorch.models import load_model
    from trtpack.stages.export import output_selector

    plan, _ = resolve_options(BuildRequest("tiny-bert", target="cpu",
                                           profiles=["1x4:2x8:4x16"]))
    loaded = load_model(plan.recipe, random_weights=True, seed=plan.seed)
    return plan, loaded, output_selector(loaded.module, plan.recipe)


def test_the_copy_shares_every_tensor_and_no_module(tiny) -> None:  # type: ignore[no-untyped-def]
    from trtpack.stages.reference_pass import copy_sharing_weights

    _, _, wrapper = tiny
    copy = copy_sharing_weights(wrapper)
    assert copy is not None
    originals = dict(wrapper.named_parameters()) | dict(wrapper.named_buffers())
    copied = dict(copy.named_parameters()) | dict(copy.named_buffers())
    assert copied.keys() == originals.keys()
    assert all(copied[name] is originals[name] for name in originals)  # no weight copied
    assert not {id(m) for m in wrapper.modules()} & {id(m) for m in copy.modules()}
    # what torch.export does to the module it traces: the original keeps its weights
    layer = copy.model.encoder.layer[0].attention.self.query
    kept = wrapper.model.encoder.layer[0].attention.self.query.weight
    layer.weight = torch.nn.Parameter(torch.zeros_like(layer.weight))
    assert wrapper.model.encoder.layer[0].attention.self.query.weight is kept
    assert bool(kept.abs().sum() > 0)


def test_the_forwards_beside_the_exporter_give_their_own_outputs(tiny) -> None:  # type: ignore[no-untyped-def]
    from trtpack.stages.export import build_cases
    from trtpack.stages.reference_pass import copy_sharing_weights, reference_beside, run_torch

    plan, loaded, wrapper = tiny
    alone, _, _ = build_cases(plan, loaded)
    run_torch(wrapper, plan.recipe, alone)
    beside, _, _ = build_cases(plan, loaded)
    copy = copy_sharing_weights(wrapper)
    assert copy is not None
    threads = torch.get_num_threads()
    swapped = []

    def export() -> Exported:  # the exporter's part: the copy's weights swapped while it runs
        for name, parameter in list(copy.named_parameters()):
            owner = copy.get_submodule(name.rpartition(".")[0])
            setattr(owner, name.rpartition(".")[2],
                    torch.nn.Parameter(torch.zeros_like(parameter)))
            swapped.append(name)
        return EXPORTED

    assert reference_beside(wrapper, plan.recipe, beside, export) is EXPORTED
    assert swapped and torch.get_num_threads() == threads  # the caller's threads kept
    for a, b in zip(alone, beside, strict=True):
        np.testing.assert_allclose(b.outputs["last_hidden_state"],
                                   a.outputs["last_hidden_state"], rtol=1e-5, atol=1e-5)


def test_a_failing_forward_is_the_error_shown_even_when_the_exporter_fails(tiny) -> None:  # type: ignore[no-untyped-def]
    from trtpack.stages.export import build_cases
    from trtpack.stages.reference_pass import reference_beside

    plan, loaded, wrapper = tiny
    cases, _, _ = build_cases(plan, loaded)
    too_long = {n: np.concatenate([a] * 16, axis=1) for n, a in cases[-1].inputs.items()}
    cases[-1].inputs = too_long  # 256 positions: tiny-bert has 128

    def broken() -> Exported:
        raise RuntimeError("the exporter broke")

    with pytest.raises(UserInputError, match="PyTorch forward fails"):
        reference_beside(wrapper, plan.recipe, cases, broken)
    with pytest.raises(UserInputError, match="PyTorch forward fails"):
        reference_beside(wrapper, plan.recipe, cases, lambda: EXPORTED)
    fine, _, _ = build_cases(plan, loaded)
    with pytest.raises(RuntimeError, match="the exporter broke"):
        reference_beside(wrapper, plan.recipe, fine, broken)


def test_a_small_largest_corner_runs_beside_a_large_one_after(tiny) -> None:  # type: ignore[no-untyped-def]
    from trtpack.stages.export import build_cases
    from trtpack.stages.reference_pass import LARGEST_BESIDE_WORK, beside_cases

    plan, loaded, _ = tiny
    cases, _, _ = build_cases(plan, loaded)
    parameters = sum(p.numel() for p in loaded.module.parameters())
    assert [c.corner for c in beside_cases(cases, parameters)] == ["min", "opt", "max"]
    # the largest corner's work (parameters x its largest input's 4x16 elements) past the line
    over = int(LARGEST_BESIDE_WORK) // 64 + 1
    assert [c.corner for c in beside_cases(cases, over)] == ["min", "opt"]
    assert [c.corner for c in beside_cases(cases, over - 1)] == ["min", "opt", "max"]


def test_a_batch_in_row_pieces_joins_in_row_order_to_the_whole(tiny) -> None:  # type: ignore[no-untyped-def]
    from trtpack.stages.export import build_cases
    from trtpack.stages.reference_pass import RowPieces, run_torch

    plan, loaded, wrapper = tiny
    whole, _, _ = build_cases(plan, loaded)
    run_torch(wrapper, plan.recipe, whole[-1:])
    largest = build_cases(plan, loaded)[0][-1]  # 4x16, rows that differ (padding, tokens)
    pieces = RowPieces(largest, rows=1)
    taken = []
    while (piece := pieces.take()) is not None:
        taken.append(piece)
    assert [start for start, _ in taken] == [0, 1, 2, 3]
    for start, piece in reversed(taken):  # computed out of order, as two threads may
        run_torch(wrapper, plan.recipe, [piece])
        pieces.put(start, piece)
    assert pieces.join()
    joined, alone = largest.outputs["last_hidden_state"], whole[-1].outputs["last_hidden_state"]
    assert joined.shape == alone.shape == (4, 16, 64)
    np.testing.assert_allclose(joined, alone, rtol=1e-5, atol=1e-5)
    # the rows differ from one another: a swapped order would not match
    assert not np.allclose(joined[0], joined[1], atol=1e-3)


def test_row_pieces_refuse_what_is_not_per_row(tiny) -> None:  # type: ignore[no-untyped-def]
    from trtpack.stages.export import build_cases
    from trtpack.stages.reference_pass import PIECE_WORK, RowPieces

    plan, loaded, _ = tiny
    largest = build_cases(plan, loaded)[0][-1]  # 4x16
    # a piece of about PIECE_WORK: parameters x 16 elements per row
    per_row = int(PIECE_WORK // 16)
    split = RowPieces.of(largest, plan.recipe, per_row)
    assert split is not None and split.rows == 1
    assert RowPieces.of(largest, plan.recipe, per_row // 2) is not None
    assert RowPieces.of(largest, plan.recipe, per_row // 2).rows == 2  # type: ignore[union-attr]
    assert RowPieces.of(largest, plan.recipe, per_row // 4) is None  # one piece: no split
    no_batch = plan.recipe.model_copy(update={"outputs": [
        o.model_copy(update={"axes": ["sequence", 64]}) for o in plan.recipe.outputs]})
    assert RowPieces.of(largest, no_batch, per_row) is None
    # outputs that do not keep the pieces' rows first do not join; nothing is set
    pieces = RowPieces(largest, rows=2)
    while (taken := pieces.take()) is not None:
        start, piece = taken
        piece.outputs = {"last_hidden_state": np.zeros((16, 64), np.float32)}
        pieces.put(start, piece)
    assert not pieces.join() and largest.outputs == {}


def test_the_largest_corner_in_pieces_beside_the_exporter_and_after_it(tiny) -> None:  # type: ignore[no-untyped-def]
    import threading

    from trtpack.stages.export import build_cases
    from trtpack.stages.reference_pass import RowPieces, reference_beside, run_torch

    plan, loaded, wrapper = tiny
    alone, _, _ = build_cases(plan, loaded)
    run_torch(wrapper, plan.recipe, alone)
    cases, _, _ = build_cases(plan, loaded)
    largest = cases[-1]
    pieces = RowPieces(largest, rows=1)
    threads = torch.get_num_threads()
    beside_took, after_took = threading.Event(), threading.Event()
    taken_by: list[tuple[bool, int, str]] = []  # (by the forwards' thread, first row, shapes)
    take = pieces.take

    def recording_take(rows: int | None = None):  # type: ignore[no-untyped-def]
        taken = take(rows)
        beside = threading.current_thread().name.startswith("trtpack-reference")
        if taken is not None:
            taken_by.append((beside, taken[0], taken[1].shapes))
            # the forwards' thread holds its first piece until this thread has taken one
            if beside and not beside_took.is_set():
                beside_took.set()
                assert after_took.wait(60)
            if not beside:
                after_took.set()
        return taken

    pieces.take = recording_take  # type: ignore[method-assign]

    def export() -> Exported:  # the exporter runs until the forwards' thread took a piece
        assert beside_took.wait(60)
        return EXPORTED

    assert reference_beside(wrapper, plan.recipe, cases[:-1], export, pieces) is EXPORTED
    assert torch.get_num_threads() == threads
    assert [start for beside, start, _ in taken_by if beside] == [0], taken_by
    after = [(start, shapes) for beside, start, shapes in taken_by if not beside]
    assert after[0][0] == 1  # the next piece, taken while the forwards' thread still ran
    # the last of them the rest of the rows, as one forward
    assert after[-1][1].startswith(f"input_ids={4 - after[-1][0]}x16"), taken_by
    for a, b in zip(alone, cases, strict=True):
        np.testing.assert_allclose(b.outputs["last_hidden_state"],
                                   a.outputs["last_hidden_state"], rtol=1e-5, atol=1e-5)
