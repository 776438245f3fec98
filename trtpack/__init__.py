"""trtpack: compile PyTorch / Hugging Face models into verified, ready-to-serve Triton models.

``build(model, ...)`` builds from Python (``trtpack.python_api``); ``BuiltModel`` is
what it returns, ``BuildRequest`` what the CLI hands the library. They are imported on first
use: ``import trtpack`` imports neither torch nor the pipeline.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {"build": "trtpack.python_api", "BuiltModel": "trtpack.python_api",
         "export_module": "trtpack.python_api", "BuildRequest": "trtpack.api",
         "AccuracyError": "trtpack.errors", "UserInputError": "trtpack.errors",
         "TrtpackError": "trtpack.errors"}
__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trtpack' has no attribute '{name}'")
