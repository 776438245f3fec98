"""What a stage sees and returns: ``StageContext`` in, ``StageOutcome`` out, progress events
on the way (the pipeline runs the stages; the stages never import the pipeline)."""

from __future__ import annotations

import logging
import resource
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from trtpack.errors import StageError
from trtpack.options import BuildPlan
from trtpack.report import JsonObject, StageResult, StageStatus, VerificationRow
from trtpack.stages.artifacts import Artifacts


@dataclass
class StageMetrics:
    """Base of each stage's metrics (a dataclass per stage, its fields typed). In report.json
    they are the stage's ``metrics`` object: one key per field, fields left None omitted
    (the base itself: no metrics)."""

    def to_dict(self) -> JsonObject:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class StageOutcome:
    """What a stage returns. Artifact paths are inside the stage's folder."""

    artifacts: Artifacts = field(default_factory=Artifacts)  # the ones this stage made
    metrics: StageMetrics = field(default_factory=StageMetrics)
    verification: list[VerificationRow] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    message: str = ""
    status: StageStatus = "ok"


@dataclass(frozen=True)
class ProgressEvent:
    stage: str
    kind: Literal["start", "update", "end", "notice"]  # notice: about the build, not a stage
    message: str = ""
    result: StageResult | None = None


ProgressCallback = Callable[[ProgressEvent], None]


def _ignore(value: int) -> None:
    pass


@dataclass
class StageContext:
    """What a stage sees: the build plan, its own empty folder, upstream artifacts, a logger."""

    plan: BuildPlan
    stage: str
    stage_dir: Path
    build_dir: Path  # the (temporary) output folder being built; renamed to OUT at the end
    artifacts: Artifacts  # what the stages before this one made
    log: logging.Logger
    on_progress: ProgressCallback
    # told by ``spare_core`` (the build may start later stages' processes then)
    on_spare_core: Callable[[int], None] = _ignore
    # told of a process working for this stage that is no child of its process (a ModelOpt
    # worker a stage server forked): the build counts it in the stage's memory
    on_served_child: Callable[[int], None] = _ignore

    def progress(self, message: str) -> None:
        self.log.info(message)
        self.on_progress(ProgressEvent(self.stage, "update", message))

    def spare_core(self, model_bytes: int) -> None:
        """From here on the stage works on one core (the exporter's Python) and holds a
        model of ``model_bytes``: the build may let later stages' processes import on the
        other core now (``StageRuns.warm_on_spare_core``)."""
        self.on_spare_core(model_bytes)

    def count_process(self, pid: int) -> None:
        """Count process ``pid`` (and its children) in this stage's memory from now on."""
        self.on_served_child(pid)

    def needs(self, path: Path | None, name: str) -> Path:
        """``path``, an artifact of an earlier stage (``name`` says which); ``StageError``
        when no earlier stage produced it."""
        if path is None:
            raise StageError(self.stage, f"needs artifact '{name}' that no earlier stage produced")
        return path


class ProcessCpu(logging.Filter):
    """Puts the process's CPU seconds so far (user + system, all its threads) on each
    record (``cpu``): a stage's log then reads in CPU time as well as wall time, what a
    loaded machine moves far less (issue 47)."""

    def filter(self, record: logging.LogRecord) -> bool:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        record.cpu = usage.ru_utime + usage.ru_stime
        return True


def stage_logger(name: str, log_path: Path) -> tuple[logging.Logger, logging.Handler]:
    """A logger writing (appending) to a stage's log file only; close the handler after.
    Each line: the time, the process's CPU seconds so far (``cpu 12.3``), the level, the
    message."""
    logger = logging.getLogger(name)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = logging.FileHandler(log_path)
    handler.addFilter(ProcessCpu())
    handler.setFormatter(logging.Formatter("%(asctime)s cpu %(cpu).1f %(levelname)s "
                                           "%(message)s"))
    logger.addHandler(handler)
    return logger, handler

