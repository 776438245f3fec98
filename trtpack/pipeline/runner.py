"""Runs the stages in order, caches their outputs, measures them and writes the output
atomically.

Data flows one way: recipe -> ONNX (export) -> simplified ONNX -> verified against PyTorch ->
precision ONNX -> engine -> Triton model repository. Each stage runs in its own folder
``OUT/artifacts/<stage>/`` and returns a ``StageOutcome``; the runner turns it into a
``StageResult`` in the report. The build is written to a temporary folder beside OUT and
renamed into place at the end: an error keeps it as ``OUT.failed`` (with its report), an
interruption (Ctrl-C, SIGTERM) removes it, and an earlier OUT stays intact until the rename.
One build writes an OUT at a time (``out_files.out_lock``), and only trtpack's files of an
earlier build there are replaced (``out_folder.replace_out``).
"""

from __future__ import annotations

import os
import shutil
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trtpack.errors import (
    AccuracyError,
    StageError,
    StageKilledError,
    TrtpackError,
    UserInputError,
    no_space_cause,
)
from trtpack.options import BuildOptions
from trtpack.out_files import (
    build_files,
    files_under,
    out_lock,
    stale_siblings,
    write_manifest,
)
from trtpack.pipeline.cache import StageCache, relative_artifacts, stage_key, tool_versions
from trtpack.pipeline.faults import disk_full_error, killed_message, oom_kills
from trtpack.pipeline.isolate import StageProcess
from trtpack.pipeline.out_folder import replace_out
from trtpack.pipeline.outputs import (
    RECIPE_FILE,
    artifact_records,
    write_recipe,
    write_report_page,
)
from trtpack.pipeline.stage import STAGES, Stage
from trtpack.report import REPORT, Artifact, BuildReport, StageResult, VerificationRow
from trtpack.resources import ResourceMeter
from trtpack.stages.base import (
    ProgressCallback,
    ProgressEvent,
    StageContext,
    StageOutcome,
    metrics_dict,
    stage_logger,
)


@dataclass
class PlannedStage:
    """A stage of this build with its cache key, known before anything runs."""

    stage: Stage
    module: Any
    key: str
    cached: bool


class Pipeline:
    def __init__(self, options: BuildOptions, progress: ProgressCallback | None = None,
                 warnings: Sequence[str] = ()) -> None:
        self.options = options
        self.progress: ProgressCallback = progress or (lambda event: None)
        self.warnings = list(warnings)  # about the request, first in the report
        self.cache = StageCache(options.cache_dir)
        self.processes: dict[str, StageProcess] = {}
        self.current_stage: str | None = None

    def _notice(self, message: str) -> None:
        self.progress(ProgressEvent("", "notice", message))

    def run(self) -> BuildReport:
        o = self.options
        out = o.out_dir.resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
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
        o = self.options
        work = out.with_name(f".{out.name}.partial-{os.getpid()}")
        failed_dir = out.with_name(out.name + ".failed")
        if failed_dir.exists() and build_files(failed_dir) is None:
            failed_dir = out.with_name(f"{out.name}.failed-{os.getpid()}")  # not ours: kept
        report = BuildReport(
            model=o.name, precision=o.precision, target=o.target.name,
            profiles=[str(p) for p in o.profiles], out_dir=str(out),
            versions=tool_versions(), warnings=list(self.warnings),
        )
        started = time.perf_counter()
        try:
            try:
                shutil.rmtree(work, ignore_errors=True)
                work.mkdir()
                self._run_stages(work, report)
                self._stop_processes()
                report.total_seconds = time.perf_counter() - started
                peaks = [s.peak_memory_mb for s in report.stages if s.peak_memory_mb is not None]
                report.peak_memory_mb = max(peaks) if peaks else None
                report.save(work / REPORT)
                write_recipe(work / RECIPE_FILE, o.recipe)
                write_report_page(work, report)
            except Exception as e:
                full = no_space_cause(e)
                if full is None:
                    raise
                self._stop_processes()
                raise disk_full_error(full, self.options, work, out,
                                      self.current_stage) from e
        except TrtpackError as e:
            self._stop_processes()
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
            self._stop_processes()
            shutil.rmtree(work, ignore_errors=True)
            raise
        replaced = replace_out(work, out)
        if replaced:
            self._notice(replaced)
        failed_dir = out.with_name(out.name + ".failed")
        if build_files(failed_dir) is not None:  # only a folder trtpack made
            shutil.rmtree(failed_dir, ignore_errors=True)
        return report

    def _plan(self, versions: dict[str, str | None]) -> list[PlannedStage]:
        """The stages that will run, each with its key and whether the cache has it."""
        o = self.options
        planned: list[PlannedStage] = []
        upstream = ""
        for stage in STAGES:
            if not stage.applies(o) or stage.skip_reason(o) is not None:
                continue
            module = stage.load()
            upstream = stage_key(stage.name, module.fingerprint(o), upstream, versions)
            cached = stage.cacheable and o.use_cache and self.cache.has(stage.name, upstream)
            planned.append(PlannedStage(stage, module, upstream, cached))
        return planned

    def _start_ahead(self, planned: list[PlannedStage], index: int, logs: Path) -> None:
        """Make sure the process of the stage about to run (``planned[index]``) and those of
        the next isolated stages to run (as many as its ``warm_beside``) exist: they warm up
        while this one runs (the stages after the export are short). Not all at once: each
        warming process holds its imports' memory."""
        ahead = [p for p in planned[index:] if p.stage.isolated and not p.cached]
        beside = planned[index].stage.warm_beside
        wanted = ahead[:beside + 1] if ahead and ahead[0] is planned[index] else ahead[:beside]
        for p in wanted:
            if p.stage.name not in self.processes:
                self.processes[p.stage.name] = StageProcess(
                    p.stage, logs / f"{p.stage.name}.log", self.options, logs.parent)

    def _stop_processes(self) -> None:
        for process in self.processes.values():
            process.stop()
        self.processes.clear()

    def _run_stages(self, work: Path, report: BuildReport) -> None:
        o = self.options
        artifacts: dict[str, Path] = {}
        logs = work / "logs"
        logs.mkdir()
        order = self._plan(report.versions)
        planned = {p.stage.name: p for p in order}
        self._start_ahead(order, 0, logs)
        for stage in STAGES:
            if not stage.applies(o):
                continue
            reason = stage.skip_reason(o)
            if reason is not None:
                result = StageResult(stage.name, "skipped", message=reason)
                report.stages.append(result)
                self.progress(ProgressEvent(stage.name, "end", reason, result))
                continue
            plan = planned[stage.name]
            if not plan.cached:
                self._start_ahead(order, order.index(plan), logs)
            stage_dir = work / "artifacts" / stage.name
            self.current_stage = stage.name
            stage_dir.mkdir(parents=True)
            self.progress(ProgressEvent(stage.name, "start"))
            log_path = logs / f"{stage.name}.log"
            discarded: str | None = None
            reused = None
            if plan.cached:
                reused, discarded = self._reuse(stage, plan.key, stage_dir, artifacts)
            if reused is None:
                if discarded is not None:  # a damaged entry: this stage and the next run again
                    plan.cached = False
                    for later in order[order.index(plan) + 1:]:
                        later.cached = later.cached and self.cache.has(later.stage.name,
                                                                       later.key)
                    self._start_ahead(order, order.index(plan), logs)
                result, rows = self._execute(stage, plan, stage_dir, artifacts, work, log_path)
                if discarded is not None:
                    result.warnings.insert(0, f"cache entry {discarded}; discarded, "
                                              f"{stage.name} ran again")
            else:
                result, rows = reused
                log_path.write_text(f"reused from cache key {plan.key}\n")
            result.log_path = str(log_path.relative_to(work))
            if not any(stage_dir.iterdir()):
                stage_dir.rmdir()
            report.stages.append(result)
            report.verification.extend(rows)
            report.warnings.extend(result.warnings)
            self.progress(ProgressEvent(stage.name, "end", result.message, result))
            failed = [r for r in rows if not r.passed]
            if stage.gated and failed:
                raise AccuracyError(
                    f"{stage.name}: {len(failed)} of the verification checks failed", failed
                )

    def _reuse(self, stage: Stage, key: str, stage_dir: Path, artifacts: dict[str, Path]
               ) -> tuple[tuple[StageResult, list[VerificationRow]] | None, str | None]:
        """The cached result (or None), and why the entry was discarded (or None)."""
        started = time.perf_counter()
        loaded = self.cache.load(stage.name, key, stage_dir)
        meta = loaded.meta
        if meta is None:
            return None, loaded.discarded
        self.cache.touch(stage.name, key)
        for name, rel in meta["artifacts"].items():
            artifacts[name] = stage_dir / rel
        result = StageResult(**meta["result"])
        result.artifacts = [Artifact(**a) for a in meta["records"]]
        result.cached = True
        result.seconds = time.perf_counter() - started
        result.peak_memory_mb = None
        return (result, [VerificationRow(**r) for r in meta.get("verification", [])]), None

    def _execute(self, stage: Stage, plan: PlannedStage, stage_dir: Path,
                 artifacts: dict[str, Path], work: Path, log_path: Path
                 ) -> tuple[StageResult, list[VerificationRow]]:
        logger, handler = stage_logger(f"trtpack.stage.{stage.name}.{id(self)}", log_path)
        ctx = StageContext(self.options, stage.name, stage_dir, work, dict(artifacts), logger,
                           self.progress)
        if stage.isolated and stage.name not in self.processes:
            # planned as cached, but the entry went away
            self.processes[stage.name] = StageProcess(stage, log_path, self.options, work)
        process = self.processes.get(stage.name)
        # the processes warming up for later stages are not this stage's memory
        meter = ResourceMeter(exclude={p.pid for p in self.processes.values()
                                       if p is not process})
        oom_before = oom_kills()
        try:
            with meter:
                outcome: StageOutcome = (process.run(ctx, log_path) if process is not None
                                         else plan.module.run(ctx))
            self.processes.pop(stage.name, None)
        except (TrtpackError, KeyboardInterrupt, SystemExit):
            logger.error("".join(traceback.format_exc()))
            raise
        except StageKilledError as e:
            message = killed_message(stage.name, e.signal_number, oom_before, oom_kills(),
                                     meter.peak_mb)
            logger.error(message)
            raise StageError(stage.name, message, log_path=log_path) from None
        except Exception as e:
            if no_space_cause(e) is not None:
                raise  # the runner says it in words (_disk_full)
            logger.error("".join(traceback.format_exc()))
            raise StageError(stage.name, f"{type(e).__name__}: {e}",
                             log_path=log_path) from e
        finally:
            logger.removeHandler(handler)
            handler.close()
        artifacts.update(outcome.artifacts)
        result = StageResult(
            stage.name, outcome.status, seconds=meter.seconds, peak_memory_mb=meter.peak_mb,
            message=outcome.message, metrics=metrics_dict(outcome.metrics),
            warnings=outcome.warnings,
            artifacts=artifact_records(outcome.artifacts, stage_dir, work),
        )
        if stage.cacheable and self.options.use_cache and outcome.status == "ok" and all(
            r.passed for r in outcome.verification
        ):
            meta = {
                "artifacts": relative_artifacts(outcome.artifacts, stage_dir),
                "records": [asdict(a) for a in result.artifacts],
                "result": {k: v for k, v in asdict(result).items()
                           if k not in ("artifacts", "cached", "log_path")},
                "verification": [asdict(r) for r in outcome.verification],
            }
            self.cache.store(stage.name, plan.key, stage_dir, meta)
        return result, outcome.verification


def build(options: BuildOptions, progress: ProgressCallback | None = None,
          warnings: Sequence[str] = ()) -> BuildReport:
    """Run the whole pipeline; raises ``TrtpackError`` (with ``.report``) on failure.
    ``warnings`` (about the request) come first in the report."""
    return Pipeline(options, progress, warnings).run()
