"""A stage process started ahead of its turn imports behind the stage that runs
(``isolate.import_behind``, issue 47): on a thread of its own, nicer, with the process's
autogroup nicer where it leads its session, until its job comes; then the autogroup is as it
was and what is left imports on the main thread at the process's own priority. The build
tells the processes it starts beside a running stage that they are ahead, and only those."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import python_path
from trtpack.api import BuildRequest, resolve_options
from trtpack.pipeline import isolate
from trtpack.pipeline.isolate import BEHIND_NICENESS
from trtpack.pipeline.stage_runs import SMALL_MODEL_BYTES, StageRuns
from trtpack.processes import AUTOGROUP
from trtpack.resources import ResourceMeter

# a warm module that writes where, and at which priorities, it was imported
RECORDING_MODULE = """
import json, os, sys, threading
from trtpack.processes import autogroup_nice
thread = threading.current_thread()
record = {"module": __name__, "thread": thread.name,
          "main": thread is threading.main_thread(),
          "nice": os.getpriority(os.PRIO_PROCESS, threading.get_native_id()),
          "group": autogroup_nice()}
with open(os.environ["RECORDS"], "a") as out:
    out.write(json.dumps(record) + "\\n")
"""

# the stage process's side: its warm imports behind, then the autogroup once they are done
BEHIND = """
import json, os, sys, types
from multiprocessing import Pipe
from trtpack.pipeline.isolate import import_behind
from trtpack.pipeline.stage import Stage
from trtpack.processes import autogroup_nice
jobs, build = Pipe(duplex=False)
if os.environ.get("JOB_AFTER"):  # the job comes while that module imports
    import sender
    sender.build = build
before = autogroup_nice()
stage = Stage("verify", "stage_module", isolated=True, warm_modules=("first", "second"))
module = types.ModuleType("stage_module")
module.preload = lambda: __import__("preloaded")
import_behind(stage, module, jobs)
print(json.dumps({"before": before, "after": autogroup_nice(),
                  "pid_nice": os.getpriority(os.PRIO_PROCESS, 0)}))
"""


def _run_behind(tmp_path: Path, job_after: str | None = None
                ) -> tuple[dict[str, object], dict[str, dict[str, object]]]:
    modules = tmp_path / "modules"
    modules.mkdir()
    for name in ("first", "second", "preloaded"):
        sends = "import sender\nsender.build.send('job')\n" if name == job_after else ""
        (modules / f"{name}.py").write_text(RECORDING_MODULE + sends)
    (modules / "sender.py").write_text("build = None\n")
    records = tmp_path / "records.jsonl"
    env = {**os.environ, "PYTHONPATH": f"{modules}{os.pathsep}{python_path()}",
           "RECORDS": str(records), "JOB_AFTER": job_after or ""}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(BEHIND)], env=env,
                          capture_output=True, text=True, timeout=120,
                          start_new_session=True)  # as a stage process: a session of its own
    assert done.returncode == 0, done.stderr
    imported = [json.loads(line) for line in records.read_text().splitlines()]
    return json.loads(done.stdout), {r["module"]: r for r in imported}


def test_warm_imports_run_behind_on_a_nicer_thread_and_the_group_is_restored(
        tmp_path: Path) -> None:
    result, imported = _run_behind(tmp_path)
    assert list(imported) == ["first", "second", "preloaded"]  # the preload after the modules
    base = result["pid_nice"]
    assert isinstance(base, int)
    for record in imported.values():
        assert record["thread"] == "trtpack-imports-behind"
        assert record["nice"] == min(19, base + BEHIND_NICENESS)
    if result["before"] is None:  # no autogroups here: the thread's nice value alone
        assert not AUTOGROUP.exists() or all(r["group"] is None for r in imported.values())
        return
    before = result["before"]
    assert isinstance(before, int)
    # the process's autogroup was nicer while it imported, and is as it was after
    assert all(r["group"] == min(19, before + BEHIND_NICENESS) for r in imported.values())
    assert result["after"] == before


def test_the_job_arriving_hands_the_rest_of_the_imports_to_the_main_thread(
        tmp_path: Path) -> None:
    result, imported = _run_behind(tmp_path, job_after="first")
    assert imported["first"]["thread"] == "trtpack-imports-behind"
    base = result["pid_nice"]
    for name in ("second", "preloaded"):  # at the process's own priority, on its thread
        assert imported[name]["main"] is True
        assert imported[name]["nice"] == base
    assert result["after"] == result["before"]


@pytest.fixture
def prepared(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """Which stage processes the build told they were ahead (``StageProcess.prepare``,
    recorded on the way through)."""
    told: dict[str, bool] = {}
    prepare = isolate.StageProcess.prepare

    def recording(self: isolate.StageProcess, plan: object, build_dir: Path, log_path: Path,
                  ahead: bool = False) -> None:
        told[self.stage.name] = ahead
        prepare(self, plan, build_dir, log_path, ahead)  # type: ignore[arg-type]

    monkeypatch.setattr(isolate.StageProcess, "prepare", recording)
    return told


def test_only_processes_started_beside_a_running_stage_import_behind(
        tmp_path: Path, prepared: dict[str, bool]) -> None:
    plan, _ = resolve_options(BuildRequest(
        model="tiny-bert", profiles=["1x4:2x8:4x16"], precision="fp32", target="cpu",
        random_weights=True, out=tmp_path / "out", cache_dir=tmp_path / "cache",
        use_cache=False))
    runs = StageRuns(plan, lambda event: None)
    planned = runs.planned_stages({})
    export = planned[0]
    logs = tmp_path / "build" / "logs"
    logs.mkdir(parents=True)
    try:
        runs.start_ahead(export, logs)  # the export's own process, and the simplify's beside
        assert prepared == {"export": False, "simplify": True}
        runs.warm_on_spare_core(export, SMALL_MODEL_BYTES, logs, ResourceMeter())
        assert prepared == {"export": False, "simplify": True, "verify": True,
                            "cpu_model": True}
    finally:
        runs.end()
    assert runs.processes == {}
