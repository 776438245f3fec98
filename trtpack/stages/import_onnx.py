"""Import (instead of export, for ``source: {onnx: ...}``): take the user's ONNX as it is.

The model is written as ``model.onnx`` + ``model.onnx.data`` (its external weights copied
one tensor at a time, whatever their file names, so a model over 2 GB never passes through
protobuf), with the recipe's axis names on its inputs and outputs (unnamed dynamic dims
become ``dim_K``). The reference cases are realistic inputs at every profile corner and the
outputs of that FP32 ONNX in ONNX Runtime: it is what the simplified model, the precision
variant and the engine are compared with.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from trtpack.cases import Case, save_cases, with_outputs
from trtpack.errors import UserInputError, first_line
from trtpack.onnx_tools.files import (
    LARGE_INITIALIZER_BYTES,
    data_path,
    graph_summary,
    placed_tensors,
)
from trtpack.onnx_tools.vocab import vocab_from_graph
from trtpack.options import BuildPlan
from trtpack.report import JsonObject
from trtpack.sources.tokenizer_files import has_tokenizer, tokenizer_files
from trtpack.stages.artifacts import Artifacts
from trtpack.stages.base import StageContext, StageMetrics, StageOutcome
from trtpack.verify.sample_files import SampleInputs, file_state
from trtpack.verify.samples import fed_values_text, make_inputs

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class ImportMetrics(StageMetrics):
    source: str  # the user's ONNX file
    nodes: int
    opset: int | None
    external_data: bool
    cases: int
    vocab_size: int | None
    reference: str  # what the later stages are compared with
    op_types: dict[str, int]
    sample_inputs: str | None = None  # where --sample-inputs' samples were fed, or None


def source_path(plan: BuildPlan) -> Path:
    assert plan.recipe.source.onnx is not None
    return Path(plan.recipe.source.onnx).expanduser()


def tokenizer_folder(plan: BuildPlan) -> Path:
    """Where the ONNX's tokenizer is: the recipe's ``tokenizer_source`` (``--tokenizer``),
    else beside the ONNX."""
    source = plan.recipe.tokenizer_source
    if source is not None and source.path:
        return Path(source.path).expanduser()
    return source_path(plan).parent


def _file_state(path: Path) -> list[str | int]:
    return [path.name, path.stat().st_size, int(path.stat().st_mtime)] if path.is_file() else []


def fingerprint(plan: BuildPlan) -> JsonObject:
    r = plan.recipe
    src = source_path(plan)
    files = [_file_state(src)] + [_file_state(p) for p in sorted(src.parent.iterdir())
                                  if p.is_file() and p != src and p.suffix != ".onnx"]
    return {
        "source": str(src.resolve()), "files": files, "task": r.task,
        "inputs": [i.model_dump() for i in r.inputs],
        "outputs": [o.model_dump() for o in r.outputs],
        "tokenizer": r.tokenizer, "vocab_size": r.vocab_size,
        "tokenizer_files": [_file_state(p) for p in tokenizer_files(tokenizer_folder(plan))],
        "profiles": [p.to_dict() for p in plan.profiles], "seed": plan.seed,
        "sample_inputs": file_state(plan.sample_inputs),
    }


def copy_model(src: Path, dst: Path, axes: dict[str, list[str | int]]) -> bool:
    """``src`` as ``dst`` with every external or large weight in ``dst.data``, copied tensor
    by tensor; the I/O dims named as in ``axes``. True when ``dst.data`` was written."""
    import io

    import onnx

    model = onnx.load(str(src), load_external_data=False)
    sidecar = data_path(dst)
    offset = 0
    with open(sidecar, "wb") as out:
        for t, in_body in placed_tensors(model.graph):  # If/Loop bodies' included
            if in_body:
                # a body's weights stay inline: ONNX Runtime refuses a body's external
                # data file when it has several hard links, as the stage cache's do
                if t.data_location == onnx.TensorProto.EXTERNAL:
                    info = {e.key: e.value for e in t.external_data}
                    inline = io.BytesIO()
                    _copy_range(src.parent / info["location"], int(info.get("offset", 0) or 0),
                                int(info["length"]) if info.get("length") else None, inline)
                    del t.external_data[:]
                    t.data_location = onnx.TensorProto.DEFAULT
                    t.raw_data = inline.getvalue()
                continue
            pad = (-offset) % 4096  # aligned like onnx's own writer
            if t.data_location == onnx.TensorProto.EXTERNAL:
                info = {e.key: e.value for e in t.external_data}
                out.write(b"\0" * pad)
                length = _copy_range(src.parent / info["location"],
                                     int(info.get("offset", 0) or 0),
                                     int(info["length"]) if info.get("length") else None, out)
            elif t.HasField("raw_data") and len(t.raw_data) >= LARGE_INITIALIZER_BYTES:
                out.write(b"\0" * pad)
                out.write(t.raw_data)
                length = len(t.raw_data)
            else:
                continue
            offset += pad
            t.ClearField("raw_data")
            del t.external_data[:]
            for key, text in (("location", sidecar.name), ("offset", str(offset)),
                               ("length", str(length))):
                entry = t.external_data.add()
                entry.key, entry.value = key, text
            t.data_location = onnx.TensorProto.EXTERNAL
            offset += length
    for value in (*model.graph.input, *model.graph.output):
        names = axes.get(value.name)
        if names is None:
            continue
        for dim, name in zip(value.type.tensor_type.shape.dim, names, strict=False):
            if isinstance(name, str):
                dim.dim_param = name
    onnx.save(model, str(dst))
    if offset == 0:
        sidecar.unlink()
        return False
    return True


def _copy_range(path: Path, start: int, length: int | None, out: BinaryIO,
                chunk: int = 64 << 20) -> int:
    """Copy ``length`` bytes (to the end when None) of ``path`` from ``start`` to ``out``, in
    chunks: a weight of several GB never sits in memory whole."""
    copied = 0
    with open(path, "rb") as f:
        f.seek(start)
        while length is None or copied < length:
            block = f.read(chunk if length is None else min(chunk, length - copied))
            if not block:
                break
            out.write(block)
            copied += len(block)
    if length is not None and copied != length:
        raise UserInputError(f"external data {path.name} ends before the tensor it holds")
    return copied


# Ops between an int8 (or any) weight initializer and the float table a Gather reads:
# weight-only quantization writes Cast/Mul or DequantizeLinear in front of the embedding.
def _tokenizer(folder: Path, stage_dir: Path) -> tuple[PreTrainedTokenizerBase, Path | None]:
    files = tokenizer_files(folder)
    if not has_tokenizer(folder):
        raise UserInputError(f"recipe says tokenizer: true but there are no tokenizer files "
                             f"in {folder} (give one with --tokenizer PATH)")
    target = stage_dir / "tokenizer"
    target.mkdir()
    for f in files:
        shutil.copyfile(f, target / f.name)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(target))
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, target


def run(ctx: StageContext) -> StageOutcome:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import numpy as np

    from trtpack.runtimes.onnxruntime import cpu_session, few_runs_prepacked, run_session

    plan = ctx.plan
    recipe = plan.recipe
    src = source_path(plan)
    ctx.progress(f"importing {src.name}")
    onnx_path = ctx.stage_dir / "model.onnx"
    axes = {i.name: list(i.axes) for i in recipe.inputs}
    axes.update({o.name: list(o.axes) for o in recipe.outputs})
    external = copy_model(src, onnx_path, axes)
    tokenizer = tok_dir = config_path = None
    if recipe.tokenizer:
        tokenizer, tok_dir = _tokenizer(tokenizer_folder(plan), ctx.stage_dir)
    if (src.parent / "config.json").is_file():
        config_path = ctx.stage_dir / "config.json"
        shutil.copyfile(src.parent / "config.json", config_path)
    token_input = recipe.input_name("token_ids")
    warnings: list[str] = []
    vocab = recipe.vocab_size or (len(tokenizer) if tokenizer is not None else None)
    if vocab is None and token_input is not None:
        vocab = vocab_from_graph(onnx_path, token_input)
        if vocab is None:
            vocab = 100
            warnings.append(f"token ids for '{token_input}' are drawn from [0, 100): give the "
                            "vocabulary size with --set vocab_size=N, or a tokenizer beside "
                            "the ONNX")
    specs = recipe.input_specs()
    samples = SampleInputs.of(plan, vocab)
    cases: list[Case] = []
    for index, profile in enumerate(plan.profiles):
        for k, (corner, shapes) in enumerate(profile.corners()):
            inputs = make_inputs(specs, shapes, tokenizer=tokenizer, vocab_size=vocab or 30522,
                                 seed=plan.seed + 10 * index + k, offset=5 * k + index,
                                 values=recipe.value_rules())
            if not samples.use(inputs, shapes):
                samples.unfitted.append(f"profile {index} {corner}")
            cases.append(Case(index, corner, inputs))
    warnings += samples.warnings()
    samples_fed = samples.trace(plan.sample_inputs, len(cases))
    dependent = [o.name for o in recipe.outputs if o.metric == "data_dependent"]
    if dependent:
        warnings.append(
            f"{', '.join(repr(n) for n in dependent)}: a shape that depends on the data "
            "(NonZero, NonMaxSuppression, Unique or Compress upstream): compared per sample "
            "where the candidate's shape equals the reference's, reported 'not verified' "
            "where it does not")
    ctx.progress(f"the FP32 ONNX in ONNX Runtime on {len(cases)} cases (the reference)")
    try:  # packed as the verify stage's session of the same cases (an FP32 import is exact)
        session = cpu_session(onnx_path, few_runs=True,
                              prepacked=few_runs_prepacked(c.inputs for c in cases))
    except Exception as e:  # onnxruntime's own errors: the model does not load
        first = first_line(e)
        raise UserInputError(f"ONNX Runtime cannot load {src.name}: {first}") from None
    outputs: list[dict[str, np.ndarray]] = []
    for case in cases:
        try:
            outputs.extend({k: np.asarray(v) for k, v in out.items()}
                           for out in run_session(session, [case.inputs]))
        except Exception as e:  # onnxruntime's own errors: the model does not run as given
            first = first_line(e)
            raise UserInputError(
                f"ONNX Runtime cannot run {src.name} on what trtpack fed it at the "
                f"{case.corner} corner ({fed_values_text(case.inputs, recipe.value_rules())}):"
                f" {first}", hint="give an input its values with --input NAME=VALUE or "
                "NAME=LOW..HIGH, or real samples; the shapes with --profile") from None
    reference = ctx.stage_dir / "reference.npz"
    save_cases(reference, with_outputs(cases, outputs))
    summary = graph_summary(onnx_path)
    return StageOutcome(
        artifacts=Artifacts(onnx=onnx_path, reference=reference, tokenizer=tok_dir,
                            model_config=config_path),
        metrics=ImportMetrics(
            source=str(src), nodes=summary["nodes"], opset=summary["opset"],
            external_data=external, cases=len(cases), vocab_size=vocab,
            reference="the input ONNX (FP32) in ONNX Runtime", op_types=summary["op_types"],
            sample_inputs=samples_fed),
        warnings=warnings,
        message=f"{src.name}: {summary['nodes']} nodes, opset {summary['opset']}, reference "
                "= the input ONNX in ONNX Runtime (no export)"
                + (f", {samples_fed}" if samples_fed else ""),
    )
