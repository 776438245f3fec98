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
    from trtpack.stages.export import copy_sharing_weights

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
    from trtpack.stages.export import build_cases, copy_sharing_weights, reference_beside, run_torch

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
    from trtpack.stages.export import build_cases, reference_beside

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
    from trtpack.stages.export import LARGEST_BESIDE_WORK, beside_cases, build_cases

    plan, loaded, _ = tiny
    cases, _, _ = build_cases(plan, loaded)
    parameters = sum(p.numel() for p in loaded.module.parameters())
    assert [c.corner for c in beside_cases(cases, parameters)] == ["min", "opt", "max"]
    # the largest corner's work (parameters x its largest input's 4x16 elements) past the line
    over = int(LARGEST_BESIDE_WORK) // 64 + 1
    assert [c.corner for c in beside_cases(cases, over)] == ["min", "opt"]
    assert [c.corner for c in beside_cases(cases, over - 1)] == ["min", "opt", "max"]
