"""FP16: ModelOpt AutoCast, verified per sample at every profile corner; the fallback keeps
the nodes that add the most error (ranked by comparing every intermediate tensor of the
FP16 model with the FP32 one) in FP32, more each round."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from trtpack.cases import Case
from trtpack.errors import StageError
from trtpack.precision.conversion import Attempt, Conversion, ConversionResult, format_metric
from trtpack.precision.graph import DATA_MOVEMENT
from trtpack.precision.metrics import FallbackSummary, Fp16Metrics
from trtpack.precision.modelopt_jobs import Fp16Job, ModelOptJob, ModelOptWorker
from trtpack.runtimes.onnxruntime import cpu_session
from trtpack.shapes import BATCH_AXIS

if TYPE_CHECKING:
    from trtpack.sources.recipe import Recipe

# Rounds of the FP16 fallback; round r keeps FP16_FIRST_NODES * 2**(r-1) more nodes in FP32.
MAX_FP16_ROUNDS = 4

FP16_FIRST_NODES = 4

MIN_FP16_SHARE = 0.5
"""Below this share of Conv/MatMul/Gemm in FP16, the report's header warns."""

CONVERTER_NAMES = {"autocast": "ModelOpt AutoCast",
                   "float16": "onnxconverter-common float16"}


def autocast_reference_inputs(cases: Sequence[Case], recipe: Recipe) -> dict[str, np.ndarray]:
    """The one input the FP16 range rule sees: one row of the largest profile corner (real
    tokens, the longest sequence; the row with the fewest padding tokens).

    The values it looks for (what would overflow FP16) are per token, not per batch, and the
    variant is verified at every corner afterwards, with the fallback behind that. AutoCast's
    own reference run over every corner kept all their intermediate tensors in memory
    (bert-large's figure: benchmarks/README.md, "Figures behind design choices")."""
    # the batch axis of each input that has one, wherever it is (a recurrent state carries
    # it second: [layers, batch, hidden]); all of them are cut to the same row
    batch_axis = {i.name: i.axes.index(BATCH_AXIS) for i in recipe.input_specs()
                  if BATCH_AXIS in i.axes}
    largest = max(cases, key=lambda c: sum(v.size for v in c.inputs.values()))
    mask = next((i.name for i in recipe.inputs if i.kind == "attention_mask"
                 and batch_axis.get(i.name) == 0 and largest.inputs[i.name].ndim == 2), None)
    row = int(largest.inputs[mask].sum(axis=1).argmax()) if mask else 0
    return {k: (np.take(v, [row], axis=batch_axis[k]) if k in batch_axis else v)
            for k, v in largest.inputs.items()}


class Fp16Conversion(Conversion):
    precision = "fp16"

    @property
    def range_nodes_file(self) -> Path:
        return self.work / "fp16_range_nodes.json"

    def range_nodes(self) -> list[str]:
        """Nodes kept in FP32 because their values on the reference input exceed FP16's
        safe range (AutoCast's I/O range rule)."""
        path = self.range_nodes_file
        return list(json.loads(path.read_text())) if path.is_file() else []

    converter = "autocast"  # or "float16" once AutoCast could not convert this graph
    autocast_failure: str | None = None

    @property
    def blocked_by_failure(self) -> dict[str, str]:
        """Node -> the ONNX Runtime error that kept it in FP32 (the float16 converter)."""
        blocked = self.last_result.get("blocked_by_failure", {})
        return dict(blocked) if self.converter == "float16" else {}

    @property
    def bodies_kept_fp32(self) -> dict[str, str]:
        """Control-flow body (``node/attribute``) -> why the float16 converter left it FP32
        (the others are converted as graphs of their own, FP32 at their boundaries)."""
        kept = self.last_result.get("kept_fp32", {})
        return dict(kept) if self.converter == "float16" else {}

    def convert(self, label: str, keep_fp32: Sequence[str]) -> Attempt:
        s = self.recipe.precision_options.fp16
        reference = self.work / "reference_input.npz"
        if not reference.is_file():
            with open(reference, "wb") as f:
                np.savez(f, allow_pickle=False,
                         **autocast_reference_inputs(self.cases, self.recipe))
        job = ModelOptJob("fp16", fp16=Fp16Job(
            keep_io_types=s.keep_io_types, nodes_to_exclude=list(keep_fp32),
            op_types_to_exclude=list(s.keep_fp32_op_types), reference_inputs=str(reference),
            range_nodes_file=str(self.range_nodes_file), converter=self.converter))
        if self.converter == "autocast":
            try:
                path = self.modelopt(job, label)
                return Attempt(label, path, list(keep_fp32), self.verify(path))
            except (StageError, RuntimeError) as e:  # an exception, a crash, a bad model
                self.autocast_failure = " ".join(str(e).split())[:300]
                self.converter = "float16"
                self.ctx.progress("AutoCast could not convert this graph; onnxconverter-common"
                                  "'s float16 instead")
                shutil.rmtree(self.work / label, ignore_errors=True)
                return self.convert(label, keep_fp32)
        self.worker = self.worker if self.worker is not None and \
            self.worker.mode == "float16" else ModelOptWorker("float16", self.ctx.stage_dir)
        path = self.modelopt(replace(job, mode="fp16"), label)
        return Attempt(label, path, list(keep_fp32), self.verify(path))

    def run(self) -> ConversionResult:
        s = self.recipe.precision_options.fp16
        user_nodes = self.resolve(s.keep_fp32_nodes, "keep_fp32_nodes")
        self.ctx.progress("ModelOpt AutoCast to FP16")
        first = self.convert("autocast", user_nodes)
        final = first
        added: list[str] = []
        rounds = 0
        if not first.passed and self.plan.fallback == "auto":
            while not final.passed and rounds < MAX_FP16_ROUNDS:
                rounds += 1
                failing = [c for c, r in zip(self.cases, self._case_pass(final), strict=True)
                           if not r] or self.cases
                probe = min(failing, key=lambda c: sum(v.size for v in c.inputs.values()))
                ranked = rank_fp16_nodes(self.source, final.path, probe.inputs,
                                         skip=[*user_nodes, *added])
                take = FP16_FIRST_NODES * 2 ** (rounds - 1)
                new = [name for name, err in ranked[:take] if err > 0]
                if not new:
                    break
                added.extend(new)
                self.ctx.progress(f"fallback round {rounds}: {len(added)} nodes kept in FP32 "
                                  f"(worst metric {format_metric(final.worst, final.threshold)})")
                final = self.convert(f"fallback{rounds}", [*user_nodes, *added])
        overlay = None
        if added and final.passed:
            overlay = self.write_overlay(
                {"keep_fp32_nodes": [*s.keep_fp32_nodes, *added]},
                f"{len(added)} nodes kept in FP32 so that the FP16 model passes its gate")
        stats = self.stats(final.path)
        converter = CONVERTER_NAMES[self.converter]
        metrics = Fp16Metrics(
            excluded_nodes=[*user_nodes, *added], excluded_by_fallback=added,
            excluded_node_hints=self.hints(added), low_precision=stats,
            before=first.summary(), after=final.summary(),
            fallback=FallbackSummary(self.plan.fallback, rounds),
            keep_io_types=s.keep_io_types, kept_fp32_out_of_range=self.range_nodes(),
            converter=converter, autocast_failure=self.autocast_failure,
            kept_fp32_reasons=self.kept_reasons(user_nodes, added))
        if self.autocast_failure is not None:
            self.warnings.append(f"ModelOpt AutoCast could not convert this graph "
                                 f"({self.autocast_failure}); converted with {converter}")
        if stats["compute_nodes"] and stats["share"] < MIN_FP16_SHARE:
            self.warnings.append(
                f"only {stats['low_precision_nodes']}/{stats['compute_nodes']} Conv/MatMul/Gemm"
                f" nodes run in FP16 ({stats['share']:.0%}); the rest stay FP32 (which and why: "
                "the report's precision metrics, kept_fp32_reasons)")
        message = (f"fp16 ({converter}): {stats['low_precision_nodes']}/"
                   f"{stats['compute_nodes']} Conv/MatMul/Gemm in FP16, worst metric "
                   f"{format_metric(final.worst, final.threshold)}")
        if added:
            message += (f" ({len(added)} nodes kept in FP32 by fallback, was "
                        f"{format_metric(first.worst, first.threshold)})")
        return self.finish(final, metrics, overlay, message)

    def kept_reasons(self, user_nodes: Sequence[str], added: Sequence[str]) -> dict[str, str]:
        """Each node kept in FP32 and why."""
        reasons = {n: "precision_options.fp16.keep_fp32_nodes" for n in user_nodes}
        reasons.update((n, "its values exceed FP16's range on the reference input")
                       for n in self.range_nodes() if self.converter == "autocast")
        reasons.update((n, f"ONNX Runtime failed on it in FP16: {why}")
                       for n, why in self.blocked_by_failure.items())
        reasons.update((body, f"a control-flow body kept FP32 whole: {why}")
                       for body, why in self.bodies_kept_fp32.items())
        reasons.update((n, "the fallback: it added the most error against the gate")
                       for n in added)
        return reasons

    def _case_pass(self, attempt: Attempt) -> list[bool]:
        by_case: dict[tuple[int, str], bool] = {}
        for r in attempt.rows:
            key = (r.profile, r.corner)
            by_case[key] = by_case.get(key, True) and r.passed
        return [by_case.get((c.profile, c.corner), True) for c in self.cases]


def rank_fp16_nodes(fp32_path: Path, fp16_path: Path, feed: Mapping[str, np.ndarray],
                    skip: Iterable[str] = ()) -> list[tuple[str, float]]:
    """Nodes of the FP32 model ranked by the relative error they add in the FP16 model.

    Every float tensor both models compute is compared; a node's added error is its output
    error minus the largest error of its float inputs.
    """
    import onnx

    fp32 = onnx.load(str(fp32_path), load_external_data=False)
    ref = all_tensors(fp32_path, feed)
    low = all_tensors(fp16_path, feed)

    def rel(name: str) -> float | None:
        if name not in ref or name not in low:
            return None
        a = np.asarray(ref[name], dtype=np.float64)
        b = np.asarray(low[name], dtype=np.float64)
        if a.shape != b.shape or a.size == 0 or not np.issubdtype(ref[name].dtype, np.floating):
            return None
        if not np.isfinite(b).all():
            return float("inf")
        return float(np.linalg.norm(a - b) / (np.linalg.norm(a) + 1e-12))

    skipped = set(skip)
    ranked: list[tuple[str, float]] = []
    for node in fp32.graph.node:
        if node.name in skipped or node.op_type in DATA_MOVEMENT:
            continue
        outs = [e for e in (rel(t) for t in node.output) if e is not None]
        if not outs:
            continue
        ins = [e for e in (rel(t) for t in node.input) if e is not None]
        added = max(outs) - (max(ins) if ins else 0.0)
        if not np.isfinite(added):
            added = 1e9
        ranked.append((node.name, added))
    ranked.sort(key=lambda item: -item[1])
    return ranked


def all_tensors(path: Path, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every intermediate tensor of a model for one feed (polygraphy marks them outputs)."""
    import onnx
    from polygraphy import constants
    from polygraphy.backend.onnx import ModifyOutputs

    from trtpack.verify.compare import quiet_polygraphy

    model = onnx.load(str(path), load_external_data=True)
    for vi in list(model.graph.value_info):
        if not vi.type.HasField("tensor_type"):
            model.graph.value_info.remove(vi)
    with quiet_polygraphy():
        marked = ModifyOutputs(model, outputs=constants.MARK_ALL)()
    session = cpu_session(marked)
    names = [o.name for o in session.get_outputs()]
    inputs = {i.name for i in session.get_inputs()}
    values = session.run(names, {k: v for k, v in feed.items() if k in inputs})
    return {n: v for n, v in zip(names, values, strict=True) if isinstance(v, np.ndarray)}
