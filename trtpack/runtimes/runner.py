"""One small interface for running a model, whatever runs it (as Polygraphy's runners share
``activate`` / ``infer`` / ``deactivate``): ONNX Runtime on the CPU
(``runtimes.onnxruntime.OnnxRuntimeRunner``) and a TensorRT engine in one optimization profile
(``runtimes.tensorrt.TensorRTRunner``). A runner is a context manager: ``with`` activates it
(makes the session, the execution context) and deactivates it (releases them).
Core module: numpy only."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # typing.Self is Python 3.11+
    from typing_extensions import Self


class ModelRunner(ABC):
    """A model in one runtime: its input and output names, and ``infer`` on one feed."""

    name: str = "runner"

    def __enter__(self) -> Self:
        self.activate()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.deactivate()

    @abstractmethod
    def activate(self) -> None:
        """Make what ``infer`` needs (a session, an execution context)."""

    @abstractmethod
    def deactivate(self) -> None:
        """Release what ``activate`` made; the runner may be activated again."""

    @property
    @abstractmethod
    def input_names(self) -> tuple[str, ...]:
        """The inputs the model takes, in its order (the runner must be active)."""

    @property
    @abstractmethod
    def output_names(self) -> tuple[str, ...]:
        """The outputs the model returns, in its order (the runner must be active)."""

    @abstractmethod
    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every output for one feed, on the host; feeds the model does not take are ignored."""

    def infer_all(self, feeds: Iterable[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """``infer`` on each feed in turn."""
        return [self.infer(feed) for feed in feeds]


class InactiveRunnerError(RuntimeError):
    """A runner used before ``activate`` (or after ``deactivate``): a bug in the caller."""

    def __init__(self, runner: ModelRunner) -> None:
        super().__init__(f"{runner.name} is not active: use it inside 'with' or call "
                         "activate() first")
