"""The tokenizer model of a ``--serve text`` repository: TEXT (strings) in, the model's token
inputs out, padded to one of a few sequence lengths (buckets) that the shape profiles serve at
every batch, and truncated to the longest.

Its outputs take their integer type from the model's real I/O, so the tokenizer emits
exactly what the model takes (INT64 or INT32). The Python backend code is
``templates/tokenizer.py``; it loads ``tokenizer.json`` with the ``tokenizers`` package.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from trtpack.errors import UserInputError
from trtpack.model_io import ModelIO, TensorIO
from trtpack.onnx_tools.files import link_or_copy
from trtpack.report import JsonObject
from trtpack.serving.config import python_model_config
from trtpack.serving.triton_rules import (
    engine_max_batch_size,
    no_served_length_problem,
    padding_buckets,
    served_lengths,
)
from trtpack.shapes import ShapeProfile
from trtpack.sources.recipe import Recipe, TritonSettings
from trtpack.sources.tokenizer_files import tokenizer_files

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig


TEXT_INPUT = "TEXT"
TOKENIZER_FOLDER = "tokenizer"
VENDOR_FOLDER = "vendor"
"""Beside a Python-backend model.py: the packages it imports that stock Triton images lack;
the model puts the folder first on ``sys.path``."""
TEMPLATES_DIR = Path(__file__).parent / "templates"

TokenField = Literal["ids", "attention_mask", "type_ids"]
KIND_TO_FIELD: dict[str, TokenField] = {
    "token_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids",
}


@dataclass(frozen=True)
class TokenizerInfo:
    pad_id: int
    model_max_length: int | None
    padding_side: str = "right"
    truncation_side: str = "right"


def prepare_tokenizer(tokenizer_dir: Path, dst: Path) -> TokenizerInfo:
    """Copy the tokenizer files into ``dst``; write ``tokenizer.json`` if only a vocab exists.

    The served model loads ``tokenizer.json`` with the ``tokenizers`` package; a folder with
    only ``vocab.txt`` etc. is converted once here with transformers' fast tokenizer.
    """
    files = tokenizer_files(tokenizer_dir)
    for f in files:
        link_or_copy(f, dst / f.name)
    if not (dst / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(tokenizer_dir), use_fast=True)
        if not getattr(tok, "is_fast", False):
            raise UserInputError(
                f"--serve text: the tokenizer in {tokenizer_dir} has no fast (tokenizer.json) "
                "form, which the served tokenizer model needs"
            )
        tok.backend_tokenizer.save(str(dst / "tokenizer.json"))
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(dst / "tokenizer.json"))
    settings: JsonObject = {}
    if (dst / "tokenizer_config.json").is_file():
        settings = json.loads((dst / "tokenizer_config.json").read_text(encoding="utf-8"))
    pad_id: int | None = None
    pad = settings.get("pad_token")
    if isinstance(pad, dict):
        pad = pad.get("content")
    if isinstance(pad, str):
        pad_id = tokenizer.token_to_id(pad)
    if pad_id is None and tokenizer.padding is not None:
        pad_id = int(tokenizer.padding["pad_id"])
    max_len = settings.get("model_max_length")
    model_max_length = int(max_len) if isinstance(max_len, int | float) and max_len < 1e6 else None
    sides = [str(settings.get(k) or "right") for k in ("padding_side", "truncation_side")]
    return TokenizerInfo(pad_id if pad_id is not None else 0, model_max_length, *sides)


@dataclass(frozen=True)
class SequenceRange:
    """The sequence lengths the tokenizer pads to: ``buckets`` (shortest ``min``, longest
    ``max``) out of ``lengths``, every length some profile serves at every batch Triton's
    batcher can form."""

    min: int
    max: int
    buckets: tuple[int, ...] = ()
    lengths: tuple[int, ...] = ()

    def padding_lengths(self, padding_side: str) -> list[int]:
        """Buckets when padding goes on the right; every served length when it goes on the
        left, since extra left padding moves the text's positions and so changes the
        outputs of models with absolute position embeddings."""
        chosen = self.lengths if padding_side == "left" else self.buckets
        return list(chosen or (self.min, self.max))


def vendor_tokenizers(dest: Path) -> str | None:
    """Copy the installed ``tokenizers`` package into ``dest/tokenizers`` for the served
    tokenizer model: stock NGC and SageMaker Triton images have numpy in the Python backend
    but not ``tokenizers``.

    Only an abi3 Linux build is copied: PyPI's ``tokenizers`` is one
    ``cp310-abi3-manylinux2014`` wheel, whose binary serves the images' Python 3.10 or
    3.12. It comes from the installed files (``importlib.metadata``), so a build needs no
    network or download cache. When the installed build cannot serve a Linux Triton
    (another platform, or a per-version build) nothing is copied and the returned warning
    says the server's Python needs ``tokenizers`` itself."""
    from importlib import metadata

    try:
        dist = metadata.distribution("tokenizers")
    except metadata.PackageNotFoundError:
        return ("tokenizers is not installed here, so the tokenizer model does not carry "
                "it: install it in the Triton server's Python")
    wheel = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in wheel.splitlines()
            if line.startswith("Tag:")]
    if not any("-abi3-" in tag and "linux" in tag for tag in tags):
        return (f"the installed tokenizers {dist.version} is not an abi3 Linux build "
                f"({', '.join(tags) or 'no wheel tags'}), so the tokenizer model does not "
                "carry it: install tokenizers in the Triton server's Python")
    copied = 0
    for file in dist.files or []:
        parts = file.parts
        if not parts or parts[0] != "tokenizers" or "__pycache__" in parts \
                or file.suffix == ".pyi":
            continue
        target = dest.joinpath(*parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        link_or_copy(Path(str(dist.locate_file(file))), target)
        copied += 1
    if not copied:
        return (f"the installed tokenizers {dist.version} lists no files, so the tokenizer "
                "model does not carry it: install tokenizers in the Triton server's Python")
    return None


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
    """The lengths the tokenizer pads to: from the token ids input's axis 1, only lengths at
    which every batch up to ``max_batch_size`` has a profile (``triton_rules``: requests of
    one length are batched together), capped at the tokenizer's ``model_max_length``."""
    ids_input = next(name for name, f in fields.items() if f == "ids")
    for p in profiles:
        r = p.shapes.get(ids_input)
        if r is None or len(r.min) < 2:
            raise UserInputError(
                f"--serve text: the profiles give no [batch, sequence] shape for '{ids_input}'"
            )
    lengths = served_lengths(profiles, ids_input, engine_max_batch_size(profiles))
    if not lengths:
        raise UserInputError(str(no_served_length_problem(profiles, ids_input)))
    if model_max_length is not None and model_max_length > 0:
        capped = [n for n in lengths if n <= model_max_length]
        if not capped:
            raise UserInputError(
                f"--serve text: the profiles' shortest served sequence ({lengths[0]}) is longer "
                f"than the tokenizer's model_max_length ({model_max_length})")
        lengths = capped
    buckets = tuple(padding_buckets(lengths))
    return SequenceRange(buckets[0], buckets[-1], buckets, tuple(lengths))


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
                     truncation_side: str = "right") -> ModelConfig:
    for side in (padding_side, truncation_side):
        if side not in ("left", "right"):
            raise UserInputError(f"tokenizer padding/truncation side '{side}' is not left/right")
    params = {
        "max_texts": str(engine_max_batch_size(profiles)),
        "padding_side": padding_side,
        "truncation_side": truncation_side,
        "tokenizer_file": f"{TOKENIZER_FOLDER}/tokenizer.json",
        "min_sequence": str(seq.min),
        "max_sequence": str(seq.max),
        "sequence_buckets": json.dumps(seq.padding_lengths(padding_side)),
        "pad_id": str(pad_id),
        "text_input": TEXT_INPUT,
        "outputs": json.dumps(dict(fields)),
    }
    return python_model_config(name, tokenizer_io(model_io, fields), profiles, settings,
                               params)
