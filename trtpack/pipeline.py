"""Orders the stages, caches their outputs, measures them and writes the output atomically.

Data flows one way: recipe -> ONNX (export) -> simplified ONNX -> verified against PyTorch ->
precision ONNX -> engine -> Triton model repository. Each stage runs in its own folder
``OUT/artifacts/<stage>/`` and returns a ``StageOutcome``; the pipeline turns it into a
``StageResult`` in the report. Stage modules are imported only when they run.

Caching: a stage's key hashes its name, its fingerprint (the options it depends on), the
keys of the stages before it, the tool versions and a digest of trtpack's own code. A
finished stage folder is hard-linked into ``CACHE/stages/<stage>/<key>/`` through a
temporary name and a rename, so an interrupted build never leaves anything that could be
taken for a result; a hit hard-links it back (gigabytes of weights cost nothing to reuse).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import shutil
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trtpack import __version__
from trtpack.errors import AccuracyError, StageError, TrtpackError
from trtpack.onnx_files import data_path, link_tree
from trtpack.options import BuildOptions
from trtpack.recipe import Recipe
from trtpack.report import REPORT, Artifact, BuildReport, StageResult, VerificationRow
from trtpack.resources import ResourceMeter
from trtpack.stages.base import ProgressCallback, ProgressEvent, StageContext, StageOutcome


@dataclass(frozen=True)
class Stage:
    """A pipeline step: the module holding ``run(ctx)`` and ``fingerprint(options)``."""

    name: str
    module: str
    skip_reason: Callable[[BuildOptions], str | None] = lambda o: None
    cacheable: bool = True
    gated: bool = True  # a failed verification row stops the build
    # Run in a child process: what the stage allocates (a whole PyTorch model) is returned to
    # the system when it ends, instead of staying in this process for the rest of the build.
    isolated: bool = False
    # False: the stage is not part of this build at all (not listed in the report)
    applies: Callable[[BuildOptions], bool] = lambda o: True

    def load(self) -> Any:
        return importlib.import_module(self.module)


def _precision_skip(o: BuildOptions) -> str | None:
    return "fp32: nothing to convert" if o.precision == "fp32" else None


def _engine_skip(o: BuildOptions) -> str | None:
    if not o.target.is_gpu:
        return "target cpu: ONNX Runtime serves the ONNX model"
    if not o.build_engine:
        return "--no-engine"
    return None


def _onnx_in(o: BuildOptions) -> bool:
    return o.recipe.source.onnx is not None


STAGES: tuple[Stage, ...] = (
    # ONNX in: the user's ONNX is imported, and is the reference; there is no export
    Stage("import", "trtpack.stages.import_onnx", isolated=True, applies=_onnx_in),
    Stage("export", "trtpack.stages.export", isolated=True,
          applies=lambda o: not _onnx_in(o)),
    Stage("simplify", "trtpack.stages.simplify"),
    Stage("verify", "trtpack.stages.verify"),
    Stage("precision", "trtpack.stages.precision", _precision_skip),
    Stage("engine", "trtpack.stages.engine", _engine_skip),
    Stage("package", "trtpack.stages.package", cacheable=False),
)


def _source_digest() -> str:
    """sha256 of trtpack's own Python files: a changed stage never reuses an old result,
    whatever ``__version__`` says."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def tool_versions() -> dict[str, str | None]:
    from trtpack.machine import recorded_versions

    return {"trtpack": __version__, "trtpack_source": _source_digest(), **recorded_versions()}


def _stage_key(stage: Stage, fingerprint: dict[str, Any], upstream: str,
               versions: dict[str, str | None]) -> str:
    payload = json.dumps(
        {"stage": stage.name, "fingerprint": fingerprint, "upstream": upstream,
         "versions": versions},
        sort_keys=True, default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


class StageCache:
    """Finished stage folders by key; writes go through a temporary name and a rename."""

    def __init__(self, root: Path) -> None:
        self.root = root / "stages"

    def _entry(self, stage: str, key: str) -> Path:
        return self.root / stage / key

    def load(self, stage: str, key: str, dst: Path) -> dict[str, Any] | None:
        entry = self._entry(stage, key)
        meta_path = entry / "trtpack-stage.json"
        if not meta_path.is_file():
            return None
        try:
            meta: dict[str, Any] = json.loads(meta_path.read_text())
        except (OSError, json.JSONDecodeError):
            return None
        link_tree(entry / "files", dst)
        return meta

    def store(self, stage: str, key: str, src: Path, meta: dict[str, Any]) -> None:
        entry = self._entry(stage, key)
        if entry.exists():
            return
        tmp = entry.with_name(f"{key}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir(parents=True)
            link_tree(src, tmp / "files")
            for f in (tmp / "files").rglob("*"):
                if f.is_file():  # shared by hard links with build folders: never edit in place
                    f.chmod(0o444)
            (tmp / "trtpack-stage.json").write_text(json.dumps(meta, default=str))
            tmp.rename(entry)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)


def _relative_artifacts(artifacts: dict[str, Path], stage_dir: Path) -> dict[str, str]:
    rel: dict[str, str] = {}
    for name, path in artifacts.items():
        if path.is_relative_to(stage_dir):
            rel[name] = str(path.relative_to(stage_dir))
    return rel


def _artifact_records(artifacts: dict[str, Path], stage_dir: Path, root: Path
                      ) -> list[Artifact]:
    """Artifacts of this stage (files only; a folder lists its files), with sha256."""
    records: list[Artifact] = []
    for name, path in artifacts.items():
        if not path.is_relative_to(stage_dir):
            continue
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            label = name if f == path else f"{name}/{f.relative_to(path)}"
            records.append(Artifact.of(label, f, root))
            # data files next to an ONNX model are listed with it
            data = data_path(f)
            if f.suffix == ".onnx" and data.is_file() and data not in files:
                records.append(Artifact.of(f"{label}.data", data, root))
    return records


def stage_logger(name: str, log_path: Path) -> tuple[logging.Logger, logging.Handler]:
    """A logger writing (appending) to a stage's log file only; close the handler after."""
    logger = logging.getLogger(name)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = logging.FileHandler(log_path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    return logger, handler


RECIPE_FILE = "recipe.yaml"


def write_recipe(path: Path, recipe: Recipe) -> None:
    """The recipe the build used, overrides applied (``trtpack bench`` loads the model
    from it)."""
    import yaml

    path.write_text("# the recipe of this build, every default and --set applied\n"
                    + yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False),
                    encoding="utf-8")


def write_report_page(out: Path, report: BuildReport) -> None:
    """``OUT/report.html``; a page that cannot be drawn never fails the build (the reason
    goes into the report's warnings)."""
    from trtpack.report_html import write_report_html

    try:
        write_report_html(out, report)
    except Exception as e:  # matplotlib missing or a chart it cannot draw
        report.warnings.append(f"report.html not written: {type(e).__name__}: {e}")
        report.save(out / REPORT)


class Pipeline:
    def __init__(self, options: BuildOptions, progress: ProgressCallback | None = None) -> None:
        self.options = options
        self.progress: ProgressCallback = progress or (lambda event: None)
        self.cache = StageCache(options.cache_dir)

    def run(self) -> BuildReport:
        o = self.options
        out = o.out_dir.resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        work = out.with_name(f".{out.name}.partial-{os.getpid()}")
        failed_dir = out.with_name(out.name + ".failed")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        report = BuildReport(
            model=o.name, precision=o.precision, target=o.target.name,
            profiles=[str(p) for p in o.profiles], out_dir=str(out),
            versions=tool_versions(),
        )
        started = time.perf_counter()
        try:
            self._run_stages(work, report)
        except KeyboardInterrupt:
            shutil.rmtree(work, ignore_errors=True)
            raise
        except TrtpackError as e:
            if isinstance(e, StageError) and e.log_path is not None \
                    and e.log_path.is_relative_to(work):
                e.log_path = failed_dir / e.log_path.relative_to(work)
            report.status = "accuracy_failed" if isinstance(e, AccuracyError) else "failed"
            report.error = str(e)
            report.total_seconds = time.perf_counter() - started
            report.out_dir = str(failed_dir)
            report.save(work / REPORT)
            write_report_page(work, report)
            shutil.rmtree(failed_dir, ignore_errors=True)
            work.rename(failed_dir)
            e.report = report  # type: ignore[attr-defined]
            raise
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        report.total_seconds = time.perf_counter() - started
        peaks = [s.peak_memory_mb for s in report.stages if s.peak_memory_mb is not None]
        report.peak_memory_mb = max(peaks) if peaks else None
        report.save(work / REPORT)
        write_recipe(work / RECIPE_FILE, o.recipe)
        write_report_page(work, report)
        self._replace(work, out)
        shutil.rmtree(failed_dir, ignore_errors=True)
        return report

    @staticmethod
    def _replace(work: Path, out: Path) -> None:
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        if out.exists():
            out.rename(old)
        work.rename(out)
        shutil.rmtree(old, ignore_errors=True)

    def _run_stages(self, work: Path, report: BuildReport) -> None:
        o = self.options
        artifacts: dict[str, Path] = {}
        upstream = ""
        logs = work / "logs"
        logs.mkdir()
        for stage in STAGES:
            if not stage.applies(o):
                continue
            reason = stage.skip_reason(o)
            if reason is not None:
                result = StageResult(stage.name, "skipped", message=reason)
                report.stages.append(result)
                self.progress(ProgressEvent(stage.name, "end", reason, result))
                continue
            module = stage.load()
            fingerprint: dict[str, Any] = module.fingerprint(o)
            key = _stage_key(stage, fingerprint, upstream, report.versions)
            upstream = key
            stage_dir = work / "artifacts" / stage.name
            stage_dir.mkdir(parents=True)
            self.progress(ProgressEvent(stage.name, "start"))
            log_path = logs / f"{stage.name}.log"
            reused = self._reuse(stage, key, stage_dir, artifacts) if (
                stage.cacheable and o.use_cache) else None
            if reused is None:
                result, rows = self._execute(stage, module, key, stage_dir, artifacts, work,
                                             log_path)
            else:
                result, rows = reused
                log_path.write_text(f"reused from cache key {key}\n")
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
               ) -> tuple[StageResult, list[VerificationRow]] | None:
        started = time.perf_counter()
        meta = self.cache.load(stage.name, key, stage_dir)
        if meta is None:
            return None
        for name, rel in meta["artifacts"].items():
            artifacts[name] = stage_dir / rel
        result = StageResult(**meta["result"])
        result.artifacts = [Artifact(**a) for a in meta["records"]]
        result.cached = True
        result.seconds = time.perf_counter() - started
        result.peak_memory_mb = None
        return result, [VerificationRow(**r) for r in meta.get("verification", [])]

    def _execute(self, stage: Stage, module: Any, key: str, stage_dir: Path,
                 artifacts: dict[str, Path], work: Path, log_path: Path
                 ) -> tuple[StageResult, list[VerificationRow]]:
        logger, handler = stage_logger(f"trtpack.stage.{stage.name}.{id(self)}", log_path)
        ctx = StageContext(self.options, stage.name, stage_dir, work, dict(artifacts), logger,
                           self.progress)
        meter = ResourceMeter()
        try:
            with meter:
                outcome: StageOutcome = (run_in_child_process(stage, ctx, log_path)
                                         if stage.isolated else module.run(ctx))
        except (TrtpackError, KeyboardInterrupt):
            logger.error("".join(traceback.format_exc()))
            raise
        except Exception as e:
            logger.error("".join(traceback.format_exc()))
            raise StageError(stage.name, f"{type(e).__name__}: {e}",
                             log_path=log_path) from e
        finally:
            logger.removeHandler(handler)
            handler.close()
        artifacts.update(outcome.artifacts)
        result = StageResult(
            stage.name, outcome.status, seconds=meter.seconds, peak_memory_mb=meter.peak_mb,
            message=outcome.message, metrics=outcome.metrics, warnings=outcome.warnings,
            artifacts=_artifact_records(outcome.artifacts, stage_dir, work),
        )
        if stage.cacheable and self.options.use_cache and outcome.status == "ok" and all(
            r.passed for r in outcome.verification
        ):
            meta = {
                "artifacts": _relative_artifacts(outcome.artifacts, stage_dir),
                "records": [asdict(a) for a in result.artifacts],
                "result": {k: v for k, v in asdict(result).items()
                           if k not in ("artifacts", "cached", "log_path")},
                "verification": [asdict(r) for r in outcome.verification],
            }
            self.cache.store(stage.name, key, stage_dir, meta)
        return result, outcome.verification


class ChildStageError(TrtpackError):
    """A user error raised by a stage in its child process, with its message and exit code."""

    def __init__(self, message: str, exit_code: int, hint: str | None) -> None:
        super().__init__(message, hint=hint)
        self.exit_code = exit_code


def _exit_with_parent() -> None:
    """End this process when the build's process is gone (killed, not interrupted)."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="trtpack-parent-watch", daemon=True).start()


def _child_stage_main(conn: Any, name: str, module: str, options: BuildOptions,
                      stage_dir: Path, build_dir: Path, artifacts: dict[str, Path],
                      log_path: Path) -> None:
    """The child side of ``run_in_child_process``: runs the stage, sends back progress
    messages, then its outcome or what went wrong."""
    _exit_with_parent()
    # appends to the parent's stage log
    logger, handler = stage_logger(f"trtpack.stage.{name}.child", log_path)

    def forward(event: ProgressEvent) -> None:
        conn.send(("progress", event.message))

    ctx = StageContext(options, name, stage_dir, build_dir, artifacts, logger, forward)
    try:
        conn.send(("outcome", importlib.import_module(module).run(ctx)))
    except KeyboardInterrupt:
        pass
    except TrtpackError as e:
        message = e.message if isinstance(e, StageError) else str(e)
        conn.send(("user_error", (message, e.exit_code, e.hint)))
    except BaseException as e:
        logger.error("".join(traceback.format_exc()))
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        handler.close()
        conn.close()


def run_in_child_process(stage: Stage, ctx: StageContext, log_path: Path) -> StageOutcome:
    """``stage.run(ctx)`` in a fresh (spawned) Python process; progress comes back as it
    happens. A user error keeps its message and exit code; anything else becomes this
    process's exception with the traceback in the stage log. Ctrl-C ends the child."""
    import multiprocessing

    mp = multiprocessing.get_context("spawn")
    parent_end, child_end = mp.Pipe(duplex=False)
    child = mp.Process(target=_child_stage_main, name=f"trtpack-{stage.name}", args=(
        child_end, stage.name, stage.module, ctx.options, ctx.stage_dir, ctx.build_dir,
        ctx.artifacts, log_path))
    child.start()
    child_end.close()
    try:
        while True:
            try:
                kind, payload = parent_end.recv()
            except EOFError:
                child.join()
                raise RuntimeError(f"the {stage.name} process ended without a result (exit "
                                   f"code {child.exitcode})") from None
            if kind == "progress":  # the child logged it already
                ctx.on_progress(ProgressEvent(stage.name, "update", payload))
            elif kind == "outcome":
                return payload  # type: ignore[no-any-return]
            elif kind == "user_error":
                message, exit_code, hint = payload
                raise ChildStageError(message, exit_code, hint)
            else:
                raise RuntimeError(payload)
    except BaseException:
        if child.is_alive():  # interrupted, or its error is in hand: no need to wait
            child.kill()
        raise
    finally:
        parent_end.close()
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
            child.join()


def build(options: BuildOptions, progress: ProgressCallback | None = None) -> BuildReport:
    """Run the whole pipeline; raises ``TrtpackError`` (with ``.report``) on failure."""
    return Pipeline(options, progress).run()
