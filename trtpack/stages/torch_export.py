"""The export's ONNX writing: the recipe's exporter on the PyTorch module (the dynamo
exporter streams the weights to ``model.onnx.data`` instead of building one protobuf with
them; figures: benchmarks/README.md), with the recipe's input/output names, its dynamic
axes named as in the recipe and the pinned opset; when the dynamo exporter fails, the
TorchScript one (as Hugging Face Optimum does). ``trtpack.stages.export`` runs it."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from trtpack.errors import TrtpackError
from trtpack.onnx_tools.files import DATA_SUFFIX, data_path, move_model, resave_with_sidecar
from trtpack.options import BuildPlan
from trtpack.pytorch.onnx_export import (
    Decomposition,
    exporter_failure,
    promotion_only_where_needed,
    save_program,
    skip_needless_decomposition,
    torch_logs_to,
    without_stack_traces,
)
from trtpack.pytorch.onnxscript_speedups import optimize_program, quick_torchlib_registry
from trtpack.verify.samples import make_inputs

if TYPE_CHECKING:
    import torch
    from torch.export import Dim


def _example_inputs(plan: BuildPlan) -> dict[str, np.ndarray]:
    """Example shapes for tracing: the opt shape, with dynamic sizes of 1 raised to 2 where
    the profile allows (an example size of 1 gets specialized away by the exporter)."""
    profile = plan.profiles[0]
    shapes = {}
    for spec in plan.recipe.input_specs():
        r = profile.shapes[spec.name]
        shapes[spec.name] = tuple(
            2 if isinstance(axis, str) and r.opt[d] == 1 and r.max[d] >= 2 else r.opt[d]
            for d, axis in enumerate(spec.axes)
        )
    vocab = min(plan.recipe.vocab_size or 1000, 1000)
    return make_inputs(plan.recipe.input_specs(), shapes, vocab_size=vocab, seed=1234,
                       values=plan.recipe.value_rules())


@dataclass
class Exported:
    """What ``export_onnx`` did: which exporter wrote the model, and why."""

    exporter: str  # "dynamo" or "legacy" (TorchScript)
    fallback: str  # why the dynamo exporter's model was not used ("" when it was)
    external_data: bool
    decomposition: str


def export_onnx(wrapper: torch.nn.Module, plan: BuildPlan, path: Path,
                log: logging.Logger, saved: torch.nn.Module | None = None) -> Exported:
    """Export with the recipe's exporter. When the dynamo exporter fails, retry with the
    TorchScript exporter (``dynamo=False``, as Hugging Face Optimum does); the verify stage
    checks either model against PyTorch at every profile corner. A TorchScript source always
    goes through the TorchScript exporter, traced with its state folded from ``saved`` (an
    untouched copy of ``wrapper``: ``trtpack.pytorch.torchscript``)."""
    import torch

    recipe = plan.recipe
    input_names = [i.name for i in recipe.inputs]
    output_names = [o.name for o in recipe.outputs]
    input_axes = {a for i in recipe.inputs for a in i.axes if isinstance(a, str)}
    dynamic_axes: dict[str, dict[int, str]] = {}
    for spec in recipe.inputs:
        dynamic_axes[spec.name] = {d: a for d, a in enumerate(spec.axes) if isinstance(a, str)}
    for out in recipe.outputs:
        dynamic_axes[out.name] = {d: a for d, a in enumerate(out.axes)
                                  if isinstance(a, str) and a in input_axes}
    example = _example_inputs(plan)
    args = tuple(torch.from_numpy(example[n]) for n in input_names)
    scratch = path.parent / "export-tmp"
    scratch.mkdir()
    captured = io.StringIO()
    exporter, fallback = ("legacy" if saved is not None else recipe.exporter), ""
    with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured), \
            warnings.catch_warnings(), torch_logs_to(log):
        warnings.simplefilter("ignore")
        decomposition = Decomposition(reason="legacy exporter")
        if exporter == "dynamo":
            try:
                with skip_needless_decomposition() as decomposition, \
                        quick_torchlib_registry(), promotion_only_where_needed(), \
                        without_stack_traces():
                    program = torch.onnx.export(
                        wrapper, args, input_names=input_names, output_names=output_names,
                        opset_version=plan.opset, dynamo=True, optimize=False,
                        dynamic_shapes=(_dynamic_shapes(plan),))  # forward(*args)
                assert program is not None  # the dynamo exporter returns its program
                optimize_program(program.model)
                save_program(program, scratch / path.name)
            except (TrtpackError, MemoryError):
                raise  # the user's to fix; and the TorchScript exporter needs more memory
            except Exception as e:  # any failure of the exporter: the other one may work
                log.warning("the dynamo exporter failed; retrying with the TorchScript "
                            "exporter (dynamo=False)", exc_info=True)
                fallback = f"the dynamo exporter failed ({exporter_failure(e)})"
                exporter = "legacy"
                decomposition = Decomposition(reason="legacy exporter (fallback)")
                shutil.rmtree(scratch)
                scratch.mkdir()
        if exporter == "legacy":
            if saved is not None:
                from trtpack.pytorch.torchscript import traced_for_export

                wrapper = traced_for_export(wrapper, saved, args)
            torch.onnx.export(wrapper, args, str(scratch / path.name), input_names=input_names,
                              output_names=output_names, dynamic_axes=dynamic_axes,
                              opset_version=plan.opset, dynamo=False)
    log.info("torch.onnx.export output:\n%s", captured.getvalue())
    place_onnx(scratch / path.name, path)
    shutil.rmtree(scratch)
    log.info("decomposition re-trace %s", decomposition.summary())
    return Exported(exporter=exporter, fallback=fallback,
                    external_data=data_path(path).is_file(),
                    decomposition=decomposition.summary())


def _dynamic_shapes(plan: BuildPlan) -> tuple[dict[int, Dim], ...]:
    """torch.export dims, one per axis name (shared by the inputs that have it), bounded by
    the largest profile max, so the exported graph names its dynamic axes as the recipe."""
    from torch.export import Dim

    dims: dict[str, Dim] = {}
    for spec in plan.recipe.input_specs():
        for d, axis in spec.dynamic_axes.items():
            if axis not in dims:
                top = max(p.shapes[spec.name].max[d] for p in plan.profiles)
                dims[axis] = Dim(axis, min=1, max=max(top, 2))
    return tuple(
        {d: dims[axis] for d, axis in spec.dynamic_axes.items()}
        for spec in plan.recipe.input_specs()
    )


def place_onnx(src: Path, dst: Path) -> None:
    """Move an exported model to ``dst``: one file, or ``dst`` + ``dst.data`` when its weights
    are external (exporters may write one file per tensor; those are gathered into one)."""
    written = {p.name for p in src.parent.iterdir()}
    if written == {src.name}:
        os.replace(src, dst)
    elif written == {src.name, src.name + DATA_SUFFIX} and src.name == dst.name:
        move_model(src, dst)
    else:
        resave_with_sidecar(src, dst)
