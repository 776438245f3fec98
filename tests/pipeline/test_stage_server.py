"""Stage processes forked from a stage server's warm templates (``pipeline.stage_server``):
the same artifacts as fresh processes, killed with the build, and a fresh process whenever
the server cannot serve (gone, refusing a build's environment, or threaded)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import (
    ROOT,
    environment_kept,
    python_path,
    sigint_as_default,
    start_stage_server,
    stop_stage_server,
    wait_for_templates,
    without_stage_server,
)
from trtpack.pipeline.prestart import start_stage_process
from trtpack.pipeline.served_environment import CALL_TIME_VARIABLES, environment_difference
from trtpack.pipeline.served_workers import template_directory
from trtpack.pipeline.stage_server import served_in_log
from trtpack.precision.modelopt_jobs import WORKER_TEMPLATE, ModelOptWorker
from trtpack.processes import STAGE_SERVER_ENV, ServedProcess
from trtpack.pytorch.describe_process import DESCRIBE_TEMPLATE, describe_in_process

# every stage a process serves: export, simplify, verify, precision (FP16, with its ModelOpt
# worker, served by the modelopt template), cpu_model (the CPU fallback, with its head start
# beside verify)
BUILD = ("build", "tiny-bert", "--random-weights", "--target", "g5", "--no-engine",
         "--precision", "fp16", "--fallback-cpu", "--no-cache")
SERVED_STAGES = ("export", "simplify", "verify", "precision", "cpu_model")
SERVED = (*SERVED_STAGES, WORKER_TEMPLATE)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A stage server of this module's own (its log says what it served), in the tests'
    environment (PYTHONPATH as ``trtpack(...)`` sets it)."""
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="trtpack-stages-test-"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", python_path())
        process = start_stage_server(folder)
        try:
            wait_for_templates(folder, (*SERVED, DESCRIBE_TEMPLATE))
            yield folder
        finally:
            stop_stage_server(process, folder)


def served_pids(folder: Path) -> dict[str, list[int]]:
    """stage -> the pids its template served, from the server's log."""
    found: dict[str, list[int]] = {}
    for stage, pid in served_in_log(Path(f"{folder}.log").read_text(errors="replace")):
        found.setdefault(stage, []).append(pid)
    return found


def environment(server: Path | None) -> dict[str, str]:
    env = without_stage_server({**os.environ, "PYTHONPATH": python_path()})
    return env if server is None else {**env, STAGE_SERVER_ENV: str(server)}


def digests(out: Path) -> dict[str, str]:
    """sha256 of every file a build made (its logs and report hold times: not compared)."""
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for folder in ("artifacts", "model_repository") for p in sorted((out / folder)
                                                                          .rglob("*"))
            if p.is_file()}


def test_a_build_through_the_server_is_byte_identical_to_one_without(
        server: Path, tmp_path: Path) -> None:
    outs = {}
    for name, through in (("served", server), ("fresh", None)):
        before = served_pids(server)
        outs[name] = tmp_path / name
        done = subprocess.run([sys.executable, "-m", "trtpack.cli", *BUILD,
                               "--out", str(outs[name])], env=environment(through),
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr
        now = served_pids(server)
        served = {s for s in now if len(now[s]) > len(before.get(s, []))}
        assert served == (set(SERVED) if through else set()), (name, served)
    made = digests(outs["served"])
    assert len(made) > 10 and any(f.endswith("model.onnx") for f in made)
    assert made == digests(outs["fresh"])
    # the served ModelOpt worker is no child of the precision stage's process, yet counted in
    # its memory as a fresh one is (torch and ModelOpt, ~400 MB: left uncounted, the peak
    # is the stage process's alone, about a third of the fresh build's)
    peaks = {name: next(s["peak_memory_mb"] for s in json.loads(
        (out / "report.json").read_text())["stages"] if s["name"] == "precision")
        for name, out in outs.items()}
    assert peaks["served"] > 0.55 * peaks["fresh"], peaks
    # ModelOpt wrote nothing where its template stands (each job ran in its own folder)
    assert list(template_directory(server, WORKER_TEMPLATE).iterdir()) == []


FACTORY = """import torch


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)

    def forward(self, x, scale: float = 1.0):
        return {"scores": self.lin(x) * scale}


def make():
    return Small().eval(), (torch.randn(3, 4),)
"""


def test_a_pytorch_source_is_described_by_the_server_as_by_a_fresh_process(
        server: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The description of a user's factory (its inputs, outputs named from its return, dim
    ranges, files) from the ``describe`` template's fork is the one a fresh process gives; the
    user's module was imported in that fork only."""
    from trtpack.pipeline.cache import source_digest

    (tmp_path / "small.py").write_text(FACTORY)
    request = {"source": {"factory": f"{tmp_path / 'small.py'}:make"}, "inputs": {},
               "arguments": {"scale": 2.0}, "trtpack": source_digest()}
    monkeypatch.setenv("PYTHONPATH", python_path())
    described = {}
    for name, through in (("served", server), ("fresh", None)):
        monkeypatch.setenv(STAGE_SERVER_ENV, str(through or ""))
        before = served_pids(server).get(DESCRIBE_TEMPLATE, [])
        described[name] = describe_in_process(request, tmp_path / f"cache-{name}")
        now = served_pids(server).get(DESCRIBE_TEMPLATE, [])
        assert len(now) == len(before) + (1 if through else 0), name
    assert described["served"] == described["fresh"]
    assert [o["name"] for o in described["served"]["outputs"]] == ["scores"]  # type: ignore
    assert "small" not in sys.modules  # the user's code ran in the describing processes only
    assert list(template_directory(server, DESCRIBE_TEMPLATE).iterdir()) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "kill-9"])
def test_a_served_stage_process_ends_with_the_build(server: Path, tmp_path: Path,
                                                    signum: int) -> None:
    """Interrupted (the runner ends the stage's group) or killed outright (the server kills
    it when the build's connection closes): the served export process and everything in its
    group end with the build."""
    out = tmp_path / "out"
    before = set(served_pids(server).get("export", []))
    proc = subprocess.Popen([sys.executable, "-m", "trtpack.cli", *BUILD, "--out", str(out)],
                            env=environment(server), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, preexec_fn=sigint_as_default)
    try:
        stage = out.with_name(f".{out.name}.partial-{proc.pid}") / "artifacts" / "export"
        deadline = time.monotonic() + 300
        while not stage.is_dir() or not set(served_pids(server).get("export", [])) - before:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the served export never started"
            time.sleep(0.05)
        (export,) = set(served_pids(server)["export"]) - before
        os.kill(proc.pid, signum)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == (130 if signum == signal.SIGINT else -signal.SIGKILL)
    deadline = time.monotonic() + 30
    while group_alive(export) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not group_alive(export)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def started_fresh(tmp_path: Path, stage: str = "simplify") -> bool:
    """Whether the stage's process starts fresh (a child of this process) in this
    environment, rather than from a server; it is ended either way."""
    started = start_stage_process(stage, tmp_path / f"{stage}.log")
    try:
        return not isinstance(started.process, ServedProcess)
    finally:
        started.stop()


def worker_started_fresh(tmp_path: Path) -> bool:
    """Whether an FP16 ModelOpt worker starts fresh in this environment, rather than from the
    server's ``modelopt`` template; it is ended either way."""
    worker = ModelOptWorker("fp16", tmp_path)
    try:
        return not worker.served
    finally:
        worker.close()


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_templates_hold_onnx_runtime_and_onnxsim(server: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """ONNX Runtime imported with its telemetry off starts no thread, so the templates of the
    stages that use it hold it (and simplify's onnxsim) and serve: what a fresh process
    imports while it warms up, a served one finds imported. Its process is the child of a
    monitor, the template's child."""
    monkeypatch.setenv("PYTHONPATH", python_path())
    monkeypatch.setenv(STAGE_SERVER_ENV, str(server))
    for stage, held in (("simplify", ("libonnxruntime", "onnxsim_cpp2py_export")),
                        ("verify", ("libonnxruntime",)), ("cpu_model", ("libonnxruntime",))):
        started = start_stage_process(stage, tmp_path / f"{stage}.log")
        try:
            assert isinstance(started.process, ServedProcess), stage
            maps = Path(f"/proc/{parent(parent(started.process.pid))}/maps").read_text()
            assert [lib for lib in held if lib not in maps] == [], stage
        finally:
            started.stop()


def test_with_the_server_gone_a_stage_process_starts_fresh(
        server: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", python_path())
    monkeypatch.setenv(STAGE_SERVER_ENV, str(server))
    assert not started_fresh(tmp_path)  # served: the test can tell
    monkeypatch.setenv(STAGE_SERVER_ENV, str(tmp_path / "no-server"))  # no folder
    assert started_fresh(tmp_path)
    gone = tmp_path / "gone"
    gone.mkdir()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stale.bind(str(gone / "simplify.sock"))  # a socket file nobody listens on
    stale.close()
    monkeypatch.setenv(STAGE_SERVER_ENV, str(gone))
    assert started_fresh(tmp_path)


def test_a_build_environment_the_imports_may_have_read_is_refused(
        server: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", python_path())
    monkeypatch.setenv(STAGE_SERVER_ENV, str(server))
    monkeypatch.setenv("TRTPACK_MEMORY_AVAILABLE", "64G")  # read when a stage runs
    assert not started_fresh(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # read by torch's import
    assert started_fresh(tmp_path)
    assert "simplify refused: the build's OMP_NUM_THREADS differs" in Path(
        f"{server}.log").read_text()
    assert environment_difference({"A": "1", "PWD": "/x"}, {"A": "1", "PWD": "/y"}) is None
    assert environment_difference({"A": "1"}, {}) == "A"


def test_aws_variables_are_served_while_no_template_imported_botocore(
        server: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A remote-cache build's AWS_* variables (read by botocore when a client is made, never
    at import) are served by templates that did not import botocore (none of the suite's
    server's), and refused by one that did."""
    monkeypatch.setenv("PYTHONPATH", python_path())
    monkeypatch.setenv(STAGE_SERVER_ENV, str(server))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a-key-the-template-never-saw")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    assert [stage for stage in SERVED_STAGES if started_fresh(tmp_path, stage)] == []
    assert not worker_started_fresh(tmp_path)  # ModelOpt does not import botocore either
    log = Path(f"{server}.log").read_text(errors="replace")
    assert "refused: the build's AWS_" not in log
    assert environment_difference({"AWS_REGION": "x"}, {}, ["numpy", "torch.nn"]) is None
    assert environment_difference({"AWS_REGION": "x"}, {}, ["botocore.session"]) == \
        "AWS_REGION"
    assert environment_difference({"AWSOME": "x"}, {}, []) == "AWSOME"


def test_what_a_library_writes_to_the_environment_does_not_outlive_its_test(
        server: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """scikit-learn's import sets ``KMP_DUPLICATE_LIB_OK`` in the importing process: in the
    pytest process, every later build would be refused. ``environment_kept`` (the
    ``environment_restored`` fixture around every test) takes it out again."""
    monkeypatch.setenv("PYTHONPATH", python_path())
    monkeypatch.setenv(STAGE_SERVER_ENV, str(server))
    name = "SOME_LIBRARY_SETTING"  # as sklearn/__init__.py sets its variable
    with environment_kept():
        os.environ.setdefault(name, "True")
        os.environ["HOME"] = str(tmp_path)
        assert started_fresh(tmp_path)
    assert name not in os.environ and os.environ["HOME"] != str(tmp_path)
    assert not started_fresh(tmp_path)


def test_torch_compiler_cache_folder_set_in_the_build_is_served(
        server: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch sets ``TORCHINDUCTOR_CACHE_DIR`` in the process that uses it (a user's script that
    ran torch.export before its build): the export's template, whose imports set the same
    value, serves it, and so do the templates without torch; another value is refused where
    torch was imported."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("PYTHONPATH", python_path())
    monkeypatch.setenv(STAGE_SERVER_ENV, str(server))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.path.abspath(default_cache_dir()))
    assert [stage for stage in SERVED_STAGES if started_fresh(tmp_path, stage)] == []
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert [stage for stage in SERVED_STAGES if started_fresh(tmp_path, stage)] == ["export"]
    # ModelOpt's template imported torch but not its compiler (torch._inductor), the one
    # reader of the folder: served (a fresh worker would read the same build's value)
    assert not worker_started_fresh(tmp_path)
    inductor = {"TORCHINDUCTOR_CACHE_DIR": "/elsewhere"}
    assert environment_difference(inductor, {}, ["torch", "torch.nn"]) is None
    assert environment_difference(inductor, {}, ["torch", "torch._inductor.config"]) == \
        "TORCHINDUCTOR_CACHE_DIR"
    assert environment_difference({"TORCHINDUCTOR_FX_GRAPH_CACHE": "0"}, {}, ["torch"]) == \
        "TORCHINDUCTOR_FX_GRAPH_CACHE"
    assert environment_difference({"TORCHINDUCTOR_FX_GRAPH_CACHE": "0"}, {}, ["numpy"]) is None
    assert environment_difference({"X": "v"}, {}, (), {"X": "v"}) is None
    assert environment_difference({"X": "w"}, {}, (), {"X": "v"}) == "X"


def test_a_template_that_imported_botocore_refuses_another_aws_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", python_path())
    folder = tmp_path / "server"
    process = start_stage_server(folder, "simplify", "--preload", "botocore.session")
    try:
        wait_for_templates(folder, ("simplify",))
        monkeypatch.setenv(STAGE_SERVER_ENV, str(folder))
        assert not started_fresh(tmp_path)
        monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-north-1")
        assert started_fresh(tmp_path)
        assert "simplify refused: the build's AWS_DEFAULT_REGION differs" in Path(
            f"{folder}.log").read_text()
    finally:
        stop_stage_server(process, folder)


def test_a_template_running_threads_refuses_to_serve(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread running in a template after its imports (here one a preloaded module starts)
    would be missing in every fork, its locks possibly held: no socket, and the build's
    stage processes start fresh."""
    (tmp_path / "threaded_import.py").write_text(
        "import threading\nimport time\n\n"
        "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join((str(tmp_path), python_path())))
    folder = tmp_path / "server"
    process = start_stage_server(folder, "simplify", "--preload", "threaded_import")
    try:
        log = Path(f"{folder}.log")
        deadline = time.monotonic() + 120
        while "threads after its imports" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, log.read_text(errors="replace")
            time.sleep(0.1)
        assert "the simplify template runs 2 threads" in log.read_text()
        assert not (folder / "simplify.sock").exists()
        monkeypatch.setenv(STAGE_SERVER_ENV, str(folder))
        assert started_fresh(tmp_path)
    finally:
        stop_stage_server(process, folder)


def test_the_variables_a_build_may_change_are_those_trtpack_reads_when_it_runs() -> None:
    """Every ``TRTPACK_*`` variable the package names is in ``CALL_TIME_VARIABLES`` (a new
    one must be judged: read at call time, or left out so that a build setting it starts
    fresh processes), and the list names none the package does not."""
    named = set()
    for path in (ROOT / "trtpack").rglob("*.py"):
        named |= set(re.findall(r"\bTRTPACK_[A-Z0-9_]+\b", path.read_text()))
    listed = {v for v in CALL_TIME_VARIABLES if v.startswith("TRTPACK_")}
    assert named == listed
