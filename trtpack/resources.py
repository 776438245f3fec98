"""Measuring a stage: wall time and peak resident memory (this process and its children)."""

from __future__ import annotations

import contextlib
import threading
import time
from types import TracebackType


def _rss_mb(exclude: frozenset[int] = frozenset()) -> float | None:
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a core dependency
        return None
    proc = psutil.Process()
    total = proc.memory_info().rss
    skipped: set[int] = set(exclude)
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.pid in skipped or child.ppid() in skipped:
                skipped.add(child.pid)
                continue
            total += child.memory_info().rss
    return total / 2**20


class ResourceMeter:
    """Context manager sampling RSS (self + children) every ``interval`` seconds; the
    processes in ``exclude`` (and theirs) are not counted (another stage's, warming up).

    ``seconds`` and ``peak_mb`` hold the wall time and the highest sample after exit.
    """

    def __init__(self, interval: float = 0.05, exclude: set[int] | None = None) -> None:
        self.interval = interval
        self.exclude = frozenset(exclude or ())
        self.seconds = 0.0
        self.peak_mb: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = 0.0

    def _sample(self) -> None:
        value = _rss_mb(self.exclude)
        if value is not None and (self.peak_mb is None or value > self.peak_mb):
            self.peak_mb = value

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> ResourceMeter:
        self._start = time.perf_counter()
        self._sample()
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
        self._sample()
        self.seconds = time.perf_counter() - self._start
