"""The Optimum side of the CPU anchor (``cpu_anchor.py``): run inside the Optimum venv
(``.venv-optimum``: optimum-onnx pins transformers<4.58, so it cannot share
trtpack's environment), never in trtpack's.

    .venv-optimum/bin/python benchmarks/optimum_side.py MODEL_DIR WORK

Hugging Face Optimum itself, as its users call it: ``ORTModelForFeatureExtraction.
from_pretrained(MODEL_DIR, export=True)`` (Optimum's exporter), ``ORTOptimizer`` with
``AutoOptimizationConfig.O2()`` and ``.O3()``, ``ORTQuantizer`` with
``AutoQuantizationConfig.avx512_vnni(is_static=False)`` (dynamic INT8 of the exported
model). Writes WORK/{export,O2,O3,int8}/*.onnx and WORK/optimum.json (the files, the
versions, the configurations, the fused-operator counts). Nothing is timed here: the anchor
times every model in one process of trtpack's venv, on the same ONNX Runtime.
"""

from __future__ import annotations

import collections
import importlib.metadata
import json
import sys
import time
from pathlib import Path

PACKAGES = ("optimum", "optimum-onnx", "transformers", "torch", "onnxruntime", "onnx")


def op_counts(path: Path) -> dict[str, int]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return dict(sorted(collections.Counter(n.op_type for n in model.graph.node).items()))


def main() -> int:
    source, work = sys.argv[1], Path(sys.argv[2])
    from optimum.onnxruntime import ORTModelForFeatureExtraction, ORTOptimizer, ORTQuantizer
    from optimum.onnxruntime.configuration import (
        AutoOptimizationConfig,
        AutoQuantizationConfig,
    )

    seconds: dict[str, float] = {}
    started = time.perf_counter()
    model = ORTModelForFeatureExtraction.from_pretrained(source, export=True)
    model.save_pretrained(work / "export")
    seconds["export"] = time.perf_counter() - started
    configs: dict[str, str] = {}
    for level in ("O2", "O3"):
        started = time.perf_counter()
        config = getattr(AutoOptimizationConfig, level)()
        ORTOptimizer.from_pretrained(work / "export").optimize(
            save_dir=work / level, optimization_config=config)
        configs[level] = repr(config)
        seconds[level] = time.perf_counter() - started
    started = time.perf_counter()
    quantization = AutoQuantizationConfig.avx512_vnni(is_static=False)
    ORTQuantizer.from_pretrained(work / "export").quantize(
        save_dir=work / "int8", quantization_config=quantization)
    configs["dynamic int8"] = repr(quantization)
    seconds["dynamic int8"] = time.perf_counter() - started
    files = {"optimum export fp32": next((work / "export").glob("*.onnx")),
             "optimum O2": next((work / "O2").glob("*.onnx")),
             "optimum O3": next((work / "O3").glob("*.onnx")),
             "optimum dynamic int8": next((work / "int8").glob("*.onnx"))}
    (work / "optimum.json").write_text(json.dumps({
        "versions": {p: importlib.metadata.version(p) for p in PACKAGES},
        "files": {name: str(path) for name, path in files.items()},
        "configs": configs, "seconds": {k: round(v, 2) for k, v in seconds.items()},
        "operators": {name: op_counts(path) for name, path in files.items()},
    }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
