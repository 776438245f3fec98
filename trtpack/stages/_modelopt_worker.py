"""Runs one NVIDIA ModelOpt conversion in its own process: ``python -m
trtpack.stages._modelopt_worker JOB.json``.

ModelOpt is isolated because it monkeypatches ``onnxruntime.quantization``, drops temporary
files (``sym_shape_infer_temp.onnx``, ``<uuid>.data``, ``augmented_model.onnx``) in the
current directory and logs an NVML error on machines without a GPU. The precision stage
starts this module with a throw-away working directory and captures its output into the
stage log. The job (JSON) says:

    mode          "int8" (ModelOpt ONNX PTQ, Q/DQ) or "fp16" (ModelOpt AutoCast)
    input         FP32 ONNX path (its external data file, if any, beside it)
    output        where to write the converted model (external data as ``<name>.data``
                  when the model is over the protobuf limit)
    result        where to write a JSON result (seconds, external_data)
    int8          calibration (feeds .npz, see trtpack.calibration.save_feeds),
                  calibration_method, high_precision, nodes_to_exclude (exact names),
                  op_types_to_exclude, op_types_to_quantize (empty: ModelOpt's default),
                  dedicated_qdq (default true: with op_types_to_quantize, nodes that are
                  not quantized read the original tensor, not a shared dequantized copy)
    fp16          keep_io_types, nodes_to_exclude (exact names), op_types_to_exclude,
                  reference_inputs (a folder of .npz feeds for AutoCast's reference run)

Node names are passed as exact names and escaped here: ModelOpt treats them as regexes
matched at the start of a name, so "MatMul" would also exclude "MatMul_1".
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

# Over this size a model's weights go to an external data file (protobuf's limit is 2 GiB).
EXTERNAL_DATA_THRESHOLD = 1_800_000_000


def _exact(names: list[str]) -> list[str]:
    return [f"^{re.escape(n)}$" for n in names]


def model_bytes(path: Path) -> int:
    data = path.with_name(path.name + ".data")
    return path.stat().st_size + (data.stat().st_size if data.is_file() else 0)


def save_model(model: Any, path: Path, external: bool) -> None:
    """Save an ONNX model; with ``external`` its tensors go to ``<name>.data`` beside it."""
    import onnx

    data = path.with_name(path.name + ".data")
    if data.exists():
        data.unlink()
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=data.name, size_threshold=1024)
    else:
        onnx.save_model(model, str(path))


def _needs_external(model: Any) -> bool:
    total = 0
    for t in model.graph.initializer:
        total += len(t.raw_data) if t.raw_data else 0
        if total > EXTERNAL_DATA_THRESHOLD:
            return True
    return False


def _calibration_reader(feeds_path: str) -> Any:
    from onnxruntime.quantization.calibrate import CalibrationDataReader

    from trtpack.calibration import load_feeds

    feeds = load_feeds(Path(feeds_path))

    class FeedReader(CalibrationDataReader):  # type: ignore[misc]
        """Batches of different shapes (bucketed to the profiles), in order."""

        def __init__(self) -> None:
            self.feeds = feeds
            self._it = iter(self.feeds)

        def get_next(self) -> dict[str, Any] | None:
            return next(self._it, None)

        def get_first(self) -> dict[str, Any]:
            return self.feeds[0]

        def rewind(self) -> None:
            self._it = iter(self.feeds)

        def __len__(self) -> int:
            return len(self.feeds)

    return FeedReader()


def run_int8(job: dict[str, Any], work: Path) -> dict[str, Any]:
    import onnx
    from modelopt.onnx.quantization import quantize

    spec = job["int8"]
    source = Path(job["input"])
    external = model_bytes(source) > EXTERNAL_DATA_THRESHOLD
    tmp_out = work / "quantized.onnx"
    quantize(
        onnx_path=str(source),
        quantize_mode="int8",
        calibration_data_reader=_calibration_reader(spec["calibration"]),
        calibration_method=spec.get("calibration_method", "max"),
        calibration_eps=["cpu"],
        op_types_to_quantize=spec.get("op_types_to_quantize") or None,
        op_types_to_exclude=spec.get("op_types_to_exclude") or None,
        nodes_to_exclude=_exact(spec.get("nodes_to_exclude") or []) or None,
        high_precision_dtype=spec.get("high_precision", "fp32"),
        use_external_data_format=external,
        output_path=str(tmp_out),
        log_level="INFO",
    )
    if not tmp_out.is_file():
        raise RuntimeError("ModelOpt quantize finished without writing a model")
    model = onnx.load(str(tmp_out), load_external_data=True)
    rewired: list[str] = []
    if spec.get("op_types_to_quantize") and spec.get("dedicated_qdq", True):
        from trtpack.quantization_search import dedicate_qdq

        rewired = dedicate_qdq(model, spec["op_types_to_quantize"])
    save_model(model, Path(job["output"]), external or _needs_external(model))
    return {"external_data": external, "dedicated_qdq_rewired": rewired}


def run_fp16(job: dict[str, Any], work: Path) -> dict[str, Any]:
    from modelopt.onnx.autocast import convert_to_mixed_precision

    spec = job["fp16"]
    source = Path(job["input"])
    model = convert_to_mixed_precision(
        onnx_path=str(source),
        low_precision_type="fp16",
        keep_io_types=bool(spec.get("keep_io_types", True)),
        nodes_to_exclude=_exact(spec.get("nodes_to_exclude") or []) or None,
        op_types_to_exclude=spec.get("op_types_to_exclude") or None,
        calibration_data=spec.get("reference_inputs"),
        providers=["cpu"],
    )
    external = model_bytes(source) > EXTERNAL_DATA_THRESHOLD or _needs_external(model)
    save_model(model, Path(job["output"]), external)
    return {"external_data": external}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: python -m trtpack.stages._modelopt_worker JOB.json\n")
        return 2
    job = json.loads(Path(argv[0]).read_text())
    work = Path.cwd()
    started = time.perf_counter()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if job["mode"] == "int8":
        result = run_int8(job, work)
    elif job["mode"] == "fp16":
        result = run_fp16(job, work)
    else:
        sys.stderr.write(f"unknown mode {job['mode']!r}\n")
        return 2
    result["seconds"] = time.perf_counter() - started
    Path(job["result"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
