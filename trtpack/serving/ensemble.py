"""Text in, answers out: the tokenizer and post-processing Python models and the ensemble.

A ``--serve text`` repository holds, beside the model itself:

    <name>_tokenizer    Python backend: TEXT (strings) -> the model's token inputs, padded and
                        truncated to the sequence range of the shape profiles
    <name>_postprocess  Python backend, from the recipe's task: mean pooling + L2 norm
                        (feature-extraction), softmax + label names (sequence-classification),
                        the top label of every token (token-classification), the top-1
                        token at every position (fill-mask)
    <name>_ensemble     platform "ensemble": TEXT -> tokenizer -> model -> postprocess

Every tensor's type and dims come from the model's real I/O (``ModelIO``), so the tokenizer
emits exactly the integer type the model takes (INT64 or INT32) and every dims list leaves
the batch dimension out when ``max_batch_size > 0``. ``check_ensemble`` proves the wiring
from the written ``config.pbtxt`` files alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trtpack.errors import UserInputError
from trtpack.recipe import Recipe, TritonSettings
from trtpack.serving.config import (
    TRITON_TO_NUMPY,
    ModelIO,
    TensorIO,
    model_config,
    read_config,
)
from trtpack.shapes import ShapeProfile

TEXT_INPUT = "TEXT"
EMBEDDING_OUTPUT = "embedding"
PROBABILITIES_OUTPUT = "probabilities"
LABEL_OUTPUT = "label"
LABELS_FILE = "labels.json"
TOKENIZER_FOLDER = "tokenizer"
TEMPLATES_DIR = Path(__file__).parent / "templates"

TokenField = Literal["ids", "attention_mask", "type_ids"]
KIND_TO_FIELD: dict[str, TokenField] = {
    "token_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids",
}
PostprocessMode = Literal["mean_pooling", "normalize", "softmax", "token_argmax"]
TOKENS_OUTPUT = "tokens"  # fill-mask: the top-1 token at every position
TOKEN_LABELS_OUTPUT = "labels"  # token classification: the top label of every token


def _python_settings(settings: TritonSettings) -> TritonSettings:
    """Python helpers: the instance count and version policy, no cache, graphs or warmup."""
    return settings.model_copy(update={"response_cache": False, "cuda_graphs": False,
                                       "warmup": False})


def _set_parameters(config: Any, params: Mapping[str, str]) -> None:
    for key, value in params.items():
        config.parameters[key].string_value = value


def _python_model_config(name: str, io: ModelIO, profiles: Sequence[ShapeProfile],
                         settings: TritonSettings, params: Mapping[str, str]) -> Any:
    config = model_config(name, io, profiles, _python_settings(settings), backend="python",
                          kind="KIND_CPU")
    # Python models get one request per input tensor; queueing them only adds latency.
    config.ClearField("dynamic_batching")
    _set_parameters(config, params)
    return config


# --- tokenizer ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SequenceRange:
    min: int
    max: int


def token_fields(recipe: Recipe, io: ModelIO) -> dict[str, TokenField]:
    """Model input name -> tokenizer field; a clear error for inputs text cannot give."""
    kinds = {i.name: i.kind for i in recipe.inputs}
    fields: dict[str, TokenField] = {}
    for t in io.inputs:
        kind = kinds.get(t.name, "generic")
        if kind not in KIND_TO_FIELD:
            raise UserInputError(
                f"--serve text: input '{t.name}' of model '{recipe.name}' is of kind '{kind}'; "
                "a tokenizer can only produce token_ids, attention_mask and token_type_ids"
            )
        if t.dtype not in ("int64", "int32"):
            raise UserInputError(
                f"--serve text: input '{t.name}' has dtype {t.dtype}; token inputs must be "
                "int64 or int32"
            )
        fields[t.name] = KIND_TO_FIELD[kind]
    if "ids" not in fields.values():
        raise UserInputError(f"--serve text: model '{recipe.name}' has no token_ids input")
    return fields


def sequence_range(fields: Mapping[str, TokenField], profiles: Sequence[ShapeProfile],
                   model_max_length: int | None = None) -> SequenceRange:
    """The sequence lengths every profile accepts: from the token ids input's axis 1."""
    ids_input = next(name for name, f in fields.items() if f == "ids")
    lows, highs = [], []
    for p in profiles:
        r = p.shapes.get(ids_input)
        if r is None or len(r.min) < 2:
            raise UserInputError(
                f"--serve text: the profiles give no [batch, sequence] shape for '{ids_input}'"
            )
        lows.append(r.min[-1])
        highs.append(r.max[-1])
    low, high = min(lows), max(highs)
    if model_max_length is not None and 0 < model_max_length < high:
        high = model_max_length
    if low > high:
        raise UserInputError(
            f"--serve text: the profiles' shortest sequence ({low}) is longer than the "
            f"tokenizer's model_max_length ({high})"
        )
    return SequenceRange(low, high)


def tokenizer_io(model_io: ModelIO, fields: Mapping[str, TokenField]) -> ModelIO:
    batched = model_io.all_batched
    text_shape = (-1, 1) if batched else (-1,)
    outputs = []
    for t in model_io.inputs:
        if t.name in fields:
            outputs.append(TensorIO(t.name, t.dtype, (-1, -1), batched))
    return ModelIO((TensorIO(TEXT_INPUT, "bytes", text_shape, batched),), tuple(outputs))


def tokenizer_config(name: str, model_io: ModelIO, fields: Mapping[str, TokenField],
                     profiles: Sequence[ShapeProfile], settings: TritonSettings,
                     seq: SequenceRange, pad_id: int, padding_side: str = "right",
                     truncation_side: str = "right") -> Any:
    for side in (padding_side, truncation_side):
        if side not in ("left", "right"):
            raise UserInputError(f"tokenizer padding/truncation side '{side}' is not left/right")
    max_texts = min(p.axis_range(0)[2] for p in profiles)
    params = {
        "max_texts": str(max_texts),
        "padding_side": padding_side,
        "truncation_side": truncation_side,
        "tokenizer_file": f"{TOKENIZER_FOLDER}/tokenizer.json",
        "min_sequence": str(seq.min),
        "max_sequence": str(seq.max),
        "pad_id": str(pad_id),
        "text_input": TEXT_INPUT,
        "outputs": json.dumps(dict(fields)),
    }
    return _python_model_config(name, tokenizer_io(model_io, fields), profiles, settings,
                                params)


# --- post-processing ------------------------------------------------------------------------


@dataclass(frozen=True)
class PostprocessPlan:
    """What the post-processing model does: its mode, the tensors it reads and writes."""

    mode: PostprocessMode
    values: TensorIO
    mask: TensorIO | None
    outputs: tuple[TensorIO, ...]
    labels: tuple[str, ...] = ()

    def io(self) -> ModelIO:
        inputs = (self.values,) if self.mask is None else (self.values, self.mask)
        return ModelIO(inputs, self.outputs)

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]


def labels_from_config(model_config_json: Path | None, count: int) -> tuple[str, ...]:
    """Label names from a config.json's id2label (``LABEL_i`` where it has none)."""
    id2label: dict[str, str] = {}
    if model_config_json is not None and model_config_json.is_file():
        try:
            data = json.loads(model_config_json.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise UserInputError(f"cannot read {model_config_json}: {e}") from None
        id2label = {str(k): str(v) for k, v in (data.get("id2label") or {}).items()}
    return tuple(id2label.get(str(i), f"LABEL_{i}") for i in range(count))


def vocabulary(tokenizer_dir: Path | None) -> tuple[str, ...]:
    """The tokenizer's tokens by id (tokenizer.json, else vocab.txt, else vocab.json)."""
    if tokenizer_dir is not None and (tokenizer_dir / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        vocab = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab(True)
        tokens = [""] * (max(vocab.values()) + 1)
        for token, index in vocab.items():
            tokens[index] = token
        return tuple(tokens)
    if tokenizer_dir is not None and (tokenizer_dir / "vocab.txt").is_file():
        return tuple((tokenizer_dir / "vocab.txt").read_text(encoding="utf-8").splitlines())
    if tokenizer_dir is not None and (tokenizer_dir / "vocab.json").is_file():  # GPT-2 style
        by_token = json.loads((tokenizer_dir / "vocab.json").read_text(encoding="utf-8"))
        tokens = [""] * (max(by_token.values()) + 1)
        for token, index in by_token.items():
            tokens[index] = token
        return tuple(tokens)
    raise UserInputError(f"--serve text: no tokenizer.json, vocab.txt or vocab.json in "
                         f"{tokenizer_dir} to name the predicted tokens")


def _token_argmax(values: TensorIO, batched: bool, output: str, names: Sequence[str]
                  ) -> PostprocessPlan:
    if len(values.shape) != 3:
        raise UserInputError(f"--serve text: output '{values.name}' has shape "
                             f"{list(values.shape)}; expected [batch, sequence, classes]")
    if values.shape[-1] > 0 and len(names) < values.shape[-1]:
        names = [*names, *(f"<{i}>" for i in range(len(names), values.shape[-1]))]
    return PostprocessPlan("token_argmax", values, None,
                           (TensorIO(output, "bytes", (-1, -1), batched),), tuple(names))


def postprocess_plan(recipe: Recipe, model_io: ModelIO, fields: Mapping[str, TokenField],
                     model_config_json: Path | None, tokenizer_dir: Path | None = None
                     ) -> PostprocessPlan | None:
    """The post-processing the task calls for, or None (the ensemble returns raw outputs)."""
    if not model_io.outputs:
        return None
    values = model_io.outputs[0]
    batched = model_io.all_batched
    if recipe.task == "token-classification":
        return _token_argmax(values, batched, TOKEN_LABELS_OUTPUT,
                             labels_from_config(model_config_json, values.shape[-1]))
    if recipe.task == "fill-mask":
        return _token_argmax(values, batched, TOKENS_OUTPUT, vocabulary(tokenizer_dir))
    if recipe.task in ("feature-extraction", "sentence-embedding"):
        hidden = values.shape[-1]
        out = TensorIO(EMBEDDING_OUTPUT, "float32", (-1, hidden), batched)
        if len(values.shape) == 3:
            mask_name = next((n for n, f in fields.items() if f == "attention_mask"), None)
            if mask_name is None:
                raise UserInputError(
                    f"--serve text: mean pooling of '{values.name}' needs an attention_mask "
                    f"input, and model '{recipe.name}' has none"
                )
            mask = next(t for t in model_io.inputs if t.name == mask_name)
            return PostprocessPlan("mean_pooling", values, mask, (out,))
        if len(values.shape) == 2:
            return PostprocessPlan("normalize", values, None, (out,))
        return None
    if recipe.task == "sequence-classification":
        if len(values.shape) != 2 or values.shape[-1] <= 0:
            raise UserInputError(
                f"--serve text: output '{values.name}' has shape {list(values.shape)}; "
                "a classifier's logits must be [batch, labels]"
            )
        count = values.shape[-1]
        return PostprocessPlan(
            "softmax", values, None,
            (TensorIO(PROBABILITIES_OUTPUT, "float32", (-1, count), batched),
             TensorIO(LABEL_OUTPUT, "bytes", (-1, 1), batched)),
            labels_from_config(model_config_json, count),
        )
    return None


def postprocess_config(name: str, plan: PostprocessPlan, profiles: Sequence[ShapeProfile],
                       settings: TritonSettings) -> Any:
    params = {"mode": plan.mode, "values_input": plan.values.name,
              "output": plan.outputs[0].name}
    if plan.mask is not None:
        params["mask_input"] = plan.mask.name
    if plan.mode == "softmax":
        params["labels_file"] = LABELS_FILE
        params["label_output"] = LABEL_OUTPUT
    if plan.mode == "token_argmax":
        params["labels_file"] = LABELS_FILE
    return _python_model_config(name, plan.io(), profiles, settings, params)


# --- ensemble -------------------------------------------------------------------------------


@dataclass
class EnsembleStep:
    model: str
    input_map: dict[str, str] = field(default_factory=dict)  # member input -> ensemble tensor
    output_map: dict[str, str] = field(default_factory=dict)  # member output -> ensemble tensor


def text_ensemble_steps(tokenizer: str, model: str, model_io: ModelIO,
                        fields: Mapping[str, TokenField], post: str | None,
                        plan: PostprocessPlan | None) -> list[EnsembleStep]:
    """Tensors keep their member names inside the ensemble (TEXT, input_ids, ...)."""
    steps = [
        EnsembleStep(tokenizer, {TEXT_INPUT: TEXT_INPUT}, {n: n for n in fields}),
        EnsembleStep(model, {t.name: t.name for t in model_io.inputs},
                     {t.name: t.name for t in model_io.outputs}),
    ]
    if post is not None and plan is not None:
        inputs = [plan.values] if plan.mask is None else [plan.values, plan.mask]
        steps.append(EnsembleStep(post, {t.name: t.name for t in inputs},
                                  {n: n for n in plan.output_names}))
    return steps


def ensemble_config(name: str, io: ModelIO, profiles: Sequence[ShapeProfile],
                    settings: TritonSettings, steps: Sequence[EnsembleStep]) -> Any:
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


# --- checks ---------------------------------------------------------------------------------


def _tensors(config: Any, section: str) -> dict[str, tuple[str, list[int]]]:
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
    read, and producer and consumer agree on type and dims.
    """
    config = read_config(repository / name / "config.pbtxt")
    problems: list[str] = []
    if config.platform != "ensemble":
        return [f"{name}: platform is '{config.platform}', not 'ensemble'"]
    # ensemble tensor -> (dtype, dims, who produced it)
    known: dict[str, tuple[str, list[int], str]] = {
        n: (d, dims, "ensemble input") for n, (d, dims) in _tensors(config, "input").items()
    }
    for step in config.ensemble_scheduling.step:
        member_path = repository / step.model_name / "config.pbtxt"
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
    for out_name, (dtype, dims) in _tensors(config, "output").items():
        if out_name not in known:
            problems.append(f"{name}: output '{out_name}' is produced by no step")
        elif known[out_name][0] != dtype or not _dims_agree(known[out_name][1], dims):
            have = known[out_name]
            problems.append(f"{name}: output '{out_name}' is declared {dtype} {dims} but "
                            f"{have[2]} gives {have[0]} {have[1]}")
    return problems


def ensemble_members(config: Any) -> list[str]:
    return [s.model_name for s in config.ensemble_scheduling.step]
