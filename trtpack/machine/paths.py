"""Where this machine keeps trtpack's files."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """The stage cache: ``$TRTPACK_CACHE_DIR``, else ``$XDG_CACHE_HOME/trtpack``, else
    ``~/.cache/trtpack``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(os.environ.get("TRTPACK_CACHE_DIR", str(Path(base) / "trtpack")))
