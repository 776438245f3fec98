"""A build's resources: a stage's wall time and peak resident memory, measured (this process
and its children: ``ResourceMeter``); the memory a model's run needs beyond its weights, defined
once (``activation_bytes``); the memory this machine still has (``available_memory``); and a
heap that keeps what is freed for the next allocation (``reused_heap``)."""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Collection, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# A meter lists the process's descendants anew every RESCAN_EVERY samples: psutil reads every
# process on the machine for that, where reading a known process's RSS is one small file.
# Listing them at every sample was most of the build process's own CPU time (issue 47;
# benchmarks/README.md, "CPU-seconds of the design card").
RESCAN_EVERY = 10
_STATM = Path("/proc/self/statm").is_file()  # Linux; elsewhere psutil reads the RSS


def _descendants(exclude: frozenset[int] = frozenset(),
                 include: frozenset[int] = frozenset()) -> list[int] | None:
    """This process's descendants, less ``exclude`` and theirs, with ``include`` and theirs
    (processes of the build that are not its children: a stage server's, ``stage_client``)
    (None: psutil missing)."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a core dependency
        return None
    found = []
    skipped: set[int] = set(exclude)
    processes = list(psutil.Process().children(recursive=True))
    for pid in sorted(include - exclude):
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            processes += [root, *root.children(recursive=True)]
    for child in processes:
        with contextlib.suppress(psutil.Error):
            if child.pid in skipped or child.ppid() in skipped:
                skipped.add(child.pid)
                continue
            if child.pid not in found:
                found.append(child.pid)
    return found


def rss_bytes(pid: int | str) -> int:
    """A process's resident set (``/proc/PID/statm``); 0 when it is gone."""
    if not _STATM:
        import psutil

        try:
            return int(psutil.Process(os.getpid() if pid == "self" else int(pid))
                       .memory_info().rss)
        except psutil.Error:
            return 0
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


def _rss_mb(exclude: frozenset[int] = frozenset()) -> float | None:
    """RSS of this process and its descendants (less ``exclude`` and theirs), MB."""
    pids = _descendants(exclude)
    if pids is None:
        return None
    return (rss_bytes("self") + sum(rss_bytes(p) for p in pids)) / 2**20


class ResourceMeter:
    """Context manager sampling RSS (self + children) every ``interval`` seconds; the
    processes in ``exclude`` (and theirs) are not counted (another stage's, warming up).
    ``include``: processes counted as children though they are not (and theirs). The
    children are listed anew every ``RESCAN_EVERY`` samples (and at the first and the
    last); between, the RSS of those listed is read.

    ``seconds`` and ``peak_mb`` hold the wall time and the highest sample after exit.
    """

    def __init__(self, interval: float = 0.05, exclude: set[int] | None = None,
                 include: set[int] | None = None) -> None:
        self.interval = interval
        self.exclude = frozenset(exclude or ())
        self.include = frozenset(include or ())
        self.seconds = 0.0
        self.peak_mb: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = 0.0
        self._pids: list[int] | None = None
        self._since_scan = 0

    def exclude_process(self, pid: int) -> None:
        """Leave ``pid`` (and its children) out from the next sample on."""
        self.exclude = self.exclude | {pid}
        self._pids = None  # listed anew at the next sample

    def include_process(self, pid: int) -> None:
        """Count ``pid`` (and its children) from the next sample on, though it is no child."""
        self.include = self.include | {pid}
        self._pids = None  # listed anew at the next sample

    def _sample(self, rescan: bool = False) -> None:
        if rescan or self._pids is None or self._since_scan >= RESCAN_EVERY:
            self._pids = _descendants(self.exclude, self.include)
            self._since_scan = 0
        self._since_scan += 1
        pids = self._pids  # read once: exclude_process may reset it from another thread
        if pids is None:
            return
        value = (rss_bytes("self") + sum(rss_bytes(p) for p in pids)) / 2**20
        if self.peak_mb is None or value > self.peak_mb:
            self.peak_mb = value

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> ResourceMeter:
        self._start = time.perf_counter()
        self._sample(rescan=True)
        self._thread = threading.Thread(target=self._loop, name="trtpack-meter", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample(rescan=True)
        self.seconds = time.perf_counter() - self._start


# --- what a model's run needs: the one definition of its activations ----------------------

TensorKey = Hashable


@dataclass(frozen=True)
class Op:
    """One operation of a model's run, in the order it runs: the tensors it reads and the
    tensors it writes, by key (an ONNX value name, a PyTorch storage)."""

    reads: tuple[TensorKey, ...]
    writes: tuple[TensorKey, ...]


def activation_bytes(ops: Sequence[Op], sizes: Mapping[Any, int],
                     kept: Collection[Any] = ()) -> int:
    """A model's **activations**: the most bytes of intermediate tensors alive at once while
    its operations run in order, once, at one input shape.

    A tensor is an activation when an operation writes it (the weights and the model's
    inputs are not: no operation writes them); it is alive from the first operation that
    writes it to the last one that reads it, the model's outputs (``kept``) to the end.
    While an operation runs, its inputs and outputs are alive together. A tensor written
    again (in place) or a view of another (the same key) is counted once. ``sizes`` holds
    each tensor's bytes (a missing key counts 0: a size nobody could infer).

    This is what a runtime that frees each tensor after its last use needs beyond the
    weights (PyTorch eager, ONNX Runtime's planned arena); the memory pre-check of a build
    (``pipeline.memory_check``) and the build-cost estimate use it, on a module's trace
    (``pytorch.footprint``) or an ONNX graph (``onnx_tools.footprint``)."""
    last_read: dict[TensorKey, int] = {}
    for index, op in enumerate(ops):
        for key in op.reads:
            last_read[key] = index
    end = len(ops)
    for key in kept:
        last_read[key] = end
    alive: dict[TensorKey, int] = {}
    frees: dict[int, list[TensorKey]] = {}
    current = peak = 0
    for index, op in enumerate(ops):
        for key in op.writes:
            if key in alive:
                continue  # written in place, or a view
            alive[key] = sizes.get(key, 0)
            current += alive[key]
            frees.setdefault(max(index, last_read.get(key, index)), []).append(key)
        peak = max(peak, current)
        for key in frees.pop(index, ()):
            current -= alive.pop(key)
    return peak


# --- what this machine has ------------------------------------------------------------------

NO_LIMIT = 2**60  # a cgroup "limit" at or above this is no limit (v1 writes 2**63 rounded)


@dataclass(frozen=True)
class AvailableMemory:
    bytes: int
    source: str  # where the figure comes from, for a message: "MemAvailable", "cgroup v2 ..."


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def _cgroup_stat(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0


def _cgroup_room(proc: Path, cgroup_root: Path) -> tuple[int, str] | None:
    """What this process's memory cgroup still allows (limit - usage, the reclaimable page
    cache counted as free), and which file says so; None without a limit. cgroup v2:
    ``memory.max`` / ``memory.current``; v1: ``memory.limit_in_bytes`` /
    ``memory.usage_in_bytes``. The cgroup's own folder first, then the mount's root (inside
    a container the root is the container's cgroup)."""
    try:
        lines = (proc / "self" / "cgroup").read_text().splitlines()
    except OSError:
        lines = []
    candidates: list[tuple[Path, str, str, str, str]] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":  # v2
            for folder in (cgroup_root / rel, cgroup_root):
                candidates.append((folder, "memory.max", "memory.current", "inactive_file",
                                   "cgroup v2"))
        elif "memory" in controllers.split(","):
            for folder in (cgroup_root / "memory" / rel, cgroup_root / "memory"):
                candidates.append((folder, "memory.limit_in_bytes", "memory.usage_in_bytes",
                                   "total_inactive_file", "cgroup v1"))
    for folder, limit_file, usage_file, inactive, version in candidates:
        limit = _read_int(folder / limit_file)
        usage = _read_int(folder / usage_file)
        if limit is None or limit >= NO_LIMIT or usage is None:
            continue
        used = max(0, usage - _cgroup_stat(folder / "memory.stat", inactive))
        return max(0, limit - used), f"{version} {folder / limit_file}"
    return None


# The memory a build may use, when less than this machine has: whether a build fits a smaller
# machine (a 16 GB laptop, a CI runner) is checked before running it there ("16G", "512M" or
# bytes)
MEMORY_ENV = "TRTPACK_MEMORY_AVAILABLE"
# A size as users write one: a number of bytes, or one with K, M, G or T (powers of 1024), an
# optional trailing B, any case (16G, 512mb, 1.5GB, 4096)
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)b?\s*", re.IGNORECASE)
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def size_bytes(text: str) -> int | None:
    """Bytes of a size written as ``_SIZE`` reads it; None when ``text`` is not one."""
    m = _SIZE.fullmatch(text)
    return None if m is None else int(float(m[1]) * _UNITS[m[2].lower()])


def memory_from_env(value: str) -> int:
    """Bytes of a ``MEMORY_ENV`` value (``size_bytes``, more than zero); ``ValueError``
    naming it otherwise."""
    found = size_bytes(value)
    if not found:
        raise ValueError(f"{MEMORY_ENV}={value!r}: expected a size such as 16G, 512M or "
                         "a number of bytes")
    return found


def available_memory(proc: Path = Path("/proc"),
                     cgroup_root: Path = Path("/sys/fs/cgroup")) -> AvailableMemory | None:
    """The memory a build may still use: the room left under this process's cgroup limit
    where there is one, else (or when smaller) the kernel's ``MemAvailable``, or
    ``MEMORY_ENV``'s figure when that is smaller; None when none can be read (not Linux)."""
    found = _machine_memory(proc, cgroup_root)
    value = os.environ.get(MEMORY_ENV)
    if value:
        limit = memory_from_env(value)
        if found is None or limit < found.bytes:
            return AvailableMemory(limit, f"{MEMORY_ENV}={value}")
    return found


def _machine_memory(proc: Path, cgroup_root: Path) -> AvailableMemory | None:
    system: int | None = None
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                system = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        system = None
    room = _cgroup_room(proc, cgroup_root)
    if room is not None and (system is None or room[0] < system):
        return AvailableMemory(room[0], room[1])
    return AvailableMemory(system, "MemAvailable") if system is not None else None


# glibc's mallopt parameters (malloc.h) and their defaults
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_DEFAULT_TRIM_THRESHOLD, _DEFAULT_MMAP_MAX = 128 * 1024, 65536
_INT_MAX = 2**31 - 1


def _glibc() -> Any | None:
    """This process's C library through ctypes when it is glibc (its ``mallopt``), else
    None (musl, macOS, Windows: nothing to tune)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (only glibc has it)
        libc.mallopt  # noqa: B018
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


_heap_lock = threading.Lock()
_heap_users = [0]  # the reused_heap contexts open in this process, on any thread


@contextlib.contextmanager
def reused_heap() -> Iterator[bool]:
    """Inside, memory freed by this process is kept for its next allocations instead of
    going back to the kernel; on the way out what is free goes back (``malloc_trim``) and
    glibc's defaults return. Yields whether it applies (glibc only).

    glibc's malloc serves each block above its mmap threshold (at most 32 MB) with a fresh
    mapping and unmaps it when freed, so every large tensor of a PyTorch forward (bert-large
    at 128x128: 64-256 MB each) is faulted in again page by page, each 4 KiB page zeroed by
    the kernel, on every layer: about one in six of the reference pass's CPU-seconds
    (issue 47; benchmarks/README.md). Here no block is mapped on its own and the heap is
    never trimmed, so a freed block's pages are reused as they are. The peak is the same
    live memory (freed blocks are reused, not added); the pages stay resident until the
    exit's trim. The setting is the process's: entered by several threads at once (the
    export stage's forwards beside the exporter and after it), it holds until the last one
    leaves."""
    libc = _glibc()
    if libc is None:
        yield False
        return
    with _heap_lock:
        _heap_users[0] += 1
        if _heap_users[0] == 1:
            libc.mallopt(_M_MMAP_MAX, 0)
            libc.mallopt(_M_TRIM_THRESHOLD, _INT_MAX)
    try:
        yield True
    finally:
        with _heap_lock:
            _heap_users[0] -= 1
            if _heap_users[0] == 0:
                libc.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
                libc.mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM_THRESHOLD)
                libc.malloc_trim(0)


def trim_heap() -> bool:
    """Give the free pages of this process's heap back to the kernel now (``malloc_trim``),
    also inside ``reused_heap``: what a finished step freed (the export stage's exporter)
    then does not stay resident under the next step's peak. False where there is nothing to
    call (not glibc)."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
