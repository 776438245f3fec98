"""Putting a finished build at OUT: trtpack's files of an earlier build there are replaced,
nobody else's are touched (``trtpack.out_files`` says which are trtpack's)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from trtpack.out_files import MANIFEST, build_files, files_under, write_manifest


def replace_out(work: Path, out: Path) -> str | None:
    """Put the finished build at ``out``: trtpack's files of an earlier build there are
    replaced, nobody else's are touched. One rename when ``out`` holds only trtpack's
    files (or nothing); else file by file. What was replaced, as one line (or None)."""
    new_files = files_under(work)
    write_manifest(work, new_files)
    if not out.exists():
        work.rename(out)
        return None
    earlier = build_files(out) or []
    theirs = [f for f in files_under(out) if f not in set(earlier)]
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    overwritten = sorted(set(theirs) & set(new_files))
    if not theirs:
        out.rename(old)
        work.rename(out)
    else:
        for rel in [*earlier, *overwritten, MANIFEST]:
            src = out / rel
            if src.is_file() or src.is_symlink():
                (old / rel).parent.mkdir(parents=True, exist_ok=True)
                src.rename(old / rel)
        for rel in [*new_files, MANIFEST]:
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).rename(out / rel)
        for rel in earlier:  # folders the earlier build made and nothing holds now
            folder = (out / rel).parent
            while folder != out and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
                folder = folder.parent
        shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    if not earlier and not overwritten:
        return None
    line = (f"replaced the earlier build in {out}: {len(earlier)} files "
            f"({', '.join(top_level(earlier))})")
    if overwritten:
        line += f"; overwrote {len(overwritten)} of yours ({', '.join(overwritten[:3])})"
    kept = len(theirs) - len(overwritten)
    if kept:
        line += f"; kept {kept} file{'s' * (kept != 1)} trtpack did not write"
    return line


def top_level(files: Sequence[str]) -> list[str]:
    """``artifacts/export/model.onnx``, ``report.json`` -> ``artifacts/``, ``report.json``."""
    names = {f.split("/", 1)[0] + ("/" if "/" in f else "") for f in files}
    return sorted(names)
