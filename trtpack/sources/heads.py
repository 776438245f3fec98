"""Model heads: which task a Hugging Face checkpoint is (the recipe for a model directory is
``trtpack.sources.hf_recipe``).

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

from dataclasses import dataclass
from typing import Any

from trtpack.errors import UserInputError


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

SUFFIX_HEADS = (("ForSequenceClassification", "sequence-classification"),
                ("ForTokenClassification", "token-classification"),
                ("ForQuestionAnswering", "question-answering"),
                ("ForMaskedLM", "fill-mask"), ("WithLMHeadModel", "fill-mask"),
                ("ForCausalLM", "text-generation"), ("LMHeadModel", "text-generation"),
                ("ForImageClassification", "image-classification"))
"""Class-name suffixes that say the head without transformers' tables (which import torch,
about 2 s): tests/sources/test_heads.py checks them against every class in those tables."""


def transformers_table(head: Head) -> dict[str, Any]:
    """transformers' model type -> class table of ``head`` (imports torch: see SUFFIX_HEADS)."""
    from transformers.models.auto import modeling_auto

    return dict(getattr(modeling_auto, head.mapping, {}))


def class_names(value: Any) -> tuple[str, ...]:
    """The class names of one entry of a transformers table (a name or a tuple of names)."""
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
        if any(arch in class_names(v) for v in transformers_table(head).values()):
            return head
    return None


def class_for_task(model_type: str, task: str) -> str:
    """The transformers class of ``task`` for ``model_type``; exit 2 when it has none."""
    head = HEAD_BY_TASK.get(task)
    if head is None:
        raise UserInputError(f"unknown task '{task}'; supported: {SUPPORTED}")
    found = transformers_table(head).get(model_type)
    if found is None:
        offered = [h.task for h in HEADS if h.task != "sentence-embedding"
                   and model_type in transformers_table(h)]
        raise UserInputError(
            f"--task {task}: model type '{model_type}' has no {task} head in transformers; "
            f"it has: {', '.join(offered) or 'none that trtpack supports'}")
    return class_names(found)[0]


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
