"""Offline first: a recipe whose weights are not on disk asks the hub once, quickly, and
fails within 2 s with the hint when it cannot be reached (HF_HUB_OFFLINE=1: without asking);
tiny-bert, which has no weights anywhere, builds without --random-weights and without the
network. The hub is made unreachable by pointing HF_ENDPOINT at a closed local port, or at a
port that accepts connections and never answers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT, trtpack


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("offline-cache")


def test_the_offline_hint_comes_at_once_without_the_hub(tmp_path: Path) -> None:
    """A recipe whose weights are not on disk, the hub unreachable (HF_ENDPOINT on a closed
    local port), HF_HUB_OFFLINE unset: exit 3 with the hint, without the loader's retries."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again once the block ends
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HUB_CACHE": str(tmp_path / "hub"),
           "HF_HUB_OFFLINE": ""}
    baseline = _timed(lambda: trtpack("build", "minlm", env=env))[0]  # start-up and resolving
    seconds, result = _timed(lambda: trtpack("build", "bert-base", "--target", "cpu", "--out",
                                             str(tmp_path / "out"), env=env))
    assert result.returncode == 3, result.stderr
    assert "cannot load weights of 'google-bert/bert-base-uncased'" in result.stderr
    assert f"the hub at http://127.0.0.1:{port} cannot be reached" in result.stderr
    assert "hint: this machine may be offline: add --random-weights" in result.stderr
    assert seconds - baseline < 2.0, (seconds, baseline)
    offline = trtpack("build", "bert-base", "--target", "cpu", "--out", str(tmp_path / "out"),
                      env={**env, "HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 3 and "HF_HUB_OFFLINE is set" in offline.stderr


@pytest.fixture
def silent_hub() -> Iterator[str]:
    """A hub that accepts connections and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_hub_that_never_answers_is_given_up_within_two_seconds(silent_hub: str,
                                                                 tmp_path: Path) -> None:
    from trtpack.errors import MissingEnvironmentError
    from trtpack.pytorch.models import HUB_PROBE_SECONDS

    code = ("import time; from trtpack.pytorch.models import require_hub_weights\n"
            "t = time.perf_counter()\n"
            "try:\n    require_hub_weights('google-bert/bert-base-uncased')\n"
            "except Exception as e:\n    print(type(e).__name__, time.perf_counter() - t)\n")
    env = {**os.environ, "HF_ENDPOINT": silent_hub, "HF_HUB_CACHE": str(tmp_path / "hub"),
           "HF_HUB_OFFLINE": "", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=60, check=True).stdout.split()
    assert out[0] == MissingEnvironmentError.__name__
    assert HUB_PROBE_SECONDS <= float(out[1]) < 2.0


def test_tiny_bert_builds_offline_without_the_flag(tmp_path: Path, shared_cache: Path) -> None:
    """'for tests; random weights': it has no weights, so it needs no flag and no network."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HUB_OFFLINE": ""}
    code = ("import time; from trtpack.api import BuildRequest, resolve_options\n"
            "t = time.perf_counter()\n"
            "options, _ = resolve_options(BuildRequest('tiny-bert', target='cpu'))\n"
            "print(options.random_weights, time.perf_counter() - t)\n")
    resolved = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, **env, "PYTHONPATH": str(ROOT)}, timeout=60,
                              check=True).stdout.split()
    assert resolved[0] == "True" and float(resolved[1]) < 2.0, resolved
    out = tmp_path / "out"
    result = trtpack("build", "tiny-bert", "--target", "cpu", "--out", str(out), "--cache-dir",
                     str(shared_cache), env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    export = next(s for s in report["stages"] if s["name"] == "export")
    assert export["metrics"]["weights"] == "random"


def _timed(run):  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    result = run()
    return time.perf_counter() - start, result
