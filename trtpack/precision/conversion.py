"""What the FP16 and INT8 conversions share: ``Conversion``, the framework both run in (its
attempts through the ModelOpt worker of ``precision.modelopt_jobs`` on the source model of
``precision.source``, the per-sample verification gate, the recipe overlay, the outcome), and
``ConversionContext``, what a conversion sees of its stage.

When a variant fails its gate and ``--fallback auto`` (the default), nodes are kept in
higher precision and the conversion redone until the gate passes or the budget is spent;
the chosen exclusions are written to a recipe overlay (``extends: <recipe>`` +
``precision_options``) that makes the build reproducible.
"""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from trtpack.cases import load_cases
from trtpack.errors import StageError
from trtpack.onnx_tools.files import move_model
from trtpack.options import BuildPlan
from trtpack.precision.metrics import AttemptSummary, Fp16Metrics, Int8Metrics
from trtpack.precision.modelopt_jobs import ModelOptJob, ModelOptWorker, WorkerResult
from trtpack.precision.source import resolve_node_patterns
from trtpack.report import VerificationRow, shown_metric

if TYPE_CHECKING:
    from trtpack.precision.graph import LowPrecisionCounts
    from trtpack.runtimes.onnxruntime import CpuSession
    from trtpack.verify.compare import SampleText
    from trtpack.verify.samples import Tokenizer

WORKER_TIMEOUT_SECONDS = 4 * 3600


class ConversionContext(Protocol):
    """What a conversion sees of its stage (``trtpack.stages.base.StageContext`` is one)."""

    plan: BuildPlan
    stage: str
    stage_dir: Path
    artifacts: dict[str, Path]
    log: logging.Logger

    def progress(self, message: str) -> None: ...

    def artifact(self, name: str) -> Path: ...


@dataclass
class ConversionResult:
    """The converted model (``precision_onnx``, and ``recipe_overlay`` when the fallback
    chose exclusions), its metrics and verification rows."""

    artifacts: dict[str, Path]
    metrics: Fp16Metrics | Int8Metrics
    verification: list[VerificationRow]
    warnings: list[str]
    message: str


@dataclass
class Attempt:
    """One converted model and how it fared."""

    label: str
    path: Path
    excluded: list[str]
    rows: list[VerificationRow]
    # the search split (INT8): judged with the corners on every attempt
    search_worst: float | None = None
    search_passed: bool = True
    search_reasons: list[str] = field(default_factory=list)
    split_rows: list[VerificationRow] = field(default_factory=list)
    session: CpuSession | None = field(default=None, repr=False)  # while it is needed

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows) and self.search_passed

    @property
    def worst(self) -> float | None:
        values = [r.metric_value for r in self.rows if r.metric_value is not None]
        return min(values) if values else None

    @property
    def threshold(self) -> float | None:
        """The gate of its worst row (what ``worst`` is judged against)."""
        scored = [r for r in self.rows if r.metric_value is not None]
        return min(scored, key=lambda r: r.metric_value or 0.0).threshold if scored else None

    def summary(self) -> AttemptSummary:
        return AttemptSummary(
            worst_metric=self.worst, search_worst_metric=self.search_worst,
            max_abs_diff=max((r.max_abs_diff for r in self.rows), default=None),
            failed_checks=sum(not r.passed for r in self.rows),
            search_passed=self.search_passed, passed=self.passed)


class Conversion:
    """What the FP16 and INT8 paths share: the worker, the gate, the output."""

    precision: str

    def __init__(self, ctx: ConversionContext, work: Path, source: Path,
                 worker: ModelOptWorker | None = None) -> None:
        import onnx

        self.ctx = ctx
        self.plan = ctx.plan
        self.recipe = ctx.plan.recipe
        self.work = work
        self.source = source
        self.quantize_source = source  # what ModelOpt quantizes (a smoothed copy for INT8)
        self.cases = load_cases(ctx.artifact("fp32_outputs"))
        from trtpack.precision.module_paths import module_paths

        graph = onnx.load(str(source), load_external_data=False).graph
        self.node_names = [n.name for n in graph.node]
        self.op_types = {n.name: n.op_type for n in graph.node}
        self.module_paths = module_paths(graph.node)
        self._sample_text: SampleText | None = None
        self._tokenizer: Tokenizer | None = None
        self.conversion_seconds = 0.0
        self.conversions = 0
        self.worker = worker  # started ahead of the first conversion
        self.warnings: list[str] = []
        self.last_result: WorkerResult = {}  # the worker's result of the last conversion
        self.check = f"{self.precision}-vs-fp32"

    def modelopt(self, job: ModelOptJob, label: str,
                 meanwhile: Callable[[], None] | None = None) -> Path:
        """Run a conversion in the worker (``meanwhile`` runs here while it works); returns
        the converted model (``<work>/<label>/model.onnx``)."""
        out_dir = self.work / label
        out_dir.mkdir()
        output = out_dir / "model.onnx"
        worker = self.worker or ModelOptWorker(self.precision, self.ctx.stage_dir)
        self.worker = None  # one job per worker
        try:
            worker.submit(replace(job, input=str(self.quantize_source), output=str(output),
                                  result=str(worker.cwd / "result.json")))
            if meanwhile is not None:
                meanwhile()
            try:
                returncode, stdout, stderr, seconds = worker.wait(WORKER_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired as e:
                raise StageError(self.ctx.stage, f"ModelOpt ({label}) timed out after "
                                 f"{WORKER_TIMEOUT_SECONDS} s") from e
            self.ctx.log.info("ModelOpt %s: exit %s in %.1f s after its job came (started "
                              "%.1f s before)\n--- stdout\n%s\n--- stderr\n%s", label,
                              returncode, seconds, worker.head_start, stdout, stderr)
            if returncode != 0 or not output.is_file():
                lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
                last = (f"its process was killed by signal {-returncode}" if returncode < 0
                        else lines[-1] if lines else f"exit code {returncode}")
                raise StageError(self.ctx.stage, f"ModelOpt {self.precision} conversion "
                                 f"({label}) failed: {last}")
            self.conversion_seconds += seconds
            self.conversions += 1
            result = worker.result()
            self.last_result = result
            self.ctx.log.info("ModelOpt %s result: %s", label, json.dumps(result))
            asked = job.int8.calibration_method if job.int8 is not None else None
            if asked is not None and result.get("calibration_method", asked) != asked:
                self.warnings.append(
                    f"ModelOpt's {asked} calibration failed on this "
                    "model and data (an activation with a near-constant range: \"Too many "
                    f"bins for data range\"); {label} used {result['calibration_method']} "
                    "calibration instead")
            return output
        finally:
            worker.close()

    def verify(self, path: Path, session: CpuSession | None = None, workers: int = 1
               ) -> list[VerificationRow]:
        """Rows of the profile corners (``session``: one already open on ``path``, run
        from ``workers`` threads; None: ``run_onnxruntime``'s, made for these few runs)."""
        from trtpack.runtimes.onnxruntime import run_session
        from trtpack.verify.compare import compare_cases, run_onnxruntime

        outputs = (run_onnxruntime(path, self.cases) if session is None
                   else run_session(session, [c.inputs for c in self.cases], workers))
        return compare_cases(self.check, self.recipe, self.precision, self.cases, outputs,
                             self.sample_text())

    def tokenizer(self) -> Tokenizer | None:
        """The model's tokenizer (loaded once), or None."""
        folder = self.ctx.artifacts.get("tokenizer")
        if folder is None:
            return None
        if self._tokenizer is None:
            from trtpack.precision.calibration.text_batches import saved_tokenizer

            self._tokenizer = saved_tokenizer(self.recipe, folder)
        return self._tokenizer

    def sample_text(self) -> SampleText:
        """A ``SampleText`` decoding token ids with the model's tokenizer (None: no text)."""
        if self._sample_text is None:
            from trtpack.verify.compare import token_text

            ids = self.recipe.input_name("token_ids")
            mask = self.recipe.input_name("attention_mask")
            tokenizer = self.tokenizer() if ids else None
            self._sample_text = token_text(tokenizer, ids, mask) if tokenizer and ids \
                else (lambda inputs, index: None)
        return self._sample_text

    def display(self, name: str) -> str:
        """``encoder.layer.3.attention.self.query (MatMul)``: module path and op type."""
        from trtpack.precision.module_paths import display_name

        return display_name(name, self.op_types.get(name, "?"), self.module_paths)

    def resolve(self, patterns: Sequence[str], field_name: str) -> list[str]:
        matched, unmatched = resolve_node_patterns(self.node_names, patterns)
        if unmatched:
            shown = ", ".join(unmatched[:5]) + (" ..." if len(unmatched) > 5 else "")
            self.warnings.append(
                f"precision_options.{self.precision}.{field_name}: {len(unmatched)} name(s) "
                f"match no node of this model ({shown}); was the overlay written for another "
                "export?")
        return matched

    def stats(self, path: Path) -> LowPrecisionCounts:
        import onnx

        from trtpack.precision.graph import low_precision_stats

        model = onnx.load(str(path), load_external_data=False)
        return low_precision_stats(model, self.precision).as_dict()

    def hints(self, names: Sequence[str]) -> dict[str, str]:
        import onnx

        from trtpack.precision.graph import node_hint

        model = onnx.load(str(self.source), load_external_data=False)
        inits = {i.name for i in model.graph.initializer}
        by_name = {n.name: n for n in model.graph.node}
        return {n: (self.display(n) if n in self.module_paths else node_hint(by_name[n], inits))
                for n in names if n in by_name}

    def write_overlay(self, section: dict[str, list[str]], note: str) -> Path:
        """The overlay YAML; node names (stable, for matching) get their module path and
        op type beside them as a comment."""
        import yaml

        from trtpack.sources.recipe_files import overlay_document

        path = self.ctx.stage_dir / f"{self.recipe.name}-{self.precision}.yaml"
        body = yaml.safe_dump(
            overlay_document(self.recipe, {"precision_options": {self.precision: section}}),
            sort_keys=False, width=100)
        header = (f"# Written by trtpack's {self.precision} fallback: {note}\n"
                  f"# Build with it: trtpack build {path.name} --precision {self.precision} ...\n")
        lines = []
        for line in body.splitlines():
            name = line.strip().removeprefix("- ").strip()
            if line.lstrip().startswith("- ") and name in self.module_paths:
                line = f"{line}  # {self.display(name)}"
            lines.append(line)
        path.write_text(header + "\n".join(lines) + "\n")
        return path

    def finish(self, final: Attempt, metrics: Fp16Metrics | Int8Metrics,
               overlay: Path | None, message: str) -> ConversionResult:
        out = self.ctx.stage_dir / "model.onnx"
        move_model(final.path, out)
        artifacts = {"precision_onnx": out}
        if overlay is not None:
            artifacts["recipe_overlay"] = overlay
        metrics.conversions = self.conversions
        metrics.conversion_seconds = round(self.conversion_seconds, 2)
        return ConversionResult(artifacts=artifacts, metrics=metrics,
                                verification=final.rows,
                            warnings=self.warnings, message=message)


def format_metric(value: float | None, threshold: float | None = None) -> str:
    """Four decimals, or the digits that show on which side of ``threshold`` it lies."""
    return "n/a" if value is None else shown_metric(value, threshold)


def worst_metric(rows: Sequence[VerificationRow]) -> float | None:
    values = [r.metric_value for r in rows if r.metric_value is not None]
    return min(values) if values else None
