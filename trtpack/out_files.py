"""The output folder OUT: the names a build writes there, which of its files are trtpack's,
putting a finished build there, and the lock that lets one build at a time write it.

A build's ``OUT/.trtpack-manifest.json`` lists every file trtpack wrote there (the build's own,
and what ``package``/``bench`` added later): a rebuild replaces exactly those, and never
touches a file trtpack did not write. A folder without a manifest is not a trtpack build.
Core module: standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from trtpack.errors import UserInputError

MANIFEST = ".trtpack-manifest.json"
# what a build writes in OUT, beside report.json (``trtpack.report.REPORT``)
ARTIFACTS = "artifacts"  # one folder per stage: ARTIFACTS/<stage>/
LOGS = "logs"  # one log per stage: LOGS/<stage>.log
REPOSITORY = "model_repository"  # the Triton model repository
TUNING = "tuning"  # perf_analyzer and Model Analyzer files
RECIPE_FILE = "recipe.yaml"  # the recipe as built
REPORT_PAGE = "report.html"
SAGEMAKER = "sagemaker"  # ``trtpack package --format sagemaker``'s default destination


def manifest_files(out: Path) -> list[str] | None:
    """The files (relative paths) trtpack wrote in ``out``; None when ``out`` has no readable
    manifest (it is not a trtpack build)."""
    try:
        data = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
        files = data["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    return [f for f in files if _inside(f)]


# what builds made before the manifest existed wrote (``package`` wrote sagemaker/)
_LEGACY = (ARTIFACTS, LOGS, REPOSITORY, TUNING, SAGEMAKER, "report.json", REPORT_PAGE,
           RECIPE_FILE)


def build_files(out: Path) -> list[str] | None:
    """trtpack's files in ``out``: its manifest's, or for a build made before manifests
    existed (its report.json says trtpack wrote it), the files under the names such builds
    wrote. None when ``out`` is not a trtpack build."""
    listed = manifest_files(out)
    if listed is not None:
        return listed
    try:
        report = json.loads((out / "report.json").read_text(encoding="utf-8"))
        legacy = "trtpack" in report["versions"] and isinstance(report["stages"], list)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not legacy:
        return None
    return [f for f in files_under(out) if f.split("/", 1)[0] in _LEGACY]


def _inside(rel: str) -> bool:
    p = Path(rel)
    return not p.is_absolute() and ".." not in p.parts and rel not in ("", ".")


def write_manifest(out: Path, files: Iterable[str]) -> None:
    """Record ``files`` (relative to ``out``) as trtpack's, atomically."""
    tmp = out / f"{MANIFEST}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps({"files": sorted(set(files))}, indent=0), encoding="utf-8")
    os.replace(tmp, out / MANIFEST)


def files_under(root: Path) -> list[str]:
    """Every file under ``root`` as a relative path (the manifest itself excluded)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if (p.is_file() or p.is_symlink()) and p.name != MANIFEST)


def record_files(out: Path, paths: Iterable[Path]) -> None:
    """Add ``paths`` (written by ``package``/``bench`` into the build folder ``out``) to its
    manifest, so a rebuild replaces them. Nothing happens outside a trtpack build folder."""
    known = manifest_files(out)
    if known is None:
        return
    root = out.resolve()
    added = []
    for p in paths:
        p = p.resolve()
        if p.is_relative_to(root):
            added.extend([str(f.relative_to(root)) for f in p.rglob("*") if f.is_file()]
                         if p.is_dir() else [str(p.relative_to(root))])
    if set(added) - set(known):
        write_manifest(out, [*known, *added])


@contextlib.contextmanager
def made_in_place_of(tmp: Path, out: Path) -> Iterator[Path]:
    """Write a folder into ``tmp`` and, when the block ends, rename it to ``out`` (empty or
    absent: callers check first); any exception (Ctrl-C too) removes ``tmp``, so nothing is
    half-written at ``out``. Yields ``tmp``."""
    try:
        yield tmp
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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


def pid_is_live_build(pid: int) -> bool:
    """Whether ``pid`` is a running process that may be a trtpack build (a Python running
    trtpack); a dead pid, or one reused by another program, is not."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc: alive is all we know
    return b"trtpack" in cmdline


def stale_siblings(out: Path) -> list[Path]:
    """``.OUT.partial-PID`` / ``.OUT.old-PID`` folders beside ``out`` whose build is dead."""
    pattern = re.compile(rf"^\.{re.escape(out.name)}\.(partial|old)-(\d+)$")
    stale = []
    with contextlib.suppress(OSError):
        for p in out.parent.iterdir():
            m = pattern.match(p.name)
            if m and int(m.group(2)) != os.getpid() and not pid_is_live_build(int(m.group(2))):
                stale.append(p)
    return sorted(stale)


def make_folder(folder: Path, option: str) -> None:
    """Create ``folder`` (and its parents) for ``option`` (``--out``, ``--dest``), or say in one
    line why it cannot be: a parent that is a file, a place where nothing can be written
    (``/proc``), no permission (``UserInputError``, exit 2)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise folder_error(folder, option, e) from e


def folder_error(folder: Path, option: str, e: OSError) -> UserInputError:
    """``e``, met while creating or writing in ``folder``, as a one-line error naming it."""
    blocking = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if blocking is not None and not blocking.is_dir():
        return UserInputError(f"{option} '{folder}': '{blocking}' is a file, not a folder",
                              hint=f"choose another {option}, or move that file away")
    return UserInputError(f"{option} '{folder}': cannot write there ({e.strerror or e})",
                          hint=f"choose an {option} in a folder you can write")


@contextlib.contextmanager
def out_lock(out: Path, on_wait: Callable[[str], None]) -> Iterator[None]:
    """Hold ``.OUT.lock`` beside ``out`` (``flock``): one build writes an output folder at a
    time. When another holds it, ``on_wait`` gets one line and this waits. The lock file is
    removed on release; a waiter that locked a removed file tries again, so two builds never
    both hold it."""
    path = out.with_name(f".{out.name}.lock")
    said = False
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:  # /proc, a read-only file system, no permission
            raise folder_error(out, "--out", e) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            if not said:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                on_wait(f"waiting: another trtpack build (pid {holder}) is writing {out}")
                said = True
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the holder removed that file as it released it: lock the new one
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)
