"""The stages of one build: planned with their cache keys before anything runs, their
processes started ahead so they warm up while earlier stages run, and each stage either
reused from the cache or run (in its process, or in this one), measured and stored.

A stage that ran is recorded (its files' sha256 for the report, ``build_folder``) and stored
in the cache (hard links and BLAKE3 hashes) on a thread of this process while the next stage
runs: the hashing does not wait between stages (a large model's weights are hashed twice per
stage that writes them). ``end`` waits for it before the report is written."""

from __future__ import annotations

import contextlib
import shutil
import time
import traceback
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from trtpack.errors import StageError, StageKilledError, TrtpackError, no_space_cause
from trtpack.json_values import json_object
from trtpack.onnx_tools.files import link_tree
from trtpack.options import BuildPlan
from trtpack.out_files import ARTIFACTS
from trtpack.pipeline import keys, prestart
from trtpack.pipeline.build_folder import artifact_records
from trtpack.pipeline.cache import StageCache, relative_artifacts, stage_key
from trtpack.pipeline.cache_records import EntryRecord
from trtpack.pipeline.faults import killed_message, oom_kills
from trtpack.pipeline.isolate import HeadStart, StageProcess
from trtpack.pipeline.planned import PlannedStage, remote_entries_read
from trtpack.pipeline.stage import STAGES, Stage

if TYPE_CHECKING:
    from trtpack.pipeline.remote_cache import RemoteCache
from trtpack.report import Artifact, JsonObject, StageResult, VerificationRow
from trtpack.resources import ResourceMeter
from trtpack.stages.artifacts import Artifacts
from trtpack.stages.base import ProgressCallback, StageContext, StageOutcome, stage_logger

# A stage that has a core to spare (the export, once its PyTorch reference pass is done) lets
# the processes of the next WARM_ON_SPARE_CORE stages start importing on it, when its model's
# weights are at most SMALL_MODEL_BYTES (``StageRuns.warm_on_spare_core``).
SMALL_MODEL_BYTES = 256 * 2**20
WARM_ON_SPARE_CORE = 3


class StageRuns:
    """Runs a build's stages for ``trtpack.pipeline.runner.Pipeline`` (which keeps the OUT
    folder and the report): ``processes`` are the stage processes alive now."""

    def __init__(self, plan: BuildPlan, progress: ProgressCallback,
                 warn: Callable[[str], None] = lambda message: None) -> None:
        self.plan = plan
        self.progress = progress
        self.cache = StageCache(plan.cache_dir)
        self.remote: RemoteCache | None = None
        if plan.cache_url is not None and plan.use_cache:
            from trtpack.pipeline.remote_cache import RemoteCache

            self.remote = RemoteCache(plan.cache_url, self.cache, warn)
        self.processes: dict[str, StageProcess] = {}
        # one stage's records and cache entry at a time, in the order the stages ran
        self._records = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trtpack-records")
        self._pending: list[Future[None]] = []
        # stages whose process got a head start (stage -> its folder), until they run
        self._head_started: dict[str, Path] = {}
        self._planned: list[PlannedStage] = []  # the stages ``planned_stages`` found to run

    def planned_stages(self, finished: Mapping[str, str] | None = None) -> list[PlannedStage]:
        """The stages that will run, each with its key and whether the cache has it.
        ``finished``: stages another build ran (name -> the sha256 of their files), which
        are copied in, not run; the later keys chain on those files."""
        o = self.plan
        planned: list[PlannedStage] = []
        upstream = ""
        for stage in STAGES:
            if not stage.applies(o) or stage.skip_reason(o) is not None:
                continue
            if finished and stage.name in finished:
                upstream = stage_key(stage.name, {"finished": finished[stage.name]}, upstream,
                                     keys.stage_dependencies(stage.module))
                continue
            module = stage.load()
            upstream = stage_key(stage.name, module.fingerprint(o), upstream,
                                 keys.stage_dependencies(stage.module))
            cached = stage.cacheable and o.use_cache and self.cache.has(stage.name, upstream)
            remote = None
            if stage.cacheable and not cached and self.remote is not None:
                remote = self.remote.lookup(stage.name, upstream)
            if cached or remote is not None:  # (its entry found damaged later: it starts
                prestart.end(stage.name)      # a process of its own then)
            made = None
            if remote is not None:
                made = frozenset(json_object(remote.meta.get("artifacts"),
                                             f"{stage.name}'s remote entry: artifacts"))
            elif cached and self.remote is not None:
                made = self.cache.artifact_names(stage.name, upstream)
            planned.append(PlannedStage(stage, module, upstream, cached or remote is not None,
                                        remote, made=made))
        if self.remote is not None:
            self._fetch_needed(planned)
        self._planned = planned
        return planned

    def _fetch_needed(self, planned: list[PlannedStage]) -> None:
        """Download the remote entries whose files a stage that runs reads
        (``remote_entries_read``), each checked before it is stored in the local cache; one
        found damaged is a miss (its stage runs, and what it reads is then needed too), so
        the needs are worked out again until every entry needed is here."""
        assert self.remote is not None
        remote = self.remote
        while wanted := remote_entries_read(planned, self.plan):
            for p, names in wanted:
                assert p.remote is not None
                if p.part is not None:  # more of an entry fetched in part: all of it now
                    shutil.rmtree(p.part.parent, ignore_errors=True)
                    p.part, p.part_names, names = None, frozenset(), None
                fetched = remote.fetch(p.remote, names)
                if remote.off is not None:  # the store failed: its entries are misses
                    for q in planned:
                        if q.remote is not None:
                            q.remote, q.cached = None, False
                    break
                if fetched.problem is not None:
                    p.discarded = (f"{remote.url.key('stages', p.stage.name, p.key)} in the "
                                   f"remote cache: {fetched.problem}")
                    p.remote, p.cached = None, False
                    break
                if fetched.part is not None:
                    p.part, p.part_names = fetched.part, names or frozenset()
                else:
                    p.remote = None  # now in the local cache

    def inputs_after_damage(self, damaged: PlannedStage, work: Path
                            ) -> dict[str, Artifacts]:
        """A local entry found damaged when it was reused (``damaged``, now a miss): its
        stage runs, and may read files of earlier entries that stayed in the bucket (reused
        without their files, since nothing that ran read them). Those are downloaded now,
        checked as every download, and loaded into their stage folders: the artifacts of
        each, by stage. (An earlier entry found damaged in the bucket now cannot run again:
        the stage then fails, naming the artifact it lacks.)"""
        if self.remote is None or damaged not in self._planned:
            return {}
        left = [p for p in self._planned[:self._planned.index(damaged)] if p.remote is not None]
        if not left:
            return {}
        self._fetch_needed(self._planned)
        fetched = {}
        for p in left:
            if p.remote is not None or not p.cached:
                continue  # not needed, or could not be had
            stage_dir = work / ARTIFACTS / p.stage.name
            shutil.rmtree(stage_dir, ignore_errors=True)  # the part of it reused before
            loaded = self.cache.load(p.stage.name, p.key, stage_dir)
            if loaded.meta is not None:
                record = EntryRecord.from_meta(loaded.meta, f"{p.stage.name}'s cache entry")
                fetched[p.stage.name] = Artifacts.from_named(
                    {name: stage_dir / rel for name, rel in record.artifacts.items()})
        return fetched

    def start_ahead(self, current: PlannedStage, logs: Path) -> None:
        """Make sure the process of the stage about to run (``current``) and those of the
        next isolated stages to run (as many as its ``warm_beside``) exist: they warm up
        while this one runs (the stages after the export are short). Not all at once: each
        warming process holds its imports' memory."""
        ahead = [p for p in self._from(current) if p.stage.isolated and not p.cached]
        beside = current.stage.warm_beside
        wanted = ahead[:beside + 1] if ahead and ahead[0] is current else ahead[:beside]
        for p in wanted:
            if p.stage.name not in self.processes:
                self._start(p.stage, logs / f"{p.stage.name}.log", logs.parent,
                            ahead=p is not current)
        prestart.end_untaken()  # the build's first stage is not the one the command guessed

    def warm_on_spare_core(self, current: PlannedStage, model_bytes: int, logs: Path,
                           meter: ResourceMeter) -> None:
        """``current`` works on one core from now on (``StageContext.spare_core``): with a
        model of at most ``SMALL_MODEL_BYTES``, the processes of the next
        ``WARM_ON_SPARE_CORE`` isolated stages start now and import on the other core (else
        their imports land beside the short stages after the export, on both cores). Not for a
        larger model: each warming process holds its imports' memory beside the stage's
        peak. They are not ``current``'s memory (``meter``)."""
        if model_bytes > SMALL_MODEL_BYTES or current not in self._planned:
            return
        ahead = [p for p in self._from(current)[1:] if p.stage.isolated and not p.cached]
        for p in ahead[:WARM_ON_SPARE_CORE]:
            if p.stage.name not in self.processes:
                self._start(p.stage, logs / f"{p.stage.name}.log", logs.parent, ahead=True)
                meter.exclude_process(self.processes[p.stage.name].pid)

    def head_start_next(self, current: PlannedStage, artifacts: Artifacts, work: Path,
                        logs: Path) -> None:
        """As ``current`` starts, give the stage after it its head start
        (``Stage.head_start``) on ``artifacts``, when it will run in a process already
        started."""
        after = self._from(current)[1:]
        if not after:
            return
        later = after[0]
        process = self.processes.get(later.stage.name)
        if not later.stage.head_start or later.cached or process is None:
            return
        stage_dir = work / ARTIFACTS / later.stage.name
        stage_dir.mkdir(parents=True, exist_ok=True)
        self._head_started[later.stage.name] = stage_dir
        process.head_start(HeadStart(artifacts, stage_dir, logs / f"{later.stage.name}.log"))

    def _from(self, current: PlannedStage) -> list[PlannedStage]:
        """``current`` and the planned stages after it."""
        return self._planned[self._planned.index(current):]

    def _start(self, stage: Stage, log_path: Path, build_dir: Path,
               ahead: bool = False) -> None:
        """The stage's process: the one the command prestarted for it, or a new one;
        ``ahead`` of its turn, beside the stage that runs now: it imports behind that one
        (``isolate.import_behind``)."""
        process = StageProcess(stage, log_path, prestart.take(stage.name))
        process.prepare(self.plan, build_dir, log_path, ahead)
        self.processes[stage.name] = process

    def stop_processes(self) -> None:
        for process in self.processes.values():
            process.stop()
        self.processes.clear()
        prestart.end_untaken()  # a build whose stages were all cached took none

    def end(self, failed: bool = False) -> None:
        """Stop the stage processes and wait for every stage's records and cache entry. A
        failure of the records is raised (a full disk: the runner says so), unless the build
        failed already: then its own error is the one to show, the records not started yet
        are dropped, and what head starts made for stages that never ran is removed (the
        folder of a failed build holds what ran)."""
        self.stop_processes()
        for p in self._planned:  # the parts of remote entries, linked where they were used
            if p.part is not None:
                shutil.rmtree(p.part.parent, ignore_errors=True)
                p.part = None
        pending, self._pending = self._pending, []
        for future in pending:
            if failed:
                future.cancel()
                with contextlib.suppress(Exception):
                    future.result()
            else:
                future.result()
        self._records.shutdown(wait=True)
        if failed:
            for stage_dir in self._head_started.values():
                shutil.rmtree(stage_dir, ignore_errors=True)
        self._head_started.clear()

    def _raise_record_failures(self) -> None:
        """A stage's records or cache entry that failed (a full disk): raised now, before
        the next stage runs, not after every later stage."""
        for future in self._pending:
            if future.done() and not future.cancelled():
                future.result()

    def reuse(self, stage: Stage, plan: PlannedStage, stage_dir: Path
              ) -> tuple[tuple[StageResult, list[VerificationRow], Artifacts] | None, str | None]:
        """The cached result, rows and artifacts (or None), and why the entry was discarded
        (or None). An entry left in the remote cache (``PlannedStage.remote``: nothing that
        runs reads its files) gives its result and rows, and no files."""
        started = time.perf_counter()
        key = plan.key
        if plan.remote is not None:
            record = EntryRecord.from_meta(plan.remote.meta, f"{stage.name}'s remote entry")
            made = Artifacts()
            records: list[Artifact] = []
            if plan.part is not None:  # the files of the artifacts later stages read
                link_tree(plan.part, stage_dir)
                made = Artifacts.from_named({name: stage_dir / rel
                                             for name, rel in record.artifacts.items()
                                             if name in plan.part_names})
                work = stage_dir.parent.parent
                records = [a for a in record.records if (work / a.path).is_file()]
        else:
            loaded = self.cache.load(stage.name, key, stage_dir)
            if loaded.meta is None:
                return None, loaded.discarded
            record = EntryRecord.from_meta(loaded.meta, f"{stage.name}'s cache entry")
            self.cache.touch(stage.name, key)
            if self.remote is not None:  # an entry made here before: shared now
                self._pending.append(self._records.submit(self.remote.publish, stage.name, key))
            made = Artifacts.from_named({name: stage_dir / rel
                                         for name, rel in record.artifacts.items()})
            records = record.records
        result = record.result
        result.artifacts = records
        if plan.part is not None:
            result.message += (" (in the remote cache; downloaded only what later stages "
                               f"read: {', '.join(sorted(plan.part_names))})")
        elif plan.remote is not None:
            result.message += " (in the remote cache; not downloaded: nothing that ran " \
                              "read its files)"
        result.cached = True
        result.ran_seconds = result.seconds  # entries are stored from stages that ran
        result.seconds = time.perf_counter() - started
        result.peak_memory_mb = None
        return (result, record.verification, made), None

    def execute(self, stage: Stage, plan: PlannedStage, stage_dir: Path,
                 artifacts: Artifacts, work: Path, log_path: Path
                 ) -> tuple[StageResult, list[VerificationRow], Artifacts]:
        """Run the stage on ``artifacts``: its result, rows and the artifacts it made."""
        logger, handler = stage_logger(f"trtpack.stage.{stage.name}.{id(self)}", log_path)
        if stage.isolated and stage.name not in self.processes:
            # planned as cached, but the entry went away
            self._start(stage, log_path, work)
        process = self.processes.get(stage.name)
        self._raise_record_failures()
        self._head_started.pop(stage.name, None)
        # the processes warming up for later stages are not this stage's memory; one working
        # on its head start beside this stage is
        # a stage server's processes are not the build's children: counted by their pids
        meter = ResourceMeter(exclude={p.pid for name, p in self.processes.items()
                                       if p is not process and name not in self._head_started},
                              include={p.pid for name, p in self.processes.items()
                                       if p.served and (p is process
                                                        or name in self._head_started)})

        def spare_core(model_bytes: int) -> None:
            self.warm_on_spare_core(plan, model_bytes, log_path.parent, meter)

        ctx = StageContext(self.plan, stage.name, stage_dir, work, artifacts, logger,
                           self.progress, spare_core, meter.include_process)
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
                raise  # the runner says it in words (faults.disk_full_error)
            logger.error("".join(traceback.format_exc()))
            raise StageError(stage.name, f"{type(e).__name__}: {e}",
                             log_path=log_path) from e
        finally:
            logger.removeHandler(handler)
            handler.close()
        result = StageResult(
            stage.name, outcome.status, seconds=meter.seconds, peak_memory_mb=meter.peak_mb,
            message=outcome.message, metrics=outcome.metrics.to_dict(),
            warnings=outcome.warnings,
        )
        stored: JsonObject | None = None
        if stage.cacheable and self.plan.use_cache and outcome.status == "ok" and all(
            r.passed for r in outcome.verification
        ):  # the result as stored, taken now: the runner adds to it (its log, warnings) later
            stored = {k: v for k, v in asdict(result).items()
                      if k not in ("artifacts", "cached", "log_path")}
        self._pending.append(self._records.submit(
            self._record, stage.name, plan.key, stored, stage_dir, work, outcome, result))
        return result, outcome.verification, outcome.artifacts

    def _record(self, stage: str, key: str, stored: JsonObject | None, stage_dir: Path,
                work: Path, outcome: StageOutcome, result: StageResult) -> None:
        """``result``'s artifact records, and the cache entry of ``stored`` (None: not
        stored). On the records thread, while later stages run: a stage writes only in its
        own folder, so these files do not change any more."""
        result.artifacts = artifact_records(outcome.artifacts, stage_dir, work)
        if stored is None:
            return
        meta: JsonObject = {
            "artifacts": relative_artifacts(outcome.artifacts, stage_dir),
            "records": [asdict(a) for a in result.artifacts],
            "result": stored,
            "verification": [asdict(r) for r in outcome.verification],
        }
        self.cache.store(stage, key, stage_dir, meta)
        if self.remote is not None:
            self.remote.publish(stage, key)
