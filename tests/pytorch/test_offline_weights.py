"""Offline first: a recipe whose weights are not on disk asks the hub once, with one short
timeout, and fails with the hint when it cannot be reached (HF_HUB_OFFLINE=1: without asking);
tiny-bert, which has no weights anywhere, builds without --random-weights and without the
network. The hub is a local socket on a port the OS gives (``LocalHub``) that counts the
connections made to it and either drops each at once or never answers: what is asserted is
how often the hub was asked, never how long a run took (a busy neighbour test makes any run
slow)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, trtpack


class LocalHub:
    """A stand-in for the Hugging Face hub on 127.0.0.1: it accepts connections, counts them,
    and drops each at once (as unreachable as a closed port, but counted) or, ``silent``, holds
    it without sending a byte."""

    def __init__(self, silent: bool) -> None:
        self.silent = silent
        self.connections = 0
        self._held: list[socket.socket] = []
        self._stop = threading.Event()
        self._server = socket.socket()
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(16)
        self._server.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            self.connections += 1
            if self.silent:
                self._held.append(conn)
            else:
                conn.close()

    def close(self) -> int:
        """Stops serving; the number of connections made."""
        self._stop.set()
        self._thread.join()
        for conn in self._held:
            conn.close()
        self._server.close()
        return self.connections


@pytest.fixture
def dropping_hub() -> Iterator[LocalHub]:
    hub = LocalHub(silent=False)
    yield hub
    hub.close()


@pytest.fixture
def silent_hub() -> Iterator[LocalHub]:
    hub = LocalHub(silent=True)
    yield hub
    hub.close()


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("offline-cache")


def test_the_offline_hint_comes_at_once_without_the_hub(dropping_hub: LocalHub,
                                                        tmp_path: Path) -> None:
    """A recipe whose weights are not on disk, the hub unreachable (it drops every
    connection), HF_HUB_OFFLINE unset: exit 3 with the hint after one request to the hub,
    without the loader's retries (each would be another connection) and without downloading
    anything; with HF_HUB_OFFLINE=1 not even that one."""
    hub_cache = tmp_path / "hub"
    env = {"HF_ENDPOINT": dropping_hub.url, "HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": ""}
    result = trtpack("build", "bert-base", "--target", "cpu", "--out", str(tmp_path / "out"),
                     env=env)
    assert result.returncode == 3, result.stderr
    assert "cannot load weights of 'google-bert/bert-base-uncased'" in result.stderr
    assert f"the hub at {dropping_hub.url} cannot be reached" in result.stderr
    assert "hint: this machine may be offline: add --random-weights" in result.stderr
    assert dropping_hub.connections == 1
    assert not any(hub_cache.rglob("*")), list(hub_cache.rglob("*"))  # nothing downloaded
    offline = trtpack("build", "bert-base", "--target", "cpu", "--out", str(tmp_path / "out"),
                      env={**env, "HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 3 and "HF_HUB_OFFLINE is set" in offline.stderr
    assert dropping_hub.close() == 1  # the offline run asked nothing


def test_a_hub_that_never_answers_is_given_up_after_one_timeout(silent_hub: LocalHub,
                                                                tmp_path: Path) -> None:
    """A hub that accepts the connection and never answers: the probe gives up when its one
    ``HUB_PROBE_SECONDS`` timeout (under 2 s) runs out, not sooner, and asks only once."""
    from trtpack.errors import MissingEnvironmentError
    from trtpack.pytorch.models import HUB_PROBE_SECONDS

    code = ("import time; from trtpack.pytorch.models import require_hub_weights\n"
            "t = time.perf_counter()\n"
            "try:\n    require_hub_weights('google-bert/bert-base-uncased')\n"
            "except Exception as e:\n"
            "    print(type(e).__name__, time.perf_counter() - t, 'timed out' in str(e))\n")
    env = {**os.environ, "HF_ENDPOINT": silent_hub.url, "HF_HUB_CACHE": str(tmp_path / "hub"),
           "HF_HUB_OFFLINE": "", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=60, check=True).stdout.split()
    assert out[0] == MissingEnvironmentError.__name__ and out[2] == "True", out
    assert HUB_PROBE_SECONDS < 2.0
    assert float(out[1]) >= HUB_PROBE_SECONDS  # it waited its timeout: a lower bound only
    assert silent_hub.close() == 1


def test_tiny_bert_builds_offline_without_the_flag(tmp_path: Path, shared_cache: Path,
                                                  dropping_hub: LocalHub) -> None:
    """'for tests; random weights': it has no weights, so it needs no flag and no network:
    neither resolving it nor building it makes one connection to the hub."""
    env = {"HF_ENDPOINT": dropping_hub.url, "HF_HUB_OFFLINE": ""}
    code = ("from trtpack.api import BuildRequest, resolve_options\n"
            "options, _ = resolve_options(BuildRequest('tiny-bert', target='cpu'))\n"
            "print(options.random_weights)\n")
    resolved = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, **env, "PYTHONPATH": str(ROOT)}, timeout=60,
                              check=True).stdout.split()
    assert resolved == ["True"], resolved
    assert dropping_hub.connections == 0
    out = tmp_path / "out"
    result = trtpack("build", "tiny-bert", "--target", "cpu", "--out", str(out), "--cache-dir",
                     str(shared_cache), env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    export = next(s for s in report["stages"] if s["name"] == "export")
    assert export["metrics"]["weights"] == "random"
    assert dropping_hub.close() == 0
