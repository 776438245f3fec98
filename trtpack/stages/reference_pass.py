"""The export stage's PyTorch reference pass: the model's outputs at every profile corner
(``run_torch``), computed beside the ONNX exporter where they can be (``reference_beside``,
issue 47: the exporter is Python on one core), a larger corner's batch in pieces of rows
(``RowPieces``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from trtpack.cases import Case
from trtpack.errors import UserInputError, first_line
from trtpack.resources import reused_heap, trim_heap
from trtpack.sources.recipe import Recipe
from trtpack.stages.torch_export import Exported

if TYPE_CHECKING:
    import torch

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
        self.beside = 0  # rows whose forward ended before the exporter did
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

    def one_piece(rows_left: RowPieces) -> Case | None:
        """The next piece of ``rows_left`` computed at one intra-op thread and put back
        (None: every row is taken)."""
        taken = rows_left.take()
        if taken is not None:
            run_torch(wrapper, recipe, [taken[1]], None, 1)
            rows_left.put(*taken)
        return None if taken is None else taken[1]

    def forwards() -> None:
        run_torch(wrapper, recipe, cases, None, 1)
        while pieces is not None and not exported_event.is_set():
            piece = one_piece(pieces)
            if piece is None:
                return
            if not exported_event.is_set():
                pieces.beside += len(next(iter(piece.inputs.values())))

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
            while pieces is not None and not running.done() and one_piece(pieces) is not None:
                pass
            running.result()
            if pieces is not None:
                # what the exporter and the forwards' thread freed (its own heap, with the
                # small corners' activations) goes back before the largest forward's peak
                trim_heap()
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
