"""Verification cases: the inputs at each profile corner and the reference outputs for them.

The export stage writes them once (``reference.npz``: inputs and the PyTorch outputs), so
later stages compare against them without loading the model again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class Case:
    profile: int
    corner: str
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"p{self.profile}.{self.corner}"

    @property
    def shapes(self) -> str:
        return ",".join(f"{k}={'x'.join(map(str, v.shape))}" for k, v in self.inputs.items())


def save_cases(path: Path, cases: Iterable[Case]) -> None:
    arrays: dict[str, np.ndarray] = {}
    for case in cases:
        for name, value in case.inputs.items():
            arrays[f"{case.label}.input.{name}"] = value
        for name, value in case.outputs.items():
            arrays[f"{case.label}.output.{name}"] = value
    with open(path, "wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]


def load_cases(path: Path) -> list[Case]:
    cases: dict[str, Case] = {}
    with np.load(path) as data:
        for key in data.files:
            profile_part, corner, kind, name = key.split(".", 3)
            label = f"{profile_part}.{corner}"
            case = cases.setdefault(label, Case(int(profile_part[1:]), corner, {}, {}))
            (case.inputs if kind == "input" else case.outputs)[name] = data[key]
    return list(cases.values())


def with_outputs(cases: Iterable[Case], outputs: Iterable[Mapping[str, np.ndarray]]) -> list[Case]:
    return [Case(c.profile, c.corner, c.inputs, dict(o))
            for c, o in zip(cases, outputs, strict=True)]
