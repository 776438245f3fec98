"""``--calibration-method auto``: the INT8 model calibrated with ``max`` and the one with
``mse`` (trtpack's own Q/DQ: both from one calibration run, its ranges and its histograms),
each judged at the profile corners and on the search split; the one whose worst search sample
is higher is kept (a tie, or no search split: ``max``). The held-out and check splits are not
consulted; one ONNX Runtime session is open at a time, and the other model's folder is
deleted once chosen."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from trtpack.precision.metrics import MethodChoice

if TYPE_CHECKING:
    from trtpack.precision.conversion import Attempt
    from trtpack.runtimes.onnxruntime import CpuSession

AUTO_METHODS = ("max", "mse")  # what auto chooses between; the first is kept on a tie


def better_method(search_worst: dict[str, float | None]) -> str:
    """The method whose search-split worst (higher is better) is strictly the highest; else
    the first of ``AUTO_METHODS``."""
    best = AUTO_METHODS[0]
    for method in AUTO_METHODS[1:]:
        value, kept = search_worst[method], search_worst[best]
        if value is not None and (kept is None or value > kept):
            best = method
    return best


def choose_method(convert: Callable[[str], Attempt], reopen: Callable[[Path], CpuSession]
                  ) -> tuple[Attempt, MethodChoice]:
    """Each method's model made and judged by ``convert(method)``, the session of each closed
    before the next model is judged; the better one returned with its session open
    (``reopen``ed if it was closed), and the choice. Takes callbacks of the conversion and
    never calls back into it otherwise."""
    judged: dict[str, Attempt] = {}
    for method in AUTO_METHODS:
        for attempt in judged.values():
            attempt.session = None  # closes it
        judged[method] = convert(method)
    worsts = {m: a.search_worst for m, a in judged.items()}
    choice = MethodChoice(better_method(worsts), worsts)
    kept = judged.pop(choice.chosen)
    for lost in judged.values():
        lost.session = None
        shutil.rmtree(lost.path.parent, ignore_errors=True)
    if kept.session is None:
        kept.session = reopen(kept.path)
    return kept, choice
