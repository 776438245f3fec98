"""The files a Hugging Face tokenizer is saved as: one home for the list that the resolver,
the model loader, the ONNX import and the Triton repository share (no heavy imports)."""

from __future__ import annotations

from pathlib import Path

VOCABULARY_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model",
                    "sentencepiece.bpe.model", "spiece.model")
"""Each one of these holds a vocabulary (``vocab.json`` is GPT-2 style, with ``merges.txt``)."""
TOKENIZER_FILES = (*VOCABULARY_FILES, "merges.txt", "tokenizer_config.json",
                   "special_tokens_map.json", "added_tokens.json")
"""Every file of a saved tokenizer: what is copied beside a model."""


def has_tokenizer(folder: Path | None) -> bool:
    """Whether ``folder`` holds a tokenizer (a vocabulary file)."""
    return folder is not None and any((folder / f).is_file() for f in VOCABULARY_FILES)


def tokenizer_files(folder: Path | None) -> list[Path]:
    """The tokenizer files present in ``folder`` (none when it is not a directory)."""
    if folder is None or not folder.is_dir():
        return []
    return [folder / f for f in TOKENIZER_FILES if (folder / f).is_file()]
