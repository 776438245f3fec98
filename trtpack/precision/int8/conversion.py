"""INT8: PTQ (Q/DQ) calibrated on the calibration split (optionally on a
SmoothQuant-smoothed copy, or with percentile ranges), judged per sample at the profile
corners and on the search split; with ``--fallback auto`` the measured search
(``trtpack.precision.int8.fallback``) keeps node groups in high precision until it passes, and
the held-out split, judged once on the final model, gates the build.

The Q/DQ model of MatMul/Gemm/Conv with ``max`` calibration is trtpack's own
(``trtpack.precision.int8.qdq``: ModelOpt's placement and scales, without its copies of the
weights); its calibration run is the run that computes the splits' FP32 references. Any
other conversion (other op types, ``entropy``, FP16 kept nodes) is ModelOpt's, in its worker.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from trtpack.cases import Case
from trtpack.precision.calibration.data import (
    CalibrationData,
    load_build_calibration,
    save_feeds,
)
from trtpack.precision.conversion import (
    Attempt,
    Conversion,
    ConversionContext,
    ConversionResult,
    worst_metric,
)
from trtpack.precision.int8.fallback import (
    FALLBACK_QUANTIZE_OP_TYPES,
    SearchInputs,
    int8_fallback,
)
from trtpack.precision.int8.qdq import own_qdq
from trtpack.precision.int8.search import evaluation_workers, run_model, score_outputs
from trtpack.precision.int8.summary import calibration_summary, check_int8_share, int8_message
from trtpack.precision.metrics import (
    FallbackSummary,
    Int8Metrics,
    MethodChoice,
    SmoothQuantSummary,
    SplitSummary,
)
from trtpack.precision.modelopt_jobs import Int8Job, ModelOptJob, ModelOptWorker
from trtpack.report import VerificationRow

if TYPE_CHECKING:
    import numpy as np
    import onnx

    from trtpack.precision.int8.placement import Calibration
    from trtpack.runtimes.onnxruntime import CpuSession
    from trtpack.verify.compare import SampleText

class Int8Conversion(Conversion):
    precision = "int8"

    def __init__(self, ctx: ConversionContext, work: Path, source: Path,
                 worker: ModelOptWorker | None = None, share_gate: bool = True) -> None:
        super().__init__(ctx, work, source, worker)
        self.share_gate = share_gate  # --min-int8-share on this Q/DQ model (it is served)
        self.settings = self.recipe.precision_options.int8
        self.calibration: CalibrationData | None = None
        self.held_out: list[Case] = []  # the certifying part: judged once, by no decision
        self.check_cases: list[Case] = []  # consulted by the search after each round
        self.prefixes: list[Case] = []  # short prefixes of calibration lines (decisions)
        self.search: list[Case] = []
        self.calibration_cases: list[Case] = []
        self.texts: dict[int, list[str]] = {}  # id(case inputs) -> the text of each row
        self.fp32_model: onnx.ModelProto | None = None  # what ModelOpt quantizes, in memory
        self.workers = evaluation_workers()  # ONNX Runtime runs at a time, one thread each
        # own Q/DQ: the calibration measured (model, op types, measurements), kept for reuse
        self.qdq_calibration: tuple[Path, tuple[str, ...], Calibration] | None = None
        self.qdq_results: list[dict[str, object]] = []
        self.quantizer = "trtpack"  # who made the last Q/DQ model: "trtpack" or "ModelOpt"
        self.asked_method = self.plan.calibration_method or self.settings.calibration_method
        self.chosen_method: str | None = None  # auto: max or mse (method_choice)
        self.method_choice: MethodChoice | None = None

    @property
    def method(self) -> str:  # of the next conversion (auto: until one is chosen)
        return self.chosen_method or self.asked_method

    def load_calibration(self) -> None:
        self.ctx.progress("loading calibration data")
        cal, _ = load_build_calibration(self.plan, self.source, self.tokenizer)
        self.calibration = cal
        self.warnings.extend(cal.warnings)
        save_feeds(self.work / "calibration.npz", cal.feeds)

    def split_references(self) -> None:
        """The FP32 outputs of the splits (one ONNX Runtime session). The calibration split
        is judged on its tight batches (``CalibrationData.judged_calibration``); with
        trtpack's own Q/DQ, the calibration batches are measured in the same session (first,
        or while ModelOpt works)."""
        cal = self.calibration
        assert cal is not None
        judged, judged_texts = cal.judged_calibration()
        parts = (("heldout", cal.held_out), ("check", cal.check), ("search", cal.search),
                 ("prefix", cal.prefixes), ("calibration", judged))
        feeds = [f for _, part in parts for f in part]
        op_types = self.op_types_to_quantize()
        if feeds and cal.feeds and self.quantize_source == self.source and own_qdq(
                op_types, self.asked_method, "fp32"):
            # one session: the references, the calibration of trtpack's own Q/DQ (auto: both's)
            from trtpack.precision.int8.qdq import references_and_calibration

            refs, measured = references_and_calibration(self.source, parts, op_types,
                                                        cal.feeds, self.asked_method)
            self.qdq_calibration = (self.source, tuple(op_types), measured)
        else:
            refs = run_model(self.source, feeds) if feeds else []
        texts = [*cal.held_out_texts, *cal.check_texts, *cal.search_texts, *cal.prefix_texts,
                 *judged_texts]
        for feed, rows in zip(feeds, texts, strict=False):
            self.texts[id(feed)] = rows
        together = iter(zip(feeds, refs, strict=True))
        cases = {name: [Case(-1, f"{name}{i}", f, o)
                        for i, (f, o) in zip(range(len(part)), together, strict=False)]
                 for name, part in parts}
        self.held_out, self.check_cases, self.search = (
            cases["heldout"], cases["check"], cases["search"])
        self.prefixes, self.calibration_cases = cases["prefix"], cases["calibration"]

    def op_types_to_quantize(self) -> list[str]:
        """An empty quantize_op_types means MatMul/Gemm/Conv, with or without the fallback
        (ModelOpt's own default placement also quantizes Add inputs, which MiniLM never
        survives)."""
        return list(self.settings.quantize_op_types) or list(FALLBACK_QUANTIZE_OP_TYPES)

    def decision_cases(self) -> list[Case]:
        """What the search decides on: every sample that is neither check nor held-out
        (short prefixes first: most candidates that fail, fail there)."""
        return [*self.prefixes, *self.search, *self.calibration_cases]

    def check_failures(self, attempt: Attempt) -> list[Case]:
        """The check split's cases that ``attempt`` fails (one consultation of the check
        split; the held-out split is never consulted here)."""
        from trtpack.runtimes.onnxruntime import run_session

        assert attempt.session is not None
        outputs = run_session(attempt.session, [c.inputs for c in self.check_cases], self.workers)
        return [c for c, out in zip(self.check_cases, outputs, strict=True)
                if not score_outputs(self.recipe, "int8", [c], [out]).passed]

    def fp32(self) -> onnx.ModelProto:
        """The FP32 model quantized, with its weights (the search's kept nodes come from it):
        loaded when the search needs it, not for a first model that passes."""
        if self.fp32_model is None:
            import onnx

            self.fp32_model = onnx.load(str(self.quantize_source))
        return self.fp32_model

    def split_text(self) -> SampleText:
        """Sample texts for the split cases: the calibration file's own lines."""
        decode = self.sample_text()

        def describe(inputs: Mapping[str, np.ndarray], index: int) -> str | None:
            rows = self.texts.get(id(inputs))
            if rows is not None and index < len(rows):
                return rows[index]
            return decode(inputs, index)

        return describe

    def convert(self, label: str, op_types: Sequence[str], excluded: Sequence[str],
                high_precision: str, meanwhile: Callable[[], None] | None = None
                ) -> Attempt:
        assert self.calibration is not None
        if self.method == "auto":  # max or mse: the better model on the search split
            return self.choose_method(label, op_types, excluded, high_precision, meanwhile)
        method = "entropy" if self.method == "entropy" else "max"
        if own_qdq(op_types, self.method, high_precision):
            self.quantizer = "trtpack"
            path = self.quantize_own(label, op_types, excluded, meanwhile)
            if self.method == "percentile":
                self.percentile_ranges(path)  # mse: set by quantize_own
            return self.judge(label, path, excluded)
        self.quantizer = "ModelOpt"
        self.ctx.progress(f"ModelOpt INT8 quantization ({label}, {method} calibration on "
                          f"{self.calibration.samples} samples)")
        job = ModelOptJob("int8", int8=Int8Job(
            calibration=str(self.work / "calibration.npz"), calibration_method=method,
            high_precision=high_precision, nodes_to_exclude=list(excluded),
            op_types_to_exclude=list(self.settings.exclude_op_types),
            op_types_to_quantize=list(op_types)))
        path = self.modelopt(job, label, meanwhile)
        if self.method in ("percentile", "mse"):
            self.percentile_ranges(path)
        return self.judge(label, path, excluded)

    def choose_method(self, label: str, op_types: Sequence[str], excluded: Sequence[str],
                      high_precision: str, meanwhile: Callable[[], None] | None) -> Attempt:
        """``auto``: ``method_choice.choose_method`` on this conversion's models (``meanwhile``
        before the first); the method kept calibrates every later conversion."""
        from trtpack.precision.int8.method_choice import AUTO_METHODS, choose_method
        from trtpack.runtimes.onnxruntime import cpu_session

        def convert(method: str) -> Attempt:
            self.chosen_method = method
            return self.convert(f"{label}-{method}", op_types, excluded, high_precision,
                                meanwhile if method == AUTO_METHODS[0] else None)

        reopen = partial(cpu_session, threads=1 if self.workers > 1 else None)
        kept, self.method_choice = choose_method(convert, reopen)
        self.chosen_method = self.method_choice.chosen
        return kept

    def quantize_own(self, label: str, op_types: Sequence[str], excluded: Sequence[str],
                     meanwhile: Callable[[], None] | None = None) -> Path:
        """trtpack's own Q/DQ model (``trtpack.precision.int8.qdq``) of ``quantize_source``
        in ``<work>/<label>/model.onnx``; ``meanwhile`` runs first (it may measure the
        calibration, in the references' run)."""
        from trtpack.precision.int8.qdq import quantize

        assert self.calibration is not None
        if meanwhile is not None:
            meanwhile()
        self.ctx.progress(f"INT8 Q/DQ ({label}, {self.method} calibration on "
                          f"{self.calibration.samples} samples)")
        started = time.perf_counter()
        out_dir = self.work / label
        out_dir.mkdir()
        output = out_dir / "model.onnx"
        measured = self.qdq_calibration
        reuse = measured is not None and measured[0] == self.quantize_source \
            and set(op_types) <= set(measured[1])
        result = quantize(self.quantize_source, output, op_types, excluded,
                          self.settings.exclude_op_types, self.calibration.feeds,
                          measured[2] if reuse and measured is not None else None,
                          "mse" if self.method == "mse" else "max")
        seconds = time.perf_counter() - started
        self.conversion_seconds += seconds
        self.conversions += 1
        result["seconds"] = round(seconds, 2)
        self.qdq_results.append(result)
        self.ctx.log.info("own INT8 Q/DQ %s: %s", label, json.dumps(result))
        return output

    def search_inputs(self) -> SearchInputs:
        """What the fallback search decides on (``trtpack.precision.int8.fallback``)."""
        return SearchInputs(self.recipe, self.fp32, self.cases, self.decision_cases(),
                            bool(self.check_cases), self.settings.high_precision,
                            self.plan.min_int8_share, self.workers,
                            {n: self.display(n) for n in self.module_paths}, self.ctx.progress)

    def attempt_with(self, op_types: Sequence[str], label: str, excluded: list[str],
                     surrogate: Callable[[], onnx.ModelProto]) -> Attempt:
        """A choice of the search made real and judged: with FP32 kept nodes the surrogate
        is the model ModelOpt would build (saved, no conversion); else a ModelOpt conversion
        with ``excluded`` kept in the recipe's high precision."""
        high_precision = self.settings.high_precision
        if high_precision != "fp32":
            return self.convert(label, op_types, excluded, high_precision)
        from trtpack.onnx_tools.files import save_model

        out_dir = self.work / label
        out_dir.mkdir()
        save_model(surrogate(), out_dir / "model.onnx")
        return self.judge(label, out_dir / "model.onnx", excluded)

    def searched(self, first: Attempt, user_excluded: list[str], op_types: Sequence[str]
                 ) -> tuple[Attempt, FallbackSummary]:
        """``--fallback auto``: the fallback search from ``first`` (quantized with FP32 kept
        nodes), or ``first`` itself, converted anew when kept nodes are not FP32."""
        final, search = int8_fallback(self.search_inputs(), first, user_excluded,
                                      partial(self.attempt_with, op_types),
                                      self.check_failures)
        if not search.rounds and self.settings.high_precision != "fp32":
            final = self.convert("final", op_types, user_excluded,
                                 self.settings.high_precision)
        return final, search

    def smooth(self) -> SmoothQuantSummary:
        """SmoothQuant (``trtpack.precision.smoothquant``): ModelOpt quantizes a smoothed
        copy of the FP32 model; the references stay the original's."""
        from trtpack.precision.smoothquant import smooth_source

        assert self.calibration is not None and self.settings.smoothquant is not None
        self.ctx.progress(f"SmoothQuant (alpha {self.settings.smoothquant})")
        self.fp32_model, self.quantize_source, smoothed = smooth_source(
            self.source, self.calibration.feeds, self.settings.smoothquant,
            self.settings.smoothquant_producers or None, self.work / "smoothed")
        self.ctx.log.info("SmoothQuant: %d activations smoothed: %s", len(smoothed),
                          ", ".join(smoothed))
        return SmoothQuantSummary(self.settings.smoothquant, len(smoothed))

    def percentile_ranges(self, path: Path) -> None:
        """A max model's activation ranges set by ``percentile`` or ``mse`` (for a ModelOpt
        model: trtpack's own Q/DQ calibrates ``mse`` itself; ``activation_ranges``)."""
        from trtpack.precision.int8.activation_ranges import rescale_model

        assert self.calibration is not None
        changed = rescale_model(path, self.quantize_source, self.calibration.feeds, self.method)
        self.ctx.log.info("%s calibration: %d activation ranges set", self.method, changed)

    def split_rows(self, session: CpuSession, *splits: tuple[str, Sequence[Case]]
                   ) -> list[list[VerificationRow]]:
        """The rows of each split's cases, run in ``session``."""
        from trtpack.runtimes.onnxruntime import run_session
        from trtpack.verify.compare import compare_cases

        every = [c for _, cases in splits for c in cases]
        outputs = run_session(session, [c.inputs for c in every], self.workers)
        found, start = [], 0
        for check, cases in splits:
            mine = outputs[start:start + len(cases)]
            start += len(cases)
            found.append(compare_cases(check, self.recipe, "int8", cases, mine,
                                       self.split_text()) if cases else [])
        return found

    def judge(self, label: str, path: Path, excluded: Sequence[str]) -> Attempt:
        """Verified at the profile corners and on the search split (what the search may
        look at); the held-out split is judged once, on the final model (in ``run``).
        The attempt keeps its ONNX Runtime session for that."""
        from trtpack.runtimes.onnxruntime import cpu_session

        session = cpu_session(path, threads=1 if self.workers > 1 else None)
        attempt = Attempt(label, path, list(excluded), self.verify(path, session, self.workers))
        (search_rows,) = self.split_rows(session, ("int8-search", self.search))
        attempt.search_worst = worst_metric(search_rows)
        attempt.search_passed = all(r.passed for r in search_rows)
        attempt.search_reasons = [f"{r.corner}: {r.reason}" for r in search_rows
                                   if not r.passed][:5]
        attempt.split_rows = search_rows
        attempt.session = session
        return attempt

    def run(self) -> ConversionResult:
        s = self.settings
        user_excluded = self.resolve(s.exclude_nodes, "exclude_nodes")
        self.load_calibration()
        smoothed = self.smooth() if s.smoothquant is not None else None
        # the first model already quantizes only the op types the search works on
        auto = self.plan.fallback == "auto"
        op_types = self.op_types_to_quantize()
        first = self.convert("quantize", op_types, user_excluded,
                             "fp32" if auto else s.high_precision, self.split_references)
        final, search = self.searched(first, user_excluded, op_types) if auto \
            else (first, FallbackSummary(self.plan.fallback, 0))
        added = [n for n in final.excluded if n not in user_excluded]
        overlay = None
        changed_types = op_types != list(s.quantize_op_types)
        if final.passed and (added or changed_types):
            section: dict[str, list[str]] = {}
            if changed_types:
                section["quantize_op_types"] = op_types
            section["exclude_nodes"] = [*s.exclude_nodes, *added]
            overlay = self.write_overlay(
                section, f"{len(added)} nodes kept in {s.high_precision} after a measured "
                "per-node-group search so that the INT8 model passes its gate")
        assert final.session is not None  # every judged attempt keeps its session
        held_out_rows, calibration_rows, check_rows = self.split_rows(
            final.session, ("int8-heldout", self.held_out),
            ("int8-calibration", self.calibration_cases), ("int8-check", self.check_cases))
        final.session = first.session = None  # closes them
        stats = self.stats(final.path)
        if auto and final.passed and self.share_gate:
            check_int8_share(stats, self.plan.min_int8_share)
        if stats["compute_nodes"] and stats["low_precision_nodes"] == 0:
            self.warnings.append("no MatMul/Gemm/Conv node is quantized: this INT8 model "
                                 f"computes in {s.high_precision}")
        assert self.calibration is not None
        cal = self.calibration
        held = SplitSummary.of(held_out_rows)
        metrics = Int8Metrics(
            excluded_nodes=final.excluded, excluded_by_fallback=added,
            excluded_node_hints=self.hints(added), low_precision=stats,
            before=first.summary(), after=final.summary(), fallback=search,
            calibration=calibration_summary(cal, self.method, smoothed, self.method_choice),
            splits={"calibration": SplitSummary.of(calibration_rows),
                    "check": SplitSummary.of(check_rows),
                    "search": SplitSummary.of(final.split_rows), "holdout": held},
            quantize_op_types=op_types or "modelopt default",
            high_precision=s.high_precision, kept_layers=[self.display(n) for n in added],
            quantizer=self.quantizer)
        message = int8_message(stats, self.method, cal, final.worst, held, final is not first,
                               first.worst, search.check_consultations,
                               [self.display(n) for n in added], s.high_precision,
                               final.threshold, self.method_choice)
        rows = list(final.rows)
        if auto:
            rows += held_out_rows  # the held-out split gates the build
        elif held_out_rows and not all(r.passed for r in held_out_rows):
            self.warnings.append(
                "--fallback off: the INT8 model fails on the held-out calibration samples "
                "(not gated): " + "; ".join(r.reason for r in held_out_rows if not r.passed))
        if not final.passed and final.search_reasons and all(r.passed for r in final.rows):
            self.warnings.append("INT8 model passes at the profile corners but not on the "
                                 "search split: " + "; ".join(final.search_reasons))
        final.rows = rows
        return self.finish(final, metrics, overlay, message)
