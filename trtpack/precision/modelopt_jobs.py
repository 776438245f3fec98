"""A ModelOpt conversion as typed data, and the process that runs it.

Every ModelOpt call runs in ``trtpack.precision.modelopt_worker``, in its own process: ModelOpt
monkeypatches ``onnxruntime.quantization``, drops temporary files
(``sym_shape_infer_temp.onnx``, ``<uuid>.data``, ``augmented_model.onnx``) in the current
directory and logs an NVML error on machines without a GPU. ``ModelOptWorker`` starts that
process in a throw-away working directory *ahead of its job* (it imports ModelOpt, seconds,
while the caller prepares the job) and hands it a ``ModelOptJob`` as JSON. Where a stage server
is named (``TRTPACK_STAGE_SERVER``), the process is forked from the server's ``modelopt``
template, which imported ModelOpt once (``pipeline.served_workers``), instead: one fork per
job, in the same working directory and environment, so each job still runs in a process of
its own that nothing ran in before.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypedDict

from trtpack.processes import (
    ChildProcess,
    checkout_environment,
    kill_group,
    python_module_command,
    served_process,
)

WORKER_MODULE = "trtpack.precision.modelopt_worker"
WORKER_TEMPLATE = "modelopt"
"""The stage server's template of the ModelOpt worker (``pipeline.served_workers``)."""
MODELOPT_MODES = ("fp16", "int8")
"""The precisions ModelOpt converts to (a job's ``mode``, the precision stage's choices); the
modes whose workers that template forks (ModelOpt's import takes seconds). A ``float16``
worker (onnxconverter-common, a fraction of a second to import) starts fresh."""


class WorkerResult(TypedDict, total=False):
    """What a ModelOpt job writes to its result file (the keys of its mode)."""

    seconds: float
    # int8
    dedicated_qdq_rewired: list[str]
    prepared: list[str]
    calibration_method: str
    # fp16, AutoCast
    out_of_range_nodes: list[str]
    weights_outside_autocast: int
    # fp16, onnxconverter-common
    converter: str
    blocked_by_failure: dict[str, str]
    kept_fp32: dict[str, str]


@dataclass(frozen=True)
class Int8Job:
    """ModelOpt ONNX PTQ (Q/DQ). ``calibration``: feeds .npz (``save_feeds``);
    ``op_types_to_quantize`` empty: ModelOpt's default placement; ``dedicated_qdq``: with
    op types given, nodes that are not quantized read the original tensor, not a shared
    dequantized copy. Node names are exact names (escaped for ModelOpt, which matches them
    as regexes at the start of a name)."""

    calibration: str
    calibration_method: str = "max"
    high_precision: str = "fp32"
    nodes_to_exclude: list[str] = field(default_factory=list)
    op_types_to_exclude: list[str] = field(default_factory=list)
    op_types_to_quantize: list[str] = field(default_factory=list)
    dedicated_qdq: bool = True


@dataclass(frozen=True)
class Fp16Job:
    """ModelOpt AutoCast. ``reference_inputs``: one .npz feed for the I/O range rule;
    ``range_nodes_file``: where the nodes that rule keeps in FP32 are kept between
    conversions."""

    keep_io_types: bool = True
    nodes_to_exclude: list[str] = field(default_factory=list)
    op_types_to_exclude: list[str] = field(default_factory=list)
    reference_inputs: str | None = None
    range_nodes_file: str | None = None
    # "autocast" (ModelOpt), or "float16": onnxconverter-common's convert_float_to_float16,
    # the fallback when AutoCast cannot convert a graph
    # (trtpack.precision.fp16.onnxconverter_fallback)
    converter: str = "autocast"


@dataclass(frozen=True)
class ModelOptJob:
    """One conversion: ``mode`` "int8" or "fp16" with its settings; ``input`` the FP32 ONNX
    (its data file beside it), ``output`` where the converted model goes (external data as
    ``<name>.data``), ``result`` where the worker writes its JSON result."""

    mode: str
    input: str = ""
    output: str = ""
    result: str = ""
    int8: Int8Job | None = None
    fp16: Fp16Job | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> ModelOptJob:
        data = json.loads(text)
        int8, fp16 = data.pop("int8", None), data.pop("fp16", None)
        return cls(**data, int8=Int8Job(**int8) if int8 else None,
                   fp16=Fp16Job(**fp16) if fp16 else None)


def worker_environment(environment: Mapping[str, str]) -> dict[str, str]:
    """The environment a worker runs in: ``environment`` with this checkout first on
    ``PYTHONPATH`` and Hugging Face offline unless it says otherwise."""
    env = checkout_environment(environment)
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


class ModelOptWorker:
    """A worker process started ahead of its job; its output goes to files in its working
    directory, removed by ``close``."""

    def __init__(self, mode: str, parent_dir: Path) -> None:
        self.mode = mode
        self.cwd = Path(tempfile.mkdtemp(prefix="modelopt-", dir=parent_dir))
        env = worker_environment(os.environ)
        argv = ("--preload", mode)
        self.started = time.perf_counter()
        self.submitted = self.started
        job_read, self._job_write = os.pipe()  # its stdin: the job's path
        try:
            with open(self.cwd / "stdout.txt", "wb") as out, \
                    open(self.cwd / "stderr.txt", "wb") as err:
                served = served_process(
                    WORKER_TEMPLATE, {"cwd": str(self.cwd), "environment": env,
                                      "argv": list(argv)},
                    [job_read, out.fileno(), err.fileno()]) if mode in MODELOPT_MODES else None
                self.process: ChildProcess = served or subprocess.Popen(
                    python_module_command(WORKER_MODULE, *argv),
                    cwd=self.cwd, env=env, stdin=job_read, stdout=out, stderr=err)
        finally:
            os.close(job_read)
        self.served = served is not None

    @property
    def head_start(self) -> float:
        """Seconds between its start and its job."""
        return self.submitted - self.started

    def submit(self, job: ModelOptJob) -> None:
        (self.cwd / "job.json").write_text(job.to_json())
        self.submitted = time.perf_counter()
        try:
            os.write(self._job_write, f"{self.cwd / 'job.json'}\n".encode())
        except BrokenPipeError:  # it ended already: wait() reports how
            pass
        finally:
            self._close_stdin()

    def _close_stdin(self) -> None:
        if self._job_write >= 0:
            os.close(self._job_write)
            self._job_write = -1

    def _kill(self) -> None:
        """Kill it (a served one with its process group: what it forked) and wait for it."""
        if isinstance(self.process, subprocess.Popen):
            self.process.kill()
        else:
            kill_group(self.process.pid)
        self.process.wait()

    def wait(self, timeout: float) -> tuple[int, str, str, float]:
        """(exit code, stdout, stderr, seconds since the job was submitted); kills it and
        raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        left = timeout - (time.perf_counter() - self.submitted)
        try:
            code = self.process.wait(timeout=max(left, 1.0))
        except subprocess.TimeoutExpired:
            self._kill()
            raise
        seconds = time.perf_counter() - self.submitted

        def read(name: str) -> str:
            return (self.cwd / name).read_text(errors="replace")

        return code, read("stdout.txt"), read("stderr.txt"), seconds

    def result(self) -> WorkerResult:
        return json.loads((self.cwd / "result.json").read_text())  # type: ignore[no-any-return]

    def close(self) -> None:
        if self.process.poll() is None:
            self._kill()
        self._close_stdin()
        shutil.rmtree(self.cwd, ignore_errors=True)
