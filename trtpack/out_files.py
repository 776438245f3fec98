"""Which files of an output folder are trtpack's, and the lock that lets one build at a time
write it.

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
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from trtpack.errors import UserInputError

MANIFEST = ".trtpack-manifest.json"


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
_LEGACY = ("artifacts", "logs", "model_repository", "tuning", "sagemaker", "report.json",
           "report.html", "recipe.yaml")


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


def unknown_files(out: Path) -> list[str]:
    """Files in ``out`` that trtpack did not write (all of them when it has no manifest)."""
    if not out.is_dir():
        return []
    ours = set(manifest_files(out) or [])
    return [f for f in files_under(out) if f not in ours]


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
