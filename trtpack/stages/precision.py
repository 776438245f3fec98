"""Precision: the FP32 ONNX made FP16 (ModelOpt AutoCast) or INT8 (ModelOpt PTQ, Q/DQ), then
verified against the FP32 ONNX at every profile corner (ONNX Runtime CPU, polygraphy's
comparator). TensorRT 11 takes precision from the ONNX, so this model is what the engine
stage builds.

When the variant fails its gate and ``--fallback auto`` (the default), nodes are kept in
higher precision and the conversion redone until the gate passes or the budget is spent
(see ``trtpack.quantization_search``). The chosen exclusions are written to a recipe
overlay (``extends: <recipe>`` + ``precision_options``) that makes the build reproducible.

Every ModelOpt call runs in ``trtpack.stages._modelopt_worker``, in its own process and a
temporary working directory inside the stage folder, with its output in the stage log.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtpack.calibration import (
    CalibrationData,
    calibration_path,
    file_sha256,
    load_calibration,
    save_feeds,
)
from trtpack.cases import Case, load_cases
from trtpack.errors import StageError, UserInputError
from trtpack.onnx_files import link_or_copy, move_model
from trtpack.options import BuildOptions
from trtpack.quantization_search import evaluation_workers
from trtpack.report import VerificationRow
from trtpack.stages.base import StageContext, StageOutcome

# Bump when the conversion or the search changes what this stage produces (cache key).
ALGORITHM_VERSION = 3
# Op types quantized by the fallback (ModelOpt's default also quantizes Add inputs, which
# costs MiniLM the most accuracy, measured one node group at a time).
FALLBACK_QUANTIZE_OP_TYPES = ["MatMul", "Gemm", "Conv"]
# The search aims this share of (1 - min_cosine) above the gate, so that its choice, made
# on the held-out calibration samples and the profile corners, holds on unseen inputs.
SEARCH_MARGIN = 0.5
# The INT8 search decides node by node (True) or per shared activation (Q/K/V together).
SEARCH_PER_NODE = True
# The greedy step tries every group left after the bisection, until this many in a row
# fail (a toggled evaluation is one ONNX Runtime run, so trying them all is cheap).
GREEDY_FAILURES = 64
# Conversions after the first one that the INT8 fallback may spend.
MAX_INT8_ROUNDS = 3
# Rounds of the FP16 fallback; round r keeps FP16_FIRST_NODES * 2**(r-1) more nodes in FP32.
MAX_FP16_ROUNDS = 4
FP16_FIRST_NODES = 4
# ONNX Runtime runs the search spends at most (each a few seconds on MiniLM).
MAX_SEARCH_EVALUATIONS = 60
WORKER_TIMEOUT_SECONDS = 4 * 3600


def fingerprint(options: BuildOptions) -> dict[str, Any]:
    r = options.recipe
    path = calibration_path(options) if options.precision == "int8" else None
    if path is not None and not path.is_file():
        raise UserInputError(f"calibration file {path} does not exist")
    return {
        "algorithm": ALGORITHM_VERSION,
        "search": [SEARCH_MARGIN, SEARCH_PER_NODE, MAX_INT8_ROUNDS, MAX_FP16_ROUNDS,
                   FP16_FIRST_NODES, MAX_SEARCH_EVALUATIONS, FALLBACK_QUANTIZE_OP_TYPES,
                   GREEDY_FAILURES],
        "precision": options.precision,
        "precision_options": r.precision_options.model_dump(),
        "verify": r.verify.model_dump(),
        "outputs": [o.model_dump() for o in r.outputs],
        "calibration_sha256": file_sha256(path) if path is not None else None,
        "calibration_method": options.calibration_method,
        "fallback": options.fallback,
        "seed": options.seed,
        "profiles": [p.to_dict() for p in options.profiles],
    }


def run(ctx: StageContext) -> StageOutcome:
    precision = ctx.options.precision
    if precision not in ("fp16", "int8"):
        raise UserInputError(f"the precision stage converts to fp16 or int8, not {precision}")
    work = Path(tempfile.mkdtemp(prefix=".work-", dir=ctx.stage_dir))
    # the first conversion's worker imports ModelOpt while its job is prepared here
    worker = ModelOptWorker(precision, ctx.stage_dir)
    try:
        source = _prepare_source(ctx.artifact("onnx"), work / "source")
        if precision == "fp16":
            return _Fp16(ctx, work, source, worker).run()
        return _Int8(ctx, work, source, worker).run()
    finally:
        worker.close()
        shutil.rmtree(work, ignore_errors=True)


# ----------------------------------------------------------------------------- helpers


def _external_locations(model: Any) -> set[str]:
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    found = set()
    for tensor in model.graph.initializer:
        if uses_external_data(tensor):
            found.add(ExternalDataInfo(tensor).location)
    return found


def _prepare_source(onnx_path: Path, folder: Path) -> Path:
    """The FP32 model in a folder of our own, every node with a unique name.

    ModelOpt writes temporary files beside its input, and names unnamed nodes itself; the
    exclusions written to the overlay must name the nodes the same way on the next build,
    so unnamed nodes get deterministic names (``<op type>_<index>``) here first.
    """
    import onnx

    folder.mkdir(parents=True)
    model = onnx.load(str(onnx_path), load_external_data=False)
    for location in _external_locations(model):
        # A copy, not a link: onnx (>= 1.23) refuses external data files that are symlinks
        # or have more than one hard link, and the stage cache hard-links build files.
        shutil.copyfile(onnx_path.parent / location, folder / location)
    dst = folder / "model.onnx"
    seen: set[str] = set()
    renamed = False
    for i, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            base = f"{node.op_type}_{i}"
            name = base
            while name in seen:
                name += "_"
            node.name = name
            renamed = True
        seen.add(node.name)
    if renamed:
        onnx.save_model(model, str(dst))
    else:
        link_or_copy(onnx_path, dst)
    return dst


def resolve_node_patterns(names: Sequence[str], patterns: Sequence[str]
                          ) -> tuple[list[str], list[str]]:
    """(matched node names, patterns that matched nothing). A pattern is an exact node name
    or a regular expression matching a whole name."""
    matched: list[str] = []
    unmatched: list[str] = []
    name_set = set(names)
    for pattern in patterns:
        if pattern in name_set:
            hits = [pattern]
        else:
            try:
                regex = re.compile(pattern)
            except re.error:
                hits = []
            else:
                hits = [n for n in names if regex.fullmatch(n)]
        if not hits:
            unmatched.append(pattern)
        matched.extend(h for h in hits if h not in matched)
    return matched, unmatched


@dataclass
class Attempt:
    """One converted model and how it fared."""

    label: str
    path: Path
    excluded: list[str]
    rows: list[VerificationRow]
    # the search split (INT8): judged with the corners on every attempt
    holdout_worst: float | None = None
    holdout_passed: bool = True
    holdout_reasons: list[str] = field(default_factory=list)
    split_rows: list[VerificationRow] = field(default_factory=list)
    session: Any = field(default=None, repr=False)  # ONNX Runtime's, while it is needed

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows) and self.holdout_passed

    @property
    def worst(self) -> float | None:
        values = [r.metric_value for r in self.rows if r.metric_value is not None]
        return min(values) if values else None

    def summary(self) -> dict[str, Any]:
        return {
            "worst_metric": self.worst,
            "search_worst_metric": self.holdout_worst,
            "max_abs_diff": max((r.max_abs_diff for r in self.rows), default=None),
            "failed_checks": sum(not r.passed for r in self.rows),
            "search_passed": self.holdout_passed,
            "passed": self.passed,
        }


class ModelOptWorker:
    """A ``trtpack.stages._modelopt_worker`` process started ahead of its job: it imports
    ModelOpt while the caller prepares the job, then runs it in a throw-away working
    directory (ModelOpt drops temporary files in the current directory), its output in
    files there."""

    def __init__(self, mode: str, parent_dir: Path) -> None:
        self.cwd = Path(tempfile.mkdtemp(prefix="modelopt-", dir=parent_dir))
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        env.setdefault("HF_HUB_OFFLINE", "1")
        self.started = time.perf_counter()
        self.submitted = self.started
        with open(self.cwd / "stdout.txt", "wb") as out, \
                open(self.cwd / "stderr.txt", "wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "trtpack.stages._modelopt_worker", "--preload", mode],
                cwd=self.cwd, env=env, stdin=subprocess.PIPE, stdout=out, stderr=err)

    @property
    def head_start(self) -> float:
        return self.submitted - self.started

    def submit(self, job: dict[str, Any]) -> None:
        (self.cwd / "job.json").write_text(json.dumps(job, indent=1))
        self.submitted = time.perf_counter()
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(f"{self.cwd / 'job.json'}\n".encode())
            self.process.stdin.close()
        except BrokenPipeError:  # it ended already: wait() reports how
            pass

    def wait(self, timeout: float) -> tuple[int, str, str, float]:
        """(exit code, stdout, stderr, seconds since the job was submitted)."""
        left = timeout - (time.perf_counter() - self.submitted)
        try:
            code = self.process.wait(timeout=max(left, 1.0))
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        seconds = time.perf_counter() - self.submitted

        def read(name: str) -> str:
            return (self.cwd / name).read_text(errors="replace")

        return code, read("stdout.txt"), read("stderr.txt"), seconds

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        shutil.rmtree(self.cwd, ignore_errors=True)


class _Conversion:
    """What the FP16 and INT8 paths share: the worker, the gate, the output."""

    precision: str

    def __init__(self, ctx: StageContext, work: Path, source: Path,
                 worker: ModelOptWorker | None = None) -> None:
        import onnx

        self.ctx = ctx
        self.options = ctx.options
        self.recipe = ctx.options.recipe
        self.work = work
        self.source = source
        self.quantize_source = source  # what ModelOpt quantizes (a smoothed copy for INT8)
        self.cases = load_cases(ctx.artifact("fp32_outputs"))
        from trtpack.module_paths import module_paths

        graph = onnx.load(str(source), load_external_data=False).graph
        self.node_names = [n.name for n in graph.node]
        self.op_types = {n.name: n.op_type for n in graph.node}
        self.module_paths = module_paths(graph.node)
        self._sample_text: Any = None
        self._tokenizer: Any = None
        self.conversion_seconds = 0.0
        self.conversions = 0
        self.worker = worker  # started ahead of the first conversion
        self.warnings: list[str] = []
        self.check = f"{self.precision}-vs-fp32"

    def modelopt(self, job: dict[str, Any], label: str,
                 meanwhile: Callable[[], None] | None = None) -> Path:
        """Run a conversion in the worker (``meanwhile`` runs here while it works); returns
        the converted model (``<work>/<label>/model.onnx``)."""
        out_dir = self.work / label
        out_dir.mkdir()
        output = out_dir / "model.onnx"
        worker = self.worker or ModelOptWorker(self.precision, self.ctx.stage_dir)
        self.worker = None  # one job per worker
        try:
            job = {**job, "input": str(self.quantize_source), "output": str(output),
                   "result": str(worker.cwd / "result.json")}
            worker.submit(job)
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
                last = lines[-1] if lines else f"exit code {returncode}"
                raise StageError(self.ctx.stage, f"ModelOpt {self.precision} conversion "
                                 f"({label}) failed: {last}")
            self.conversion_seconds += seconds
            self.conversions += 1
            result = json.loads((worker.cwd / "result.json").read_text())
            self.ctx.log.info("ModelOpt %s result: %s", label, json.dumps(result))
            return output
        finally:
            worker.close()

    def verify(self, path: Path, session: Any = None, workers: int = 1
               ) -> list[VerificationRow]:
        """Rows of the profile corners (``session``: one already open on ``path``, run
        from ``workers`` threads)."""
        from trtpack.runtimes.onnxruntime import cpu_session, run_session
        from trtpack.verification import compare_cases

        outputs = run_session(session or cpu_session(path), [c.inputs for c in self.cases],
                              workers)
        return compare_cases(self.check, self.recipe, self.precision, self.cases, outputs,
                             self.sample_text())

    def tokenizer(self) -> Any:
        """The model's tokenizer (loaded once), or None."""
        folder = self.ctx.artifacts.get("tokenizer")
        if folder is None:
            return None
        if self._tokenizer is None:
            from trtpack.calibration import load_tokenizer

            self._tokenizer = load_tokenizer(folder)
        return self._tokenizer

    def sample_text(self) -> Any:
        """A ``SampleText`` decoding token ids with the model's tokenizer (None: no text)."""
        if self._sample_text is None:
            from trtpack.verification import token_text

            ids = next((i.name for i in self.recipe.inputs if i.kind == "token_ids"), None)
            mask = next((i.name for i in self.recipe.inputs if i.kind == "attention_mask"),
                        None)
            tokenizer = self.tokenizer() if ids else None
            self._sample_text = token_text(tokenizer, ids, mask) if tokenizer and ids \
                else (lambda inputs, index: None)
        return self._sample_text

    def display(self, name: str) -> str:
        """``encoder.layer.3.attention.self.query (MatMul)``: module path and op type."""
        from trtpack.module_paths import display_name

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

    def stats(self, path: Path) -> dict[str, Any]:
        import onnx

        from trtpack.quantization_search import low_precision_stats

        model = onnx.load(str(path), load_external_data=False)
        return low_precision_stats(model, self.precision).as_dict()

    def hints(self, names: Sequence[str]) -> dict[str, str]:
        import onnx

        from trtpack.quantization_search import node_hint

        model = onnx.load(str(self.source), load_external_data=False)
        inits = {i.name for i in model.graph.initializer}
        by_name = {n.name: n for n in model.graph.node}
        return {n: (self.display(n) if n in self.module_paths else node_hint(by_name[n], inits))
                for n in names if n in by_name}

    def write_overlay(self, section: dict[str, Any], note: str) -> Path:
        """The overlay YAML; node names (stable, for matching) get their module path and
        op type beside them as a comment."""
        import yaml

        from trtpack.recipe import overlay_document

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

    def finish(self, final: Attempt, metrics: dict[str, Any], overlay: Path | None,
               message: str) -> StageOutcome:
        out = self.ctx.stage_dir / "model.onnx"
        move_model(final.path, out)
        artifacts = {"precision_onnx": out}
        if overlay is not None:
            artifacts["recipe_overlay"] = overlay
        metrics.update({"conversions": self.conversions,
                        "conversion_seconds": round(self.conversion_seconds, 2)})
        return StageOutcome(artifacts=artifacts, metrics=metrics, verification=final.rows,
                            warnings=self.warnings, message=message)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


# ----------------------------------------------------------------------------- FP16


def autocast_reference_inputs(cases: Sequence[Case], recipe: Any) -> dict[str, Any]:
    """The one input the FP16 range rule sees: one row of the largest profile corner (real
    tokens, the longest sequence; the row with the fewest padding tokens).

    The values it looks for (what would overflow FP16) are per token, not per batch, and the
    variant is verified at every corner afterwards, with the fallback behind that. AutoCast's
    own reference run over every corner kept all their intermediate tensors in memory:
    21 GB on bert-large."""
    batched = {i.name for i in recipe.input_specs() if i.has_dynamic_batch}
    largest = max(cases, key=lambda c: sum(v.size for v in c.inputs.values()))
    mask = next((i.name for i in recipe.inputs if i.kind == "attention_mask"
                 and i.name in batched and largest.inputs[i.name].ndim == 2), None)
    row = int(largest.inputs[mask].sum(axis=1).argmax()) if mask else 0
    return {k: (v[row:row + 1] if k in batched else v) for k, v in largest.inputs.items()}


class _Fp16(_Conversion):
    precision = "fp16"

    @property
    def range_nodes_file(self) -> Path:
        return self.work / "fp16_range_nodes.json"

    def range_nodes(self) -> list[str]:
        """Nodes kept in FP32 because their values on the reference input exceed FP16's
        safe range (AutoCast's I/O range rule)."""
        path = self.range_nodes_file
        return list(json.loads(path.read_text())) if path.is_file() else []

    def convert(self, label: str, keep_fp32: Sequence[str]) -> Attempt:
        s = self.recipe.precision_options.fp16
        reference = self.work / "reference_input.npz"
        if not reference.is_file():
            import numpy as np

            with open(reference, "wb") as f:
                np.savez(f, **autocast_reference_inputs(self.cases, self.recipe))
        path = self.modelopt({"mode": "fp16", "fp16": {
            "keep_io_types": s.keep_io_types, "nodes_to_exclude": list(keep_fp32),
            "op_types_to_exclude": list(s.keep_fp32_op_types),
            "reference_inputs": str(reference),
            "range_nodes_file": str(self.range_nodes_file)}}, label)
        return Attempt(label, path, list(keep_fp32), self.verify(path))

    def run(self) -> StageOutcome:
        from trtpack.quantization_search import rank_fp16_nodes

        s = self.recipe.precision_options.fp16
        user_nodes = self.resolve(s.keep_fp32_nodes, "keep_fp32_nodes")
        self.ctx.progress("ModelOpt AutoCast to FP16")
        first = self.convert("autocast", user_nodes)
        final = first
        added: list[str] = []
        rounds = 0
        if not first.passed and self.options.fallback == "auto":
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
                                  f"(worst metric {_fmt(final.worst)})")
                final = self.convert(f"fallback{rounds}", [*user_nodes, *added])
        overlay = None
        if added and final.passed:
            overlay = self.write_overlay(
                {"keep_fp32_nodes": [*s.keep_fp32_nodes, *added]},
                f"{len(added)} nodes kept in FP32 so that the FP16 model passes its gate")
        stats = self.stats(final.path)
        metrics: dict[str, Any] = {
            "precision": "fp16",
            "keep_io_types": s.keep_io_types,
            "excluded_nodes": [*user_nodes, *added],
            "excluded_by_fallback": added,
            "excluded_node_hints": self.hints(added),
            "kept_fp32_out_of_range": self.range_nodes(),
            "low_precision": stats,
            "before": first.summary(),
            "after": final.summary(),
            "fallback": {"mode": self.options.fallback, "rounds": rounds},
        }
        message = (f"fp16: {stats['matmul_gemm_low_precision']}/{stats['matmul_gemm_nodes']} "
                   f"MatMul/Gemm in FP16, worst metric {_fmt(final.worst)}")
        if added:
            message += f" ({len(added)} nodes kept in FP32 by fallback, was {_fmt(first.worst)})"
        return self.finish(final, metrics, overlay, message)

    def _case_pass(self, attempt: Attempt) -> list[bool]:
        by_case: dict[tuple[int, str], bool] = {}
        for r in attempt.rows:
            key = (r.profile, r.corner)
            by_case[key] = by_case.get(key, True) and r.passed
        return [by_case.get((c.profile, c.corner), True) for c in self.cases]


# ----------------------------------------------------------------------------- INT8


class _Int8(_Conversion):
    precision = "int8"

    def __init__(self, ctx: StageContext, work: Path, source: Path,
                 worker: ModelOptWorker | None = None) -> None:
        super().__init__(ctx, work, source, worker)
        self.settings = self.recipe.precision_options.int8
        self.calibration: CalibrationData | None = None
        self.holdout: list[Case] = []
        self.search: list[Case] = []
        self.calibration_cases: list[Case] = []
        self.texts: dict[int, list[str]] = {}  # id(case inputs) -> the text of each row
        self.fp32_model: Any = None  # what ModelOpt quantizes, in memory (the search's)
        self.workers = evaluation_workers()  # ONNX Runtime runs at a time, one thread each

    @property
    def method(self) -> str:
        return self.options.calibration_method or self.settings.calibration_method

    def load_calibration(self) -> None:
        path = calibration_path(self.options)
        self.ctx.progress("loading calibration data")
        text = path is not None and path.suffix.lower() != ".npz"
        cal = load_calibration(self.recipe, self.options.profiles, path,
                               tokenizer=self.tokenizer() if text else None,
                               max_samples=self.settings.max_calibration_samples,
                               seed=self.options.seed)
        self.calibration = cal
        self.warnings.extend(cal.warnings)
        save_feeds(self.work / "calibration.npz", cal.feeds)

    def split_references(self) -> None:
        """The FP32 outputs of the three splits (one ONNX Runtime session)."""
        from trtpack.quantization_search import run_model

        cal = self.calibration
        assert cal is not None
        feeds = [*cal.holdout, *cal.search, *cal.feeds]
        refs = run_model(self.source, feeds) if feeds else []
        texts = [*cal.holdout_texts, *cal.search_texts]
        for feed, rows in zip(feeds, texts, strict=False):
            self.texts[id(feed)] = rows
        h, k = len(cal.holdout), len(cal.holdout) + len(cal.search)
        together = list(zip(feeds, refs, strict=True))
        self.holdout = [Case(-1, f"heldout{i}", f, o) for i, (f, o) in enumerate(together[:h])]
        self.search = [Case(-1, f"search{i}", f, o) for i, (f, o) in enumerate(together[h:k])]
        self.calibration_cases = [Case(-1, f"calibration{i}", f, o)
                                  for i, (f, o) in enumerate(together[k:])]

    def while_quantizing(self) -> None:
        """What needs no quantized model, done while ModelOpt works: the splits' FP32
        references, the FP32 model the search takes nodes from."""
        self.split_references()
        if self.fp32_model is None and self.options.fallback == "auto":
            import onnx

            self.fp32_model = onnx.load(str(self.quantize_source))

    def split_text(self) -> Any:
        """Sample texts for the split cases: the calibration file's own lines."""
        decode = self.sample_text()

        def describe(inputs: Any, index: int) -> str | None:
            rows = self.texts.get(id(inputs))
            if rows is not None and index < len(rows):
                return rows[index]
            return decode(inputs, index)  # type: ignore[no-any-return]

        return describe

    def convert(self, label: str, op_types: Sequence[str], excluded: Sequence[str],
                high_precision: str, meanwhile: Callable[[], None] | None = None
                ) -> Attempt:
        assert self.calibration is not None
        method = "entropy" if self.method == "entropy" else "max"
        self.ctx.progress(f"ModelOpt INT8 quantization ({label}, {method} calibration on "
                          f"{self.calibration.samples} samples)")
        path = self.modelopt({"mode": "int8", "int8": {
            "calibration": str(self.work / "calibration.npz"),
            "calibration_method": method, "high_precision": high_precision,
            "nodes_to_exclude": list(excluded),
            "op_types_to_exclude": list(self.settings.exclude_op_types),
            "op_types_to_quantize": list(op_types)}}, label, meanwhile)
        if self.method == "percentile":
            self.percentile_ranges(path)
        return self.judge(label, path, excluded)

    def smooth(self) -> dict[str, Any]:
        """SmoothQuant (``trtpack.smoothquant``): ModelOpt quantizes a smoothed copy of the
        FP32 model; the references stay the original's."""
        import onnx

        from trtpack.onnx_files import save_model
        from trtpack.smoothquant import smooth_model

        assert self.calibration is not None and self.settings.smoothquant is not None
        self.ctx.progress(f"SmoothQuant (alpha {self.settings.smoothquant})")
        model = onnx.load(str(self.source))
        smoothed = smooth_model(model, self.calibration.feeds, self.settings.smoothquant,
                                self.settings.smoothquant_producers or None)
        folder = self.work / "smoothed"
        folder.mkdir()
        save_model(model, folder / "model.onnx")
        self.quantize_source = folder / "model.onnx"
        self.fp32_model = model
        self.ctx.log.info("SmoothQuant: %d activations smoothed: %s", len(smoothed),
                          ", ".join(smoothed))
        return {"alpha": self.settings.smoothquant, "activations": len(smoothed)}

    def percentile_ranges(self, path: Path) -> None:
        """ModelOpt's max model with its activation ranges set to a percentile
        (``trtpack.activation_ranges``)."""
        import onnx

        from trtpack.activation_ranges import DEFAULT_PERCENTILE, apply_percentile_ranges
        from trtpack.onnx_files import save_model

        assert self.calibration is not None
        model = onnx.load(str(path))
        changed = apply_percentile_ranges(model, onnx.load(str(self.quantize_source)),
                                          self.calibration.feeds, DEFAULT_PERCENTILE)
        save_model(model, path)
        self.ctx.log.info("percentile calibration: %d activation ranges set to the %s "
                          "percentile", changed, DEFAULT_PERCENTILE)

    def split_rows(self, session: Any, *splits: tuple[str, Sequence[Case]]
                   ) -> list[list[VerificationRow]]:
        """The rows of each split's cases, run in ``session``."""
        from trtpack.runtimes.onnxruntime import run_session
        from trtpack.verification import compare_cases

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
        look at); the held-out split is judged once, on the final model (``heldout_gate``).
        The attempt keeps its ONNX Runtime session for that."""
        from trtpack.runtimes.onnxruntime import cpu_session

        session = cpu_session(path, threads=1 if self.workers > 1 else None)
        attempt = Attempt(label, path, list(excluded), self.verify(path, session, self.workers))
        (search_rows,) = self.split_rows(session, ("int8-search", self.search))
        attempt.holdout_worst = _worst(search_rows)
        attempt.holdout_passed = all(r.passed for r in search_rows)
        attempt.holdout_reasons = [f"{r.corner}: {r.reason}" for r in search_rows
                                   if not r.passed][:5]
        attempt.split_rows = search_rows
        attempt.session = session
        return attempt

    def run(self) -> StageOutcome:
        s = self.settings
        user_excluded = self.resolve(s.exclude_nodes, "exclude_nodes")
        self.load_calibration()
        smoothed = self.smooth() if s.smoothquant is not None else None
        # With the fallback on, the first model already quantizes only the op types the
        # search works on (ModelOpt's default placement also quantizes Add inputs, which
        # MiniLM never survives): one ModelOpt run instead of two.
        auto = self.options.fallback == "auto"
        op_types = list(s.quantize_op_types) or (list(FALLBACK_QUANTIZE_OP_TYPES) if auto
                                                 else [])
        first = self.convert("quantize", op_types, user_excluded,
                             "fp32" if auto else s.high_precision, self.while_quantizing)
        final = first
        search: dict[str, Any] = {"mode": self.options.fallback, "rounds": 0}
        if not first.passed and auto:
            final, search = self.fallback(first, user_excluded, op_types)
        elif auto and s.high_precision != "fp32":
            final = self.convert("final", op_types, user_excluded, s.high_precision)
        added = [n for n in final.excluded if n not in user_excluded]
        overlay = None
        changed_types = op_types != list(s.quantize_op_types)
        if final.passed and (added or changed_types):
            section: dict[str, Any] = {}
            if changed_types:
                section["quantize_op_types"] = op_types
            section["exclude_nodes"] = [*s.exclude_nodes, *added]
            overlay = self.write_overlay(
                section, f"{len(added)} nodes kept in {s.high_precision} after a measured "
                "per-node-group search so that the INT8 model passes its gate")
        heldout_rows, calibration_rows = self.split_rows(
            final.session, ("int8-heldout", self.holdout),
            ("int8-calibration", self.calibration_cases))
        final.session = first.session = None  # closes them
        stats = self.stats(final.path)
        if stats["compute_nodes"] and stats["low_precision_nodes"] == 0:
            self.warnings.append("no MatMul/Gemm/Conv node is quantized: this INT8 model "
                                 f"computes in {s.high_precision}")
        assert self.calibration is not None
        cal = self.calibration
        metrics: dict[str, Any] = {
            "precision": "int8",
            "calibration": {"source": cal.source, "path": str(cal.path) if cal.path else None,
                            "samples": cal.samples, "batches": len(cal.feeds),
                            "search_samples": cal.search_samples,
                            "holdout_samples": cal.holdout_samples,
                            "strata": cal.strata, "method": self.method,
                            "smoothquant": smoothed},
            "splits": {"calibration": _split_summary(calibration_rows),
                       "search": _split_summary(final.split_rows),
                       "holdout": _split_summary(heldout_rows)},
            "quantize_op_types": op_types or "modelopt default",
            "high_precision": s.high_precision,
            "excluded_nodes": final.excluded,
            "excluded_by_fallback": added,
            "excluded_node_hints": self.hints(added),
            "kept_layers": [self.display(n) for n in added],
            "low_precision": stats,
            "before": first.summary(),
            "after": final.summary(),
            "fallback": search,
        }
        message = (f"int8: {stats['matmul_gemm_low_precision']}/{stats['matmul_gemm_nodes']} "
                   f"MatMul/Gemm quantized ({stats['matmul_gemm_share']:.0%}, {self.method} "
                   f"calibration), worst sample {_fmt(final.worst)}")
        held = metrics["splits"]["holdout"]
        if held:
            message += f", held-out worst {_fmt(held['worst'])} (mean {_fmt(held['mean'])})"
            if held.get("worst_text"):
                message += f" on \"{held['worst_text']}\""
        if final is not first:
            message += f" (fallback; was {_fmt(first.worst)})"
        if added:
            shown = ", ".join(self.display(n) for n in added[:6])
            more = f" and {len(added) - 6} more" if len(added) > 6 else ""
            message += f"; kept in {s.high_precision}: {shown}{more}"
        rows = list(final.rows)
        if auto:
            rows += heldout_rows  # the held-out split gates the build
        elif heldout_rows and not all(r.passed for r in heldout_rows):
            self.warnings.append(
                "--fallback off: the INT8 model fails on the held-out calibration samples "
                "(not gated): " + "; ".join(r.reason for r in heldout_rows if not r.passed))
        if not final.passed and final.holdout_reasons and all(r.passed for r in final.rows):
            self.warnings.append("INT8 model passes at the profile corners but not on the "
                                 "search split: " + "; ".join(final.holdout_reasons))
        final.rows = rows
        return self.finish(final, metrics, overlay, message)

    def fallback(self, first: Attempt, user_excluded: list[str], op_types: list[str]
                 ) -> tuple[Attempt, dict[str, Any]]:
        import onnx

        from trtpack.onnx_files import save_model
        from trtpack.quantization_search import (
            Evaluator,
            SurrogateBuilder,
            ToggledSurrogates,
            int8_quantized_nodes,
            measure_sensitivity,
            node_groups,
            select_groups,
        )

        s = self.settings
        started = time.perf_counter()
        fp32 = self.fp32_model or onnx.load(str(self.quantize_source))
        quantized = onnx.load(str(first.path))
        candidates = sorted(int8_quantized_nodes(quantized) - set(user_excluded))
        groups = node_groups(fp32, candidates, per_node=SEARCH_PER_NODE)
        for g in groups:
            g.hints = [self.display(n) if n in self.module_paths else h
                       for n, h in zip(g.nodes, g.hints, strict=True)]
        builder = SurrogateBuilder(quantized, fp32)
        workers = self.workers
        toggled = ToggledSurrogates(quantized, fp32, groups, threads=1)
        opt_cases = [c for c in self.cases if c.corner == "opt"] or self.cases[:1]
        judged_corners = [c for c in self.cases if c.corner != "max"] or self.cases
        quick = Evaluator(self.recipe, "int8", self.search or opt_cases, workers=workers)
        self.ctx.progress(f"fallback: measuring the sensitivity of {len(groups)} node groups "
                          f"({len(candidates)} quantized nodes)")
        ranked = measure_sensitivity(toggled, groups, quick, self.ctx.progress)
        evaluations = quick.evaluations
        margin = SEARCH_MARGIN
        final = first
        history: list[dict[str, Any]] = []
        tried: set[tuple[str, ...]] = set()
        rounds = 0
        while rounds < MAX_INT8_ROUNDS:
            rounds += 1
            # the largest corner is left to the final verification (it costs the most)
            # the search split first: most candidates that fail, fail there
            judge = Evaluator(self.recipe, "int8", [*self.search, *judged_corners], margin,
                              fail_fast=True, workers=workers)
            self.ctx.progress(f"fallback round {rounds}: searching the node groups to keep "
                              f"quantized (target margin {margin:.2f})")
            selection = select_groups(toggled, ranked, judge, self.ctx.progress,
                                      MAX_SEARCH_EVALUATIONS, GREEDY_FAILURES)
            evaluations += judge.evaluations
            excluded = [*user_excluded, *selection.excluded]
            key = tuple(sorted(excluded))
            if key in tried:
                margin = 1.0 - (1.0 - margin) / 2
                continue
            tried.add(key)
            label = f"fallback{rounds}"
            if s.high_precision == "fp32":
                # the surrogate is the model ModelOpt builds with these nodes excluded
                out_dir = self.work / label
                out_dir.mkdir()
                save_model(builder.build(selection.excluded), out_dir / "model.onnx")
                final = self.judge(label, out_dir / "model.onnx", excluded)
            else:
                final = self.convert(label, op_types, excluded, s.high_precision)
            history.append({"round": rounds, "margin": round(margin, 4),
                            "quantized_groups": len(selection.quantized_groups),
                            "excluded_nodes": len(excluded), **final.summary()})
            self.ctx.progress(f"fallback round {rounds}: {len(selection.excluded)} nodes kept "
                              f"in {s.high_precision}, worst sample {_fmt(final.worst)}, "
                              f"{'passed' if final.passed else 'failed'}")
            if final.passed:
                break
            margin = 1.0 - (1.0 - margin) / 2
        info: dict[str, Any] = {
            "mode": "auto",
            "rounds": rounds,
            "evaluations": evaluations,
            "seconds": round(time.perf_counter() - started, 2),
            "node_groups": len(groups),
            "sensitivity": [
                {"layers": r.group.hints, "nodes": r.group.nodes,
                 "damage": float(f"{r.damage:.3g}"),
                 "worst": None if r.worst is None else round(r.worst, 6),
                 "kept_quantized": r.group in selection.quantized_groups}
                for r in ranked
            ],
            "history": history,
        }
        return final, info


def _worst(rows: Sequence[VerificationRow]) -> float | None:
    values = [r.metric_value for r in rows if r.metric_value is not None]
    return min(values) if values else None


def _split_summary(rows: Sequence[VerificationRow]) -> dict[str, Any]:
    """Worst and mean per-sample metric of a split, and the worst sample's text."""
    scored = [r for r in rows if r.metric_value is not None]
    if not scored:
        return {}
    worst = min(scored, key=lambda r: r.metric_value or 0.0)
    total = sum(r.samples or 1 for r in scored)
    mean = sum((r.metric_mean if r.metric_mean is not None else r.metric_value or 0.0)
               * (r.samples or 1) for r in scored) / total
    return {"samples": total, "worst": worst.metric_value, "mean": round(mean, 6),
            "worst_text": worst.worst_text, "passed": all(r.passed for r in rows),
            "failed_batches": sum(not r.passed for r in rows)}
