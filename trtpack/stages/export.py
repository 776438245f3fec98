"""Export: load the model once, record PyTorch outputs at every profile corner, write ONNX
(``trtpack.stages.torch_export``: the exporters).

The reference cases (inputs + PyTorch outputs) are saved so later stages never need the
model or torch again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from trtpack.cases import Case, save_cases
from trtpack.errors import UserInputError, first_line
from trtpack.onnx_tools.files import graph_summary
from trtpack.options import BuildPlan
from trtpack.pytorch.models import LoadedModel, load_model, source_directory
from trtpack.pytorch.user_modules import call_program_module, load_torchscript
from trtpack.report import JsonObject
from trtpack.resources import reused_heap
from trtpack.sources.recipe import Recipe
from trtpack.stages.artifacts import Artifacts
from trtpack.stages.base import StageContext, StageMetrics, StageOutcome
from trtpack.stages.torch_export import Exported, export_onnx
from trtpack.verify.sample_files import SampleInputs, file_state
from trtpack.verify.samples import make_inputs

if TYPE_CHECKING:
    import torch

# Young objects collected 140x less often than Python's default (700, 10, 10) in the
# export's process, which makes millions of short-lived objects while tracing. Only here: other
# stages keep the default (applied everywhere, it raised a later stage's memory peak).
GC_THRESHOLDS = (100_000, 50, 100)

# The largest profile corner's PyTorch forward runs beside the exporter too, at one intra-op
# thread, when its work is small: the model's parameters times the elements of its largest
# input at that corner at most LARGEST_BESIDE_WORK (minilm at 8x128: 2.3e10, about 0.3 CPU-s
# on one core here, against the exporter's seconds of Python). A larger one runs after the
# export at every thread: on one thread it would outlast the exporter (bert-large's design
# card: 128x128 at 3.4e8 parameters).
LARGEST_BESIDE_WORK = 4e10
# Such a larger corner's batch is split into pieces of rows instead (``RowPieces``): the
# forwards' thread takes them one at a time, at one intra-op thread, for as long as the
# exporter runs, and what is left runs after it at every thread as one forward. A piece's
# work is about PIECE_WORK (bert-large at 128 positions: 2 rows, about 1.3 CPU-s here), so
# the exporter's end waits for at most that.
PIECE_WORK = 1e11


@dataclass
class ExportMetrics(StageMetrics):
    parameters: int
    weights: str  # "pretrained" or "random"
    nodes: int
    opset: int | None
    source: str  # what the model came from, in words ("TorchScript silero_vad.jit")
    exporter: str  # the exporter that wrote the model: "dynamo" or "legacy" (TorchScript)
    exporter_fallback: str  # why the TorchScript exporter wrote it instead ("" when it did not)
    external_data: bool  # weights in model.onnx.data
    decomposition: str  # whether the exporter's decomposition re-trace ran, and why
    cases: int  # reference cases (profile corners)
    op_types: dict[str, int]
    sample_inputs: str | None = None  # where --sample-inputs' samples were fed, or None


def _directory_fingerprint(path: Path | None) -> list[tuple[str, int, int]]:
    if path is None or not path.is_dir():
        return []
    return sorted(
        (str(p.relative_to(path)), p.stat().st_size, int(p.stat().st_mtime))
        for p in path.rglob("*") if p.is_file()
    )


def fingerprint(plan: BuildPlan) -> JsonObject:
    r = plan.recipe
    return {
        "source": r.source.model_dump(),
        "source_files": plan.source_files,  # a PyTorch source's files (their contents)
        "files": _directory_fingerprint(source_directory(r.source)),
        "task": r.task, "model_class": r.model_class, "config": r.config,
        "tokenizer": r.tokenizer, "pooling": r.pooling.model_dump() if r.pooling else None,
        "vocab_size": r.vocab_size,
        "tokenizer_source": r.tokenizer_source.model_dump() if r.tokenizer_source else None,
        "inputs": [i.model_dump() for i in r.inputs],
        "outputs": [o.model_dump() for o in r.outputs],
        "opset": plan.opset, "exporter": r.exporter,
        "profiles": [p.to_dict() for p in plan.profiles],
        "random_weights": plan.random_weights, "seed": plan.seed,
        "sample_inputs": file_state(plan.sample_inputs),
    }


def output_selector(model: torch.nn.Module, recipe: Recipe) -> torch.nn.Module:
    import torch

    input_names = [i.name for i in recipe.inputs]
    output_names = [o.name for o in recipe.outputs]
    constants = dict(recipe.source.arguments)
    positional = recipe.source.exported_program is not None  # as it was exported

    class OutputSelector(torch.nn.Module):
        """Positional inputs in the recipe's order, a tuple of the recipe's outputs."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
            named = dict(zip(input_names, args, strict=True))
            out = call_program_module(self.model, named) if positional else \
                self.model(**named, **constants)
            if isinstance(out, torch.Tensor):
                return (out,)
            if isinstance(out, dict) or hasattr(out, "keys"):
                missing = [n for n in output_names if n not in out]
                if missing:
                    raise UserInputError(
                        f"model has no output {missing}; it returns {list(out.keys())}"
                    )
                return tuple(out[n] for n in output_names)
            return tuple(out[: len(output_names)])

    selector = OutputSelector()
    selector.training = False  # the model is in eval mode already (an unlifted
    return selector            # ExportedProgram's module refuses .eval())


def _vocab_size(loaded: LoadedModel, recipe: Recipe) -> int:
    if recipe.vocab_size:
        return recipe.vocab_size
    for obj in (loaded.config, loaded.tokenizer):
        size = getattr(obj, "vocab_size", None)
        if isinstance(size, int) and size > 0:
            return size
    return 30522


def build_cases(plan: BuildPlan, loaded: LoadedModel
                ) -> tuple[list[Case], list[str], str | None]:
    """The verification cases, warnings (corners no --sample-inputs sample fits) and where
    the --sample-inputs samples were fed (``SampleInputs.trace``)."""
    specs = plan.recipe.input_specs()
    samples = SampleInputs.of(plan, _vocab_size(loaded, plan.recipe))
    cases: list[Case] = []
    for index, profile in enumerate(plan.profiles):
        for k, (corner, shapes) in enumerate(profile.corners()):
            inputs = make_inputs(specs, shapes, tokenizer=loaded.tokenizer,
                                 vocab_size=_vocab_size(loaded, plan.recipe),
                                 seed=plan.seed + 10 * index + k, offset=5 * k + index,
                                 values=plan.recipe.value_rules())
            if not samples.use(inputs, shapes):
                samples.unfitted.append(f"profile {index} {corner}")
            cases.append(Case(index, corner, inputs))
    return cases, samples.warnings(), samples.trace(plan.sample_inputs, len(cases))


def shapes_text(inputs: dict[str, np.ndarray]) -> str:
    """``input_ids=1x16, attention_mask=1x16``: the shapes of one case's inputs."""
    return ", ".join(f"{n}={'x'.join(str(d) for d in a.shape)}" for n, a in inputs.items())


def run_torch(wrapper: torch.nn.Module, recipe: Recipe, cases: list[Case],
              fresh: Callable[[], torch.nn.Module] | None = None,
              threads: int | None = None) -> None:
    """The PyTorch outputs of every case, on a heap that reuses its large blocks
    (``resources.reused_heap``: a large model's activations are not faulted in anew at each
    layer). A forward that fails is the model's own failure at
    the profile's shapes: a ``UserInputError`` naming the corner and the shapes. ``fresh``
    (a TorchScript model that keeps state between calls) makes a new wrapper per case: each
    case runs from the saved state, as the exported graph does. ``threads``: the intra-op
    threads of the calling thread's forwards (torch keeps them per thread)."""
    import torch

    names = [i.name for i in recipe.inputs]
    if threads is not None:
        torch.set_num_threads(threads)
    with torch.inference_mode(), reused_heap():
        for case in cases:
            if fresh is not None:
                wrapper = fresh()
            try:
                outs = wrapper(*[torch.from_numpy(case.inputs[n]) for n in names])
            except UserInputError:
                raise
            except Exception as e:  # the user's model, whatever it raises, at these shapes
                first = first_line(e)
                raise UserInputError(
                    f"the model's own PyTorch forward fails at profile {case.profile} "
                    f"{case.corner} ({shapes_text(case.inputs)}): {type(e).__name__}: "
                    f"{first}", hint="choose a --profile the model accepts (e.g. sequence "
                    "lengths up to its max_position_embeddings)") from None
            case.outputs = {o.name: t.detach().float().numpy()
                            for o, t in zip(recipe.outputs, outs, strict=True)}


def copy_sharing_weights(module: torch.nn.Module) -> torch.nn.Module | None:
    """A copy of ``module``'s objects that shares its tensors (no weight is copied): what
    the exporter may trace while the module itself runs (torch.export swaps a traced
    module's parameters for fake ones while it traces). None when the module cannot be
    copied."""
    import copy

    import torch

    memo: dict[int, object] = {}
    for m in module.modules():
        for value in (*m.parameters(recurse=False), *m.buffers(recurse=False),
                      *vars(m).values()):
            if isinstance(value, torch.Tensor):
                memo[id(value)] = value
    try:
        return copy.deepcopy(module, memo)
    except Exception:  # an object of the user's model that refuses to be copied
        return None


def beside_cases(cases: list[Case], parameters: int) -> list[Case]:
    """The cases whose PyTorch outputs are computed beside the exporter
    (``reference_beside``): every case when the largest one's work is at most
    ``LARGEST_BESIDE_WORK`` (``parameters`` times the elements of its largest input), else
    every case but the largest, which then runs after the export at every thread."""
    largest = max(cases, key=lambda c: sum(a.size for a in c.inputs.values()))
    work = parameters * max(a.size for a in largest.inputs.values())
    return list(cases) if work <= LARGEST_BESIDE_WORK else [c for c in cases if c is not largest]


class RowPieces:
    """One case's batch as pieces of rows, computed in any order by several threads
    (``take``, ``put``) and put back together in row order (``join``): the outputs of a
    model whose rows are independent (a batch of sentences) are those of the whole batch,
    within float rounding."""

    def __init__(self, case: Case, rows: int) -> None:
        import threading

        self.case = case
        self.total = next(iter(case.inputs.values())).shape[0]
        self.rows = rows  # a piece's rows, as ``take`` gives them by default
        self.next_row = 0
        self.done: dict[int, Case] = {}  # first row -> the piece with its outputs
        self.lock = threading.Lock()

    @classmethod
    def of(cls, case: Case, recipe: Recipe, parameters: int) -> RowPieces | None:
        """``case`` in pieces of about ``PIECE_WORK`` (``parameters`` times the elements of
        a piece's largest input), or None where the batch cannot be split: an input or an
        output whose first axis is not the batch's (the recipe's axis names), fewer than 2
        pieces."""
        firsts = {str(axes[0]) if axes and isinstance(axes[0], str) else None
                  for axes in [*(i.axes for i in recipe.inputs), *(o.axes for o in recipe.outputs)]}
        batches = {a.shape[0] if a.ndim else None for a in case.inputs.values()}
        if len(firsts) != 1 or None in firsts or len(batches) != 1 or None in batches:
            return None
        total = batches.pop()
        assert total is not None
        per_row = parameters * max(a.size for a in case.inputs.values()) / total
        rows = max(1, int(PIECE_WORK // max(per_row, 1)))
        return cls(case, rows) if rows < total else None

    def take(self, rows: int | None = None) -> tuple[int, Case] | None:
        """The next ``rows`` rows (a piece's, by default): their first row and a case of
        their own, or None when every row is taken."""
        with self.lock:
            start = self.next_row
            if start >= self.total:
                return None
            self.next_row = end = min(self.total, start + (rows or self.rows))
        return start, Case(self.case.profile, self.case.corner,
                           {n: a[start:end] for n, a in self.case.inputs.items()})

    def put(self, start: int, piece: Case) -> None:
        """The piece from row ``start``, its outputs computed."""
        with self.lock:
            self.done[start] = piece

    def join(self) -> bool:
        """The whole case's outputs, the pieces' concatenated in row order; False (nothing
        set) when a piece's output does not have the piece's rows first (a model whose
        outputs are not per row)."""
        pieces = [self.done[k] for k in sorted(self.done)]
        rows = [next(iter(p.inputs.values())).shape[0] for p in pieces]
        if sum(rows) != self.total or any(
                o.ndim == 0 or o.shape[0] != n for p, n in zip(pieces, rows, strict=True)
                for o in p.outputs.values()):
            return False
        self.case.outputs = {name: np.concatenate([p.outputs[name] for p in pieces])
                             for name in pieces[0].outputs}
        return True


def reference_beside(wrapper: torch.nn.Module, recipe: Recipe, cases: list[Case],
                     export: Callable[[], Exported],
                     pieces: RowPieces | None = None) -> Exported:
    """``export()`` (the ONNX exporter: Python, one core) on this thread while the PyTorch
    outputs of ``cases`` are computed on a thread of its own at one intra-op thread, on the
    other core (issue 47: the exporter left a core idle for seconds). With ``pieces`` (a
    larger case's rows) that thread then takes piece after piece until the exporter has
    ended; this thread computes the rest, a piece at a time at one intra-op thread while the
    other still runs its last one, then every row left as one forward at every thread, and
    joins them (``RowPieces.join``; the whole case again where they do not join). The
    exporter works on a copy of the module (``copy_sharing_weights``), never on
    ``wrapper``; the interpreter hands the forwards' thread the GIL between operators at
    0.5 ms instead of 5. A failure of either is raised once both have ended (the forwards'
    first: a model that fails at a profile corner is the user's to fix)."""
    import sys
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import torch

    every = torch.get_num_threads()  # this thread's, before the forwards' thread sets its own
    exported_event = threading.Event()

    def forwards() -> None:
        run_torch(wrapper, recipe, cases, None, 1)
        while pieces is not None and not exported_event.is_set():
            taken = pieces.take()
            if taken is None:
                return
            run_torch(wrapper, recipe, [taken[1]], None, 1)
            pieces.put(*taken)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, 0.0005))
    try:
        # leaving the pool waits for the forwards, also when the export raised
        with reused_heap(), ThreadPoolExecutor(1, thread_name_prefix="trtpack-reference") as pool:
            running = pool.submit(forwards)
            try:
                exported = export()
            except Exception:  # the model's own forward failing is the error to show
                exported_event.set()
                failed = running.exception()
                if isinstance(failed, UserInputError):
                    raise failed from None
                raise
            exported_event.set()
            while pieces is not None and not running.done():
                taken = pieces.take()
                if taken is None:
                    break
                run_torch(wrapper, recipe, [taken[1]], None, 1)
                pieces.put(*taken)
            running.result()
            if pieces is not None:
                rest = pieces.take(pieces.total)
                if rest is not None:
                    run_torch(wrapper, recipe, [rest[1]], None, every)
                    pieces.put(*rest)
                if not pieces.join():
                    run_torch(wrapper, recipe, [pieces.case], None, every)
    finally:
        sys.setswitchinterval(interval)
        torch.set_num_threads(every)
    return exported


def run(ctx: StageContext) -> StageOutcome:
    plan = ctx.plan
    recipe = plan.recipe
    ctx.progress("loading the model" + (" (random weights)" if plan.random_weights else ""))
    loaded = load_model(recipe, random_weights=plan.random_weights, seed=plan.seed)
    wrapper = output_selector(loaded.module, recipe)
    fresh = None
    if recipe.source.torchscript:
        path = recipe.source.torchscript
        fresh = lambda: output_selector(load_torchscript(path), recipe)  # noqa: E731
    cases, sample_warnings, samples_fed = build_cases(plan, loaded)
    model_bytes = sum(t.numel() * t.element_size() for t in
                      (*loaded.module.parameters(), *loaded.module.buffers()))
    exporter = "legacy" if recipe.source.torchscript else recipe.exporter
    onnx_path = ctx.stage_dir / "model.onnx"
    exporting = f"exporting to ONNX (opset {plan.opset}, {exporter} exporter)"
    beside = copy_sharing_weights(wrapper) if fresh is None and len(cases) > 1 else None
    if beside is None:
        ctx.progress("running PyTorch at every profile corner")
        run_torch(wrapper, recipe, cases, fresh)
        # the exporter traces in Python, on one core: later stages' processes may import on
        # the other
        ctx.spare_core(model_bytes)
        ctx.progress(exporting)
        exported = export_onnx(wrapper, plan, onnx_path, ctx.log,
                               saved=fresh() if fresh is not None else None)
    else:
        parameters = sum(p.numel() for p in loaded.module.parameters())
        besides = beside_cases(cases, parameters)
        left = [c for c in cases if all(c is not b for b in besides)]
        pieces = RowPieces.of(left[0], recipe, parameters) if len(left) == 1 else None
        ctx.spare_core(model_bytes)  # before the progress line, as above (the build's order)
        ctx.progress(f"{exporting}, PyTorch at {len(besides)} of {len(cases)} profile corners "
                     "beside" + (f", then at the rows of {left[0].corner}" if pieces else ""))
        exported = reference_beside(wrapper, recipe, besides,
                                    lambda: export_onnx(beside, plan, onnx_path, ctx.log),
                                    pieces)
        if left and pieces is None:
            ctx.progress(f"running PyTorch at the largest profile corner ({left[0].corner})")
            run_torch(wrapper, recipe, left)
    reference = ctx.stage_dir / "reference.npz"
    save_cases(reference, cases)
    ctx.log.info("PyTorch outputs of %d cases saved", len(cases))
    summary = graph_summary(onnx_path)
    ctx.log.info("ONNX model written: %d nodes", summary["nodes"])
    warnings_out: list[str] = list(sample_warnings)
    if exported.fallback:
        warnings_out.append(f"{exported.fallback}; exported with the TorchScript exporter "
                            "(dynamo=False) instead, verified against PyTorch the same way")
    if summary["opset"] != plan.opset:
        warnings_out.append(f"exporter wrote opset {summary['opset']}, asked for {plan.opset}")
    tok_dir = config_path = None
    if loaded.tokenizer is not None:
        tok_dir = ctx.stage_dir / "tokenizer"
        loaded.tokenizer.save_pretrained(str(tok_dir))
    if loaded.config is not None:
        config_path = ctx.stage_dir / "config.json"
        loaded.config.to_json_file(str(config_path))
    params = sum(p.numel() for p in loaded.module.parameters())
    return StageOutcome(
        artifacts=Artifacts(onnx=onnx_path, reference=reference, tokenizer=tok_dir,
                            model_config=config_path),
        metrics=ExportMetrics(
            parameters=params, weights=loaded.weights, nodes=summary["nodes"],
            source=recipe.source.describe(),
            opset=summary["opset"], exporter=exported.exporter,
            exporter_fallback=exported.fallback, external_data=exported.external_data,
            decomposition=exported.decomposition, cases=len(cases),
            op_types=summary["op_types"], sample_inputs=samples_fed),
        warnings=warnings_out,
        message=f"{recipe.source.describe()}: {summary['nodes']} nodes, opset "
                f"{summary['opset']}, {exported.exporter} "
                f"exporter{' (fallback)' if exported.fallback else ''}, "
                f"{params / 1e6:.1f}M parameters ({loaded.weights} weights)"
                + (f", {samples_fed}" if samples_fed else ""),
    )
