"""The ensemble of a ``--serve text`` repository: TEXT -> tokenizer -> model -> postprocess.

    <name>_tokenizer    Python backend (``tokenizer_model``): TEXT -> the model's token inputs
    <name>_postprocess  Python backend (``postprocess``), when the task has one
    <name>_ensemble     platform "ensemble": the steps below, wired by tensor name

Every dims list leaves the batch dimension out when ``max_batch_size > 0``.
``check_ensemble`` proves the wiring from the written ``config.pbtxt`` files alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trtpack.model_io import TRITON_TO_NUMPY, ModelIO
from trtpack.serving.config import CONFIG_FILE, model_config, read_config
from trtpack.serving.postprocess import Postprocessing
from trtpack.serving.tokenizer_model import TEXT_INPUT, TokenField
from trtpack.shapes import ShapeProfile
from trtpack.sources.recipe import TritonSettings

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig


@dataclass
class EnsembleStep:
    model: str
    input_map: dict[str, str] = field(default_factory=dict)  # member input -> ensemble tensor
    output_map: dict[str, str] = field(default_factory=dict)  # member output -> ensemble tensor


def text_ensemble_steps(tokenizer: str, model: str, model_io: ModelIO,
                        fields: Mapping[str, TokenField], post: str | None,
                        postprocessing: Postprocessing | None) -> list[EnsembleStep]:
    """Tensors keep their member names inside the ensemble (TEXT, input_ids, ...). With a
    post-processing step, the model step maps only the output that step reads: Triton
    refuses an ensemble tensor that no step consumes and that is not an ensemble output
    (``check_ensemble``)."""
    outputs = [postprocessing.values] if post is not None and postprocessing is not None \
        else model_io.outputs
    steps = [
        EnsembleStep(tokenizer, {TEXT_INPUT: TEXT_INPUT}, {n: n for n in fields}),
        EnsembleStep(model, {t.name: t.name for t in model_io.inputs},
                     {t.name: t.name for t in outputs}),
    ]
    if post is not None and postprocessing is not None:
        values, mask = postprocessing.values, postprocessing.mask
        inputs = [values] if mask is None else [values, mask]
        steps.append(EnsembleStep(post, {t.name: t.name for t in inputs},
                                  {n: n for n in postprocessing.output_names}))
    return steps


def ensemble_config(name: str, io: ModelIO, profiles: Sequence[ShapeProfile],
                    settings: TritonSettings, steps: Sequence[EnsembleStep]) -> ModelConfig:
    # instance groups, batching and version policy belong to the members
    config = model_config(name, io, profiles, TritonSettings.model_validate(
        {"response_cache": settings.response_cache}))
    config.platform = "ensemble"
    config.ClearField("instance_group")
    config.ClearField("dynamic_batching")
    config.ClearField("version_policy")
    for step in steps:
        s = config.ensemble_scheduling.step.add(model_name=step.model, model_version=-1)
        for k, v in step.input_map.items():
            s.input_map[k] = v
        for k, v in step.output_map.items():
            s.output_map[k] = v
    return config


def _tensors(config: ModelConfig, section: str) -> dict[str, tuple[str, list[int]]]:
    """name -> (numpy dtype, full dims with -1 for the batch when batched)."""
    from tritonclient.grpc import model_config_pb2 as pb

    lead = [-1] if config.max_batch_size > 0 else []
    return {
        t.name: (TRITON_TO_NUMPY.get(pb.DataType.Name(t.data_type), "?"), lead + list(t.dims))
        for t in getattr(config, section)
    }


def _dims_agree(a: list[int], b: list[int]) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


def check_ensemble(repository: Path, name: str) -> list[str]:
    """Wiring problems of an ensemble, read from the config.pbtxt files (empty when sound).

    Checks each member exists and its max_batch_size covers the ensemble's, every mapped
    name is a real input/output of the member, every tensor is produced once before it is
    read, producer and consumer agree on type and dims, and every tensor is read by a step
    or is an ensemble output: Triton core's ``ValidateEnsembleSchedulingConfig``
    (``src/model_config_utils.cc``, "Check redundant ensemble tensors", line 275 at
    73aad7c) fails the load with "ensemble tensor 'X' is unused in ensemble 'Y'".
    """
    config = read_config(repository / name / CONFIG_FILE)
    problems: list[str] = []
    if config.platform != "ensemble":
        return [f"{name}: platform is '{config.platform}', not 'ensemble'"]
    # ensemble tensor -> (dtype, dims, who produced it)
    known: dict[str, tuple[str, list[int], str]] = {
        n: (d, dims, "ensemble input") for n, (d, dims) in _tensors(config, "input").items()
    }
    read = {tensor for step in config.ensemble_scheduling.step
            for tensor in step.input_map.values()}
    for step in config.ensemble_scheduling.step:
        member_path = repository / step.model_name / CONFIG_FILE
        if not member_path.is_file():
            problems.append(f"{name}: step model '{step.model_name}' is not in the repository")
            continue
        member = read_config(member_path)
        if config.max_batch_size > 0 and member.max_batch_size < config.max_batch_size:
            problems.append(f"{name}: member '{step.model_name}' max_batch_size "
                            f"{member.max_batch_size} < the ensemble's {config.max_batch_size}")
        m_in, m_out = _tensors(member, "input"), _tensors(member, "output")
        for member_input, tensor in step.input_map.items():
            if member_input not in m_in:
                problems.append(f"{name}: '{step.model_name}' has no input '{member_input}'")
            elif tensor not in known:
                problems.append(f"{name}: '{step.model_name}' reads '{tensor}' before any step "
                                "produces it")
            else:
                want, have = m_in[member_input], known[tensor]
                if want[0] != have[0] or not _dims_agree(want[1], have[1]):
                    problems.append(
                        f"{name}: '{tensor}' from {have[2]} is {have[0]} {have[1]}, but "
                        f"'{step.model_name}' input '{member_input}' takes {want[0]} {want[1]}"
                    )
        missing = sorted(set(m_in) - set(step.input_map))
        for m in missing:
            problems.append(f"{name}: '{step.model_name}' input '{m}' is not mapped")
        for member_output, tensor in step.output_map.items():
            if member_output not in m_out:
                problems.append(f"{name}: '{step.model_name}' has no output '{member_output}'")
                continue
            if tensor in known:
                problems.append(f"{name}: '{tensor}' is produced twice")
            known[tensor] = (*m_out[member_output], f"'{step.model_name}'")
    declared_outputs = _tensors(config, "output")
    for tensor in sorted(set(known) - read - set(declared_outputs)):
        problems.append(f"{name}: ensemble tensor '{tensor}' is unused in ensemble '{name}' "
                        "(no step reads it and it is not an ensemble output)")
    for out_name, (dtype, dims) in declared_outputs.items():
        if out_name not in known:
            problems.append(f"{name}: output '{out_name}' is produced by no step")
        elif known[out_name][0] != dtype or not _dims_agree(known[out_name][1], dims):
            have = known[out_name]
            problems.append(f"{name}: output '{out_name}' is declared {dtype} {dims} but "
                            f"{have[2]} gives {have[0]} {have[1]}")
    return problems
