"""Run a generated Python-backend ``model.py`` in this process.

Triton's ``triton_python_backend_utils`` exists only inside a tritonserver's Python backend,
so a stand-in (labelled as such) provides the two names the post-processing model uses:
``Tensor`` and ``get_input_tensor_by_name``. The serving tests under ``tests/serving`` run
the same files in a real tritonserver."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from trtpack.serving.config import read_config


class StandInTensor:
    """Stand-in for ``pb_utils.Tensor`` (no Triton here)."""

    def __init__(self, name: str, value: np.ndarray) -> None:
        self.name, self.value = name, value

    def as_numpy(self) -> np.ndarray:
        return self.value


@contextmanager
def python_model(model_dir: Path) -> Iterator[Any]:
    """``model_dir/1/model.py``'s ``TritonPythonModel``, initialized from
    ``model_dir/config.pbtxt``, with the stand-in installed while the block runs."""
    from google.protobuf.json_format import MessageToDict

    stand_in = types.ModuleType("triton_python_backend_utils")
    stand_in.Tensor = StandInTensor  # type: ignore[attr-defined]
    stand_in.get_input_tensor_by_name = (  # type: ignore[attr-defined]
        lambda request, name: StandInTensor(name, request[name]))
    stand_in.triton_string_to_numpy = (  # type: ignore[attr-defined]
        lambda name: np.dtype(name.removeprefix("TYPE_").lower()))
    sys.modules["triton_python_backend_utils"] = stand_in
    try:
        spec = importlib.util.spec_from_file_location("python_model", model_dir / "1" / "model.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        config = MessageToDict(read_config(model_dir / "config.pbtxt"),
                               preserving_proto_field_name=True)
        model = module.TritonPythonModel()
        model.initialize({"model_config": json.dumps(config),
                          "model_repository": str(model_dir), "model_version": "1"})
        yield model
    finally:
        del sys.modules["triton_python_backend_utils"]


def run_python_model(model_dir: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The post-processing ``model.py`` of ``model_dir`` run on one request (``feeds``); its
    output tensors by name."""
    with python_model(model_dir) as model:
        return {t.name: t.value for t in model.run(feeds)}
