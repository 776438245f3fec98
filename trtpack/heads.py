"""Model heads: which task a Hugging Face checkpoint is, and the recipe for it.

The head comes from ``config.architectures`` (``GPT2LMHeadModel`` is a causal language
model, so its ONNX returns ``logits``), or from ``--task`` / a recipe's ``task:``. Each head
has its outputs and the metric its verification uses:

  feature-extraction       last_hidden_state (pooled cosine) / pooler_output (vision, cosine)
  sentence-embedding       sentence_embedding: the pooling of a sentence-transformers
                           directory's modules.json done inside the model (cosine)
  sequence-classification  logits [batch, labels] (top-1 per sample)
  token-classification     logits [batch, sequence, labels] (top-1 per unpadded token)
  question-answering       start_logits, end_logits (span: argmax position per sample)
  fill-mask                logits [batch, sequence, vocab] (top-1 per unpadded token)
  text-generation          logits only, no KV cache (top-1 per unpadded token): decoding
                           with a KV cache belongs to TensorRT-LLM
  image-classification     logits [batch, labels] (top-1 per sample)

transformers is imported inside the functions that need its tables of classes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtpack.errors import UserInputError
from trtpack.recipe import Recipe, safe_name
from trtpack.tokenizer_files import has_tokenizer


@dataclass(frozen=True)
class Head:
    task: str
    auto_class: str  # transformers Auto class for --task with a model type
    mapping: str  # transformers.models.auto.modeling_auto table of model type -> class
    description: str
    verified_with: str


HEADS: tuple[Head, ...] = (
    Head("sequence-classification", "AutoModelForSequenceClassification",
         "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "…ForSequenceClassification",
         "top-1 per sample"),
    Head("token-classification", "AutoModelForTokenClassification",
         "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "…ForTokenClassification",
         "top-1 per unpadded token, worst sample"),
    Head("question-answering", "AutoModelForQuestionAnswering",
         "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES", "…ForQuestionAnswering",
         "span: start/end argmax over unpadded tokens agree, per sample"),
    Head("fill-mask", "AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
         "…ForMaskedLM", "top-1 per unpadded token, worst sample"),
    Head("text-generation", "AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
         "…ForCausalLM, …LMHeadModel (logits only, no KV cache)",
         "top-1 per unpadded token, worst sample"),
    Head("image-classification", "AutoModelForImageClassification",
         "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "…ForImageClassification",
         "top-1 per sample"),
    Head("feature-extraction", "AutoModel", "MODEL_MAPPING_NAMES", "…Model (base model)",
         "cosine of mean-pooled embeddings per sample (text), cosine per sample (vision)"),
    Head("sentence-embedding", "AutoModel", "MODEL_MAPPING_NAMES",
         "sentence-transformers directory (modules.json: Transformer, Pooling, Normalize)",
         "cosine per sample"),
)
HEAD_BY_TASK = {h.task: h for h in HEADS}
SUPPORTED = ", ".join(h.task for h in HEADS)
TOKEN_TYPE_FREE = {"distilbert", "roberta", "xlm-roberta", "camembert", "deberta-v2", "gpt2"}
KV_CACHE_NOTE = ("text-generation models are built for their logits only (no KV-cache "
                 "inputs or outputs); LLM decoding with a KV cache belongs to TensorRT-LLM")


SUFFIX_HEADS = (("ForSequenceClassification", "sequence-classification"),
                ("ForTokenClassification", "token-classification"),
                ("ForQuestionAnswering", "question-answering"),
                ("ForMaskedLM", "fill-mask"), ("WithLMHeadModel", "fill-mask"),
                ("ForCausalLM", "text-generation"), ("LMHeadModel", "text-generation"),
                ("ForImageClassification", "image-classification"))
"""Class-name suffixes that say the head without transformers' tables (which import torch,
about 2 s): tests/test_heads.py checks them against every class in those tables."""


def _mapping(head: Head) -> dict[str, Any]:
    """transformers' model type -> class table of ``head`` (imports torch: see SUFFIX_HEADS)."""
    from transformers.models.auto import modeling_auto

    return dict(getattr(modeling_auto, head.mapping, {}))


def _classes(value: Any) -> tuple[str, ...]:
    return tuple(value) if isinstance(value, list | tuple) else (str(value),)


def head_of_architecture(arch: str) -> Head | None:
    """The head a transformers class name is (``GPT2LMHeadModel`` -> text-generation): by
    its suffix, else (base models, other names) from transformers' tables."""
    for suffix, task in SUFFIX_HEADS:
        if arch.endswith(suffix):
            return HEAD_BY_TASK[task]
    return head_in_tables(arch)


def head_in_tables(arch: str) -> Head | None:
    """The head whose transformers table has the class ``arch`` (imports transformers)."""
    for head in HEADS:
        if head.task == "sentence-embedding":
            continue
        if any(arch in _classes(v) for v in _mapping(head).values()):
            return head
    return None


def class_for_task(model_type: str, task: str) -> str:
    """The transformers class of ``task`` for ``model_type``; exit 2 when it has none."""
    head = HEAD_BY_TASK.get(task)
    if head is None:
        raise UserInputError(f"unknown task '{task}'; supported: {SUPPORTED}")
    found = _mapping(head).get(model_type)
    if found is None:
        offered = [h.task for h in HEADS if h.task != "sentence-embedding"
                   and model_type in _mapping(h)]
        raise UserInputError(
            f"--task {task}: model type '{model_type}' has no {task} head in transformers; "
            f"it has: {', '.join(offered) or 'none that trtpack supports'}")
    return _classes(found)[0]


def read_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise UserInputError(f"cannot read {path / 'config.json'}: {e}") from None
    if not isinstance(data, dict):
        raise UserInputError(f"{path / 'config.json'} is not a JSON object")
    return data


def _sentence_transformers(path: Path) -> tuple[Path, dict[str, Any]] | None:
    """(the transformer's folder, pooling settings) of a sentence-transformers directory."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        return None
    try:
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise UserInputError(f"cannot read {modules_file}: {e}") from None
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise UserInputError(f"{modules_file} is not a list of modules (JSON objects with "
                             "type and path)")
    transformer = path
    pooling: dict[str, Any] = {"mode": "mean", "normalize": False}
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        folder = path / str(module.get("path", ""))
        if kind == "Transformer":
            transformer = folder
        elif kind == "Pooling":
            settings = _pooling_settings(folder / "config.json")
            modes = [m for m, key in (("cls", "pooling_mode_cls_token"),
                                      ("mean", "pooling_mode_mean_tokens"),
                                      ("max", "pooling_mode_max_tokens"),
                                      ("lasttoken", "pooling_mode_lasttoken"))
                     if settings.get(key)]
            unsupported = [k for k in ("pooling_mode_mean_sqrt_len_tokens",
                                       "pooling_mode_weightedmean_tokens") if settings.get(k)]
            if unsupported or len(modes) > 1:
                raise UserInputError(
                    f"{folder}: pooling {', '.join(unsupported + modes)} is not supported; "
                    "trtpack pools with one of cls, mean, max, lasttoken")
            pooling["mode"] = modes[0] if modes else "mean"
        elif kind == "Normalize":
            pooling["normalize"] = True
        else:
            raise UserInputError(
                f"{modules_file}: sentence-transformers module '{kind}' is not supported "
                "(Transformer, Pooling and Normalize are); use --task feature-extraction "
                "for the token embeddings")
    return transformer, pooling


def _pooling_settings(config_file: Path) -> dict[str, Any]:
    """The Pooling module's config.json ({} when there is none)."""
    if not config_file.is_file():
        return {}
    try:
        settings = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise UserInputError(f"cannot read {config_file}: {e}") from None
    if not isinstance(settings, dict):
        raise UserInputError(f"{config_file} is not a JSON object")
    return settings


def _is_vision(config: dict[str, Any], task: str) -> bool:
    if task == "image-classification":
        return True
    if "vocab_size" in config or task not in ("feature-extraction",):
        return False
    return "num_channels" in config or "image_size" in config or "pixel_values" in json.dumps(
        config)


def recipe_for_hf_dir(path: Path, task: str | None = None, name: str | None = None) -> Recipe:
    """The recipe for a local Hugging Face directory (a sentence-transformers one too), named
    ``name`` or else after the folder."""
    if not path.is_dir():
        raise UserInputError(f"'{path}' is not a directory")
    st = _sentence_transformers(path) if task in (None, "sentence-embedding") else None
    model_dir = st[0] if st is not None else path
    if not (model_dir / "config.json").is_file():
        raise UserInputError(
            f"'{path}' is a directory without config.json: not a Hugging Face model directory")
    config = read_config(model_dir)
    if config.get("is_encoder_decoder"):
        raise UserInputError(
            f"{model_dir}: encoder-decoder models ({config.get('model_type')}) are not "
            f"supported; trtpack builds these heads: {SUPPORTED}")
    model_type = str(config.get("model_type", ""))
    archs: list[str] = list(config.get("architectures") or [])
    model_class: str | None
    if task == "sentence-embedding" and st is None:
        raise UserInputError(f"--task sentence-embedding needs a sentence-transformers "
                             f"directory (modules.json), and {path} has none")
    if st is not None:
        task, model_class = "sentence-embedding", "AutoModel"
    elif task is not None:
        model_class = class_for_task(model_type, task) if model_type else \
            HEAD_BY_TASK[task].auto_class if task in HEAD_BY_TASK else None
        if model_class is None:
            raise UserInputError(f"unknown task '{task}'; supported: {SUPPORTED}")
    elif archs:
        head = head_of_architecture(archs[0])
        if head is None:
            raise UserInputError(
                f"{model_dir}: architecture {archs[0]} is not supported; trtpack builds "
                f"these heads: {SUPPORTED} (pick one with --task)")
        task, model_class = head.task, archs[0]
    else:
        task, model_class = "feature-extraction", "AutoModel"
    recipe: dict[str, Any] = {"name": name or safe_name(path.resolve().name), "task": task,
                              "model_class": model_class,
                              "source": {"path": str(model_dir.resolve())}}
    labels = len(config.get("id2label") or {}) or int(config.get("num_labels", 2))
    if _is_vision(config, task):
        size = config.get("image_size", 224)
        size = size[0] if isinstance(size, list) else size
        hidden = int((config.get("hidden_sizes") or [config.get("hidden_size", 768)])[-1])
        pooled_4d = model_type in ("resnet", "regnet")
        recipe.update(
            inputs=[{"name": "pixel_values", "dtype": "float32", "kind": "image",
                     "axes": ["batch", int(config.get("num_channels", 3)), size, size]}],
            outputs=[{"name": "logits", "axes": ["batch", labels], "metric": "top1"}]
            if task == "image-classification" else
            [{"name": "pooler_output", "axes": ["batch", hidden, 1, 1] if pooled_4d
              else ["batch", hidden], "metric": "cosine"}],
            profiles=["1:4:8"])
        return Recipe.model_validate(recipe)
    hidden = int(config.get("hidden_size") or config.get("dim") or config.get("n_embd")
                 or config.get("d_model") or 768)
    vocab = int(config.get("vocab_size") or 30522)
    inputs: list[dict[str, Any]] = [
        {"name": "input_ids", "dtype": "int64", "axes": ["batch", "sequence"], "kind": "token_ids"},
        {"name": "attention_mask", "dtype": "int64", "axes": ["batch", "sequence"],
         "kind": "attention_mask"},
    ]
    if model_type not in TOKEN_TYPE_FREE and int(config.get("type_vocab_size") or 0) >= 2:
        inputs.append({"name": "token_type_ids", "dtype": "int64", "axes": ["batch", "sequence"],
                       "kind": "token_type_ids"})
    outputs = text_outputs(task, hidden=hidden, labels=labels, vocab=vocab)
    positions = config.get("max_position_embeddings") or config.get("n_positions") or 512
    max_len = min(int(positions), 512)
    recipe.update(
        inputs=inputs, outputs=outputs, profiles=[f"1x16:4x64:8x{max_len}"],
        tokenizer=has_tokenizer(model_dir),
        vocab_size=vocab,
    )
    if st is not None:
        recipe["pooling"] = st[1]
    return Recipe.model_validate(recipe)


def text_outputs(task: str, *, hidden: int | str = "hidden", labels: int | str = "labels",
                 vocab: int | str = "vocab") -> list[dict[str, Any]]:
    """The outputs a text head returns, with the metric that verifies each."""
    bs = ["batch", "sequence"]
    if task == "sequence-classification":
        return [{"name": "logits", "axes": ["batch", labels], "metric": "top1"}]
    if task == "token-classification":
        return [{"name": "logits", "axes": [*bs, labels], "metric": "token_top1"}]
    if task == "question-answering":
        return [{"name": "start_logits", "axes": bs, "metric": "span"},
                {"name": "end_logits", "axes": bs, "metric": "span"}]
    if task in ("fill-mask", "text-generation"):
        return [{"name": "logits", "axes": [*bs, vocab], "metric": "token_top1"}]
    if task == "sentence-embedding":
        return [{"name": "sentence_embedding", "axes": ["batch", hidden], "metric": "cosine"}]
    return [{"name": "last_hidden_state", "axes": [*bs, hidden], "metric": "pooled_cosine"}]


def supported_heads_table() -> list[tuple[str, str, str]]:
    """(task, architectures, verified with) for the README and ``--help``."""
    return [(h.task, h.description, h.verified_with) for h in HEADS]
