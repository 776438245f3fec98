"""Runs a build: the stages in order (``pipeline.stage_runs`` plans, reuses from the cache,
runs and measures each) and the output written atomically.

Data flows one way: recipe -> ONNX (export) -> simplified ONNX -> verified against PyTorch ->
precision ONNX -> engine -> Triton model repository. Each stage runs in its own folder
``OUT/artifacts/<stage>/`` and returns a ``StageOutcome``, which becomes a ``StageResult``
in the report. The build is written to a temporary folder beside OUT and
renamed into place at the end: an error keeps it as ``OUT.failed`` (with its report), an
interruption (Ctrl-C, SIGTERM) removes it, and an earlier OUT stays intact until the rename.
One build writes an OUT at a time (``out_files.out_lock``), and only trtpack's files of an
earlier build there are replaced (``out_files.replace_out``).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trtpack.errors import (
    AccuracyError,
    MemoryRefusal,
    StageError,
    TrtpackError,
    UserInputError,
    no_space_cause,
)
from trtpack.options import BuildPlan
from trtpack.out_files import (
    ARTIFACTS,
    LOGS,
    RECIPE_FILE,
    build_files,
    files_under,
    folder_error,
    out_lock,
    replace_out,
    stale_siblings,
    write_manifest,
)
from trtpack.pipeline.build_folder import write_recipe, write_report_page
from trtpack.pipeline.cache import tool_versions
from trtpack.pipeline.faults import disk_full_error
from trtpack.pipeline.isolate import StageProcess
from trtpack.pipeline.stage import STAGES
from trtpack.pipeline.stage_runs import StageRuns
from trtpack.report import REPORT, BuildReport, StageResult, VerificationRow
from trtpack.stages.artifacts import Artifacts
from trtpack.stages.base import ProgressCallback, ProgressEvent


@dataclass(frozen=True)
class FinishedStage:
    """A stage another build ran (``pipeline.engine_from_build``): its result, its folder and
    the artifacts the later stages read, copied into this build instead of run again."""

    result: StageResult
    folder: Path  # the other build's artifacts/<stage>
    artifacts: Artifacts  # paths inside ``folder``
    log: Path | None = None

    @property
    def key(self) -> str:
        """What the later stages' cache keys chain on: the sha256 of its files."""
        return ",".join(sorted(a.sha256 for a in self.result.artifacts))


class Pipeline:
    def __init__(self, plan: BuildPlan, progress: ProgressCallback | None = None,
                 warnings: Sequence[str] = (), finished: Sequence[FinishedStage] = (),
                 finished_rows: Sequence[VerificationRow] = ()) -> None:
        self.plan = plan
        self.progress: ProgressCallback = progress or (lambda event: None)
        self.warnings = list(warnings)  # about the request, first in the report
        self._report: BuildReport | None = None
        self.stages = StageRuns(plan, self.progress, self._warn)
        # stages another build ran, copied in (their verification rows come with them)
        self.finished = {f.result.name: f for f in finished}
        self.finished_rows = list(finished_rows)
        self.current_stage: str | None = None

    @property
    def processes(self) -> dict[str, StageProcess]:
        """The stage processes alive now (each ends with its stage or with the build)."""
        return self.stages.processes

    def _warn(self, message: str) -> None:
        """A warning about the build as a whole (the remote cache failing), said once: in
        the report, and now."""
        if self._report is not None:
            self._report.warnings.append(message)
        self.progress(ProgressEvent("", "notice", f"warning: {message}"))

    def _notice(self, message: str) -> None:
        self.progress(ProgressEvent("", "notice", message))

    def run(self) -> BuildReport:
        o = self.plan
        out = o.out_dir.resolve()
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # a parent that is a file, a read-only place
            raise folder_error(out, "--out", e) from e
        with out_lock(out, self._notice):
            for stale in stale_siblings(out):  # what killed builds of this OUT left
                shutil.rmtree(stale, ignore_errors=True)
            if out.is_dir() and build_files(out) is None and any(out.iterdir()) \
                    and not o.force:
                raise UserInputError(
                    f"--out '{out}' is a folder with files trtpack did not write (not a trtpack "
                    "build); choose another --out, or add --force to build beside them (they "
                    "are kept)")
            return self._run(out)

    def _run(self, out: Path) -> BuildReport:
        o = self.plan
        work = out.with_name(f".{out.name}.partial-{os.getpid()}")
        failed_dir = out.with_name(out.name + ".failed")
        if failed_dir.exists() and build_files(failed_dir) is None:
            failed_dir = out.with_name(f"{out.name}.failed-{os.getpid()}")  # not ours: kept
        report = BuildReport(
            model=o.name, precision=o.precision, target=o.target.name,
            profiles=[str(p) for p in o.profiles], out_dir=str(out),
            versions=tool_versions(), warnings=list(self.warnings),
        )
        self._report = report
        started = time.perf_counter()
        try:
            try:
                shutil.rmtree(work, ignore_errors=True)
                work.mkdir()
                self._run_stages(work, report)
                self.stages.end()
                report.name_served_precision(cpu_model_served=not o.target.is_gpu)
                report.total_seconds = time.perf_counter() - started
                peaks = [s.peak_memory_mb for s in report.stages if s.peak_memory_mb is not None]
                report.peak_memory_mb = max(peaks) if peaks else None
                report.save(work / REPORT)
                write_recipe(work / RECIPE_FILE, o.recipe, o.sample_inputs)
                write_report_page(work, report)
            except Exception as e:
                full = no_space_cause(e)
                if full is None:
                    raise
                self.stages.end(failed=True)
                raise disk_full_error(full, self.plan, work, out,
                                      self.current_stage) from e
        except MemoryRefusal:  # refused before the work started, as the pre-check refuses
            self.stages.end(failed=True)
            shutil.rmtree(work, ignore_errors=True)
            raise
        except TrtpackError as e:
            self.stages.end(failed=True)
            if isinstance(e, StageError) and e.log_path is not None \
                    and e.log_path.is_relative_to(work):
                e.log_path = failed_dir / e.log_path.relative_to(work)
            report.status = "accuracy_failed" if isinstance(e, AccuracyError) else "failed"
            report.error = str(e)
            report.total_seconds = time.perf_counter() - started
            report.out_dir = str(failed_dir)
            try:
                report.save(work / REPORT)
                write_report_page(work, report)
                write_manifest(work, files_under(work))
            except OSError as saving:  # the disk is full even for the report: nothing stays
                if no_space_cause(saving) is None:
                    raise
                shutil.rmtree(work, ignore_errors=True)
                if isinstance(e, StageError):
                    e.log_path = None
                raise
            if build_files(failed_dir) is not None:  # an earlier failure of ours
                shutil.rmtree(failed_dir, ignore_errors=True)
            work.rename(failed_dir)
            e.report = report
            raise
        except BaseException:  # Ctrl-C, SIGTERM, a bug: nothing of this build stays
            self.stages.end(failed=True)
            shutil.rmtree(work, ignore_errors=True)
            raise
        replaced = replace_out(work, out)
        if replaced:
            self._notice(replaced)
        failed_dir = out.with_name(out.name + ".failed")
        if build_files(failed_dir) is not None:  # only a folder trtpack made
            shutil.rmtree(failed_dir, ignore_errors=True)
        return report

    def _run_stages(self, work: Path, report: BuildReport) -> None:
        o = self.plan
        artifacts = Artifacts()
        # each stage's artifacts as it started, and what it made (a late download recomposes)
        before: dict[str, Artifacts] = {}
        made_by: dict[str, Artifacts] = {}
        logs = work / LOGS
        logs.mkdir()
        order = self.stages.planned_stages({name: f.key for name, f in self.finished.items()})
        planned = {p.stage.name: p for p in order}
        if order:
            self.stages.start_ahead(order[0], logs)
        report.verification.extend(self.finished_rows)
        for stage in STAGES:
            if not stage.applies(o):
                continue
            if stage.name in self.finished:
                artifacts = self._copy_finished(self.finished[stage.name], work, artifacts,
                                                report)
                continue
            reason = stage.skip_reason(o)
            if reason is not None:
                result = StageResult(stage.name, "skipped", message=reason)
                report.stages.append(result)
                self.progress(ProgressEvent(stage.name, "end", reason, result))
                continue
            plan = planned[stage.name]
            if not plan.cached:
                self.stages.start_ahead(plan, logs)
            self.stages.head_start_next(plan, artifacts, work, logs)
            stage_dir = work / ARTIFACTS / stage.name
            self.current_stage = stage.name
            stage_dir.mkdir(parents=True, exist_ok=True)  # a head start may have made it
            self.progress(ProgressEvent(stage.name, "start"))
            log_path = logs / f"{stage.name}.log"
            before[stage.name] = artifacts
            reused = None
            discarded = plan.discarded
            if plan.cached:
                reused, discarded = self.stages.reuse(stage, plan, stage_dir)
            if reused is None:
                if discarded is not None and plan.cached:
                    # a damaged entry: this stage and the next run again
                    plan.cached = False
                    for later in order[order.index(plan) + 1:]:
                        later.cached = later.cached and (later.remote is not None or
                                                         self.stages.cache.has(
                                                             later.stage.name, later.key))
                    self.stages.start_ahead(plan, logs)
                    fetched = self.stages.inputs_after_damage(plan, work)
                    if fetched:  # in stage order again, the files downloaded now in place
                        first = next(n for n in made_by if n in fetched)
                        artifacts = before[first]
                        for name in list(made_by)[list(made_by).index(first):]:
                            made_by[name] = fetched.get(name, made_by[name])
                            artifacts = artifacts.merged(made_by[name])
                result, rows, made = self.stages.execute(stage, plan, stage_dir, artifacts,
                                                         work, log_path)
                artifacts = artifacts.merged(made)
                made_by[stage.name] = made
                if discarded is not None:
                    result.warnings.insert(0, f"cache entry {discarded}; discarded, "
                                              f"{stage.name} ran again")
            else:
                result, rows, made = reused
                artifacts = artifacts.merged(made)
                made_by[stage.name] = made
                log_path.write_text(f"reused from cache key {plan.key}\n")
            result.log_path = str(log_path.relative_to(work))
            if not any(stage_dir.iterdir()):
                stage_dir.rmdir()
            failed = [r for r in rows if not r.passed]
            if stage.gated and failed:  # its checks failed: the stage did not succeed
                result.status = "failed"
                result.message += f"; {len(failed)} of {len(rows)} verification checks failed"
            report.stages.append(result)
            report.verification.extend(rows)
            report.warnings.extend(result.warnings)
            self.progress(ProgressEvent(stage.name, "end", result.message, result))
            if stage.gated and failed:
                raise AccuracyError(
                    f"{stage.name}: {len(failed)} of the verification checks failed", failed
                )


    def _copy_finished(self, finished: FinishedStage, work: Path, artifacts: Artifacts,
                       report: BuildReport) -> Artifacts:
        """The stage another build ran, copied in; ``artifacts`` with its artifacts."""
        stage_dir = work / ARTIFACTS / finished.result.name
        shutil.copytree(finished.folder, stage_dir)  # copies: onnx refuses linked weights
        log_path = work / LOGS / f"{finished.result.name}.log"
        if finished.log is not None and finished.log.is_file():
            shutil.copyfile(finished.log, log_path)
        result = dataclasses.replace(
            finished.result, log_path=str(log_path.relative_to(work)),
            message=f"{finished.result.message} (copied from {finished.folder.parent.parent})")
        report.stages.append(result)
        report.warnings.extend(result.warnings)
        self.progress(ProgressEvent(result.name, "end", result.message, result))
        return artifacts.merged(finished.artifacts.moved(finished.folder, stage_dir))


def build(plan: BuildPlan, progress: ProgressCallback | None = None,
          warnings: Sequence[str] = ()) -> BuildReport:
    """Run the whole pipeline; raises ``TrtpackError`` (with ``.report``) on failure.
    ``warnings`` (about the request) come first in the report."""
    return Pipeline(plan, progress, warnings).run()
