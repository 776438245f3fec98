"""Model heads: the one registry of tasks (the recipe for a model directory is
``trtpack.sources.hf_recipe``).

The head comes from ``config.architectures`` (``GPT2LMHeadModel`` is a causal language
model, so its ONNX returns ``logits``), or from ``--task`` / a recipe's ``task:``. Each
``Head`` says everything trtpack knows of a task, and everything else derives from it: the
recipe schema's allowed tasks (``trtpack.sources.recipe``), ``--task``'s help, the transformers Auto
class a model is loaded with (``trtpack.pytorch.models``), its outputs and the metric that verifies
each (names of ``trtpack.verify.sample_metrics.SAMPLE_METRICS``), what the ``--serve text``
post-processing model does (``trtpack.serving.postprocess``) and whether ``--serve text`` is
offered at all. Adding a head is one ``register(Head(...))`` (plus its metric, when it needs
a new one):

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
  generic                  any model (a factory, an ONNX file): outputs from the model itself

transformers is imported inside the functions that need its tables of classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypedDict

from trtpack.errors import UserInputError

PostprocessRule = Literal["none", "embedding", "classify", "token_labels", "vocabulary_tokens"]
"""What the ``--serve text`` post-processing model does with a head's first output: nothing
(the ensemble returns the raw outputs), pool and normalise to an embedding, classify
(probabilities and the top label), name the top label of every token, or name the top token
at every position (the vocabulary)."""

@dataclass(frozen=True)
class HeadOutput:
    name: str
    axes: tuple[str, ...]  # "batch", "sequence"; text_outputs sizes hidden, labels, vocab
    metric: str  # a name of sample_metrics.SAMPLE_METRICS


@dataclass(frozen=True)
class Head:
    task: str
    help: str  # how --task's help names it
    outputs: tuple[HeadOutput, ...] = ()  # of a text model; () for generic
    auto_class: str | None = None  # transformers Auto class (None: not a transformers head)
    mapping: str | None = None  # modeling_auto's model type -> class table
    suffixes: tuple[str, ...] = ()  # class-name suffixes that say this head without tables
    description: str = ""
    verified_with: str = ""
    postprocess: PostprocessRule = "none"
    serve_text_refusal: str | None = None  # why --serve text is not offered (None: it is)
    logits_only: bool = False  # load with use_cache off: no KV-cache outputs
    in_tables: bool = True  # looked up by class name in transformers' tables


_BS = ("batch", "sequence")
REGISTRY: dict[str, Head] = {}
"""task -> Head, in the order heads are tried and listed; filled by ``register``."""


def register(head: Head) -> Head:
    """Add ``head`` to the registry (the one place a task is declared)."""
    if head.task in REGISTRY:
        raise ValueError(f"head '{head.task}' is registered twice")
    REGISTRY[head.task] = head
    return head


for _head in (
    Head("sequence-classification", "sequence-classification",
         (HeadOutput("logits", ("batch", "labels"), "top1"),),
         "AutoModelForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
         ("ForSequenceClassification",), "…ForSequenceClassification", "top-1 per sample",
         postprocess="classify"),
    Head("token-classification", "token-classification",
         (HeadOutput("logits", (*_BS, "labels"), "token_top1"),),
         "AutoModelForTokenClassification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
         ("ForTokenClassification",), "…ForTokenClassification",
         "top-1 per unpadded token, worst sample", postprocess="token_labels"),
    Head("question-answering", "question-answering",
         (HeadOutput("start_logits", _BS, "span"), HeadOutput("end_logits", _BS, "span")),
         "AutoModelForQuestionAnswering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
         ("ForQuestionAnswering",), "…ForQuestionAnswering",
         "span: start/end argmax over unpadded tokens agree, per sample"),
    Head("fill-mask", "fill-mask", (HeadOutput("logits", (*_BS, "vocab"), "token_top1"),),
         "AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
         ("ForMaskedLM", "WithLMHeadModel"), "…ForMaskedLM",
         "top-1 per unpadded token, worst sample", postprocess="vocabulary_tokens"),
    Head("text-generation",
         "text-generation (logits only, no KV cache: LLM decoding with a KV cache belongs to "
         "TensorRT-LLM)",
         (HeadOutput("logits", (*_BS, "vocab"), "token_top1"),),
         "AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
         ("ForCausalLM", "LMHeadModel"), "…ForCausalLM, …LMHeadModel (logits only, no KV cache)",
         "top-1 per unpadded token, worst sample",
         serve_text_refusal="generating text needs a decoding loop with a KV cache, which "
         "belongs to TensorRT-LLM; serve its logits with --serve tensor",
         logits_only=True),
    Head("image-classification", "image-classification",
         (HeadOutput("logits", ("batch", "labels"), "top1"),),
         "AutoModelForImageClassification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
         ("ForImageClassification",), "…ForImageClassification", "top-1 per sample"),
    Head("feature-extraction", "feature-extraction",
         (HeadOutput("last_hidden_state", (*_BS, "hidden"), "pooled_cosine"),),
         "AutoModel", "MODEL_MAPPING_NAMES", (), "…Model (base model)",
         "cosine of mean-pooled embeddings per sample (text), cosine per sample (vision)",
         postprocess="embedding"),
    Head("sentence-embedding", "sentence-embedding",
         (HeadOutput("sentence_embedding", ("batch", "hidden"), "cosine"),),
         "AutoModel", "MODEL_MAPPING_NAMES", (),
         "sentence-transformers directory (modules.json: Transformer, Pooling, Normalize)",
         "cosine per sample", postprocess="embedding", in_tables=False),
    Head("generic", "generic", description="any model: a factory, an ONNX file",
         verified_with="the recipe's outputs' metrics", in_tables=False),
):
    register(_head)


def heads() -> tuple[Head, ...]:
    """Every registered head, in registration order."""
    return tuple(REGISTRY.values())


def tasks() -> tuple[str, ...]:
    """Every task a recipe may have."""
    return tuple(REGISTRY)


def head_for(task: str) -> Head | None:
    return REGISTRY.get(task)


def transformers_heads() -> tuple[Head, ...]:
    """The heads a Hugging Face model directory can be built as (those with an Auto class)."""
    return tuple(h for h in REGISTRY.values() if h.auto_class is not None)


def supported() -> str:
    """The transformers heads, for messages."""
    return ", ".join(h.task for h in transformers_heads())


def task_help() -> str:
    """``--task``'s help."""
    return ("The head to build for a model directory, hub id or ONNX file (default: from "
            "config.json's architectures): " + ", ".join(h.help for h in heads()) + ".")


def suffix_heads() -> tuple[tuple[str, str], ...]:
    """(class-name suffix, task), longest suffix first (``WithLMHeadModel`` is fill-mask
    before ``LMHeadModel`` is text-generation): they say the head without transformers'
    tables (which import torch); tests/sources/test_heads.py checks them against every
    class in those tables."""
    pairs = [(s, h.task) for h in REGISTRY.values() for s in h.suffixes]
    return tuple(sorted(pairs, key=lambda pair: -len(pair[0])))


def transformers_table(head: Head) -> dict[str, str | tuple[str, ...]]:
    """transformers' model type -> class table of ``head`` (imports torch: see suffix_heads)."""
    if head.mapping is None:
        return {}
    from transformers.models.auto import modeling_auto

    return dict(getattr(modeling_auto, head.mapping, {}))


def class_names(value: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The class names of one entry of a transformers table (a name or a tuple of names)."""
    return tuple(value) if isinstance(value, list | tuple) else (str(value),)


def head_of_architecture(arch: str) -> Head | None:
    """The head a transformers class name is (``GPT2LMHeadModel`` -> text-generation): by
    its suffix, else (base models, other names) from transformers' tables."""
    for suffix, task in suffix_heads():
        if arch.endswith(suffix):
            return REGISTRY[task]
    return head_in_tables(arch)


def head_in_tables(arch: str) -> Head | None:
    """The head whose transformers table has the class ``arch`` (imports transformers)."""
    for head in heads():
        if head.in_tables and any(arch in class_names(v)
                                  for v in transformers_table(head).values()):
            return head
    return None


def class_for_task(model_type: str, task: str) -> str:
    """The transformers class of ``task`` for ``model_type``; exit 2 when it has none."""
    head = REGISTRY.get(task)
    if head is None or head.auto_class is None:
        raise UserInputError(f"unknown task '{task}'; supported: {supported()}")
    found = transformers_table(head).get(model_type)
    if found is None:
        offered = [h.task for h in heads() if h.in_tables
                   and model_type in transformers_table(h)]
        raise UserInputError(
            f"--task {task}: model type '{model_type}' has no {task} head in transformers; "
            f"it has: {', '.join(offered) or 'none that trtpack supports'}")
    return class_names(found)[0]


class OutputEntry(TypedDict):
    """A recipe ``outputs:`` entry."""

    name: str
    axes: list[int | str]
    metric: str


def text_outputs(task: str, *, hidden: int | str = "hidden", labels: int | str = "labels",
                 vocab: int | str = "vocab") -> list[OutputEntry]:
    """The outputs a head returns (recipe ``outputs:`` entries), with the metric that
    verifies each; the feature-extraction ones for a head without outputs of its own."""
    head = REGISTRY.get(task)
    if head is None or not head.outputs:
        head = REGISTRY["feature-extraction"]
    sizes: dict[str, int | str] = {"hidden": hidden, "labels": labels, "vocab": vocab}
    return [{"name": out.name, "axes": [sizes.get(a, a) for a in out.axes],
             "metric": out.metric} for out in head.outputs]
