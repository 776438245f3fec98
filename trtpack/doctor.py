"""What this machine has, for ``trtpack doctor``: packages, GPU, TensorRT."""

from __future__ import annotations

from importlib import metadata
from typing import Any

COMPONENTS: tuple[tuple[str, str], ...] = (
    ("torch", "export (PyTorch → ONNX)"),
    ("transformers", "loading Hugging Face models"),
    ("onnx", "every ONNX stage"),
    ("onnxruntime", "verification on CPU, --target cpu serving"),
    ("onnxsim", "simplify"),
    ("polygraphy", "comparison, TensorRT engine build"),
    ("nvidia-modelopt", "--precision fp16 / int8"),
    ("tensorrt", "TensorRT engines (pip install 'trtpack[tensorrt-cu12]', or NGC)"),
    ("tritonclient", "Triton config schema"),
)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def environment_report() -> dict[str, Any]:
    from trtpack.api import MODELOPT_MODULES
    from trtpack.errors import MissingEnvironmentError, require_modules
    from trtpack.gpu import TENSORRT_INSTALL, detect_gpu, local_target, tensorrt_version

    # TensorRT is installed as 'tensorrt' (NGC) or 'tensorrt-cu12/-cu13' (pip): any of them
    components = [{"name": n, "version": tensorrt_version() if n == "tensorrt" else _version(n),
                   "purpose": p} for n, p in COMPONENTS]
    gpu = detect_gpu()
    components.append({
        "name": "NVIDIA GPU",
        "version": f"{gpu.name} (sm {gpu.compute_capability[0]}.{gpu.compute_capability[1]})"
        if gpu else None,
        "purpose": "TensorRT engines",
    })
    found = {c["name"]: c["version"] for c in components}
    summary = []
    if found["torch"] and found["onnx"] and found["onnxruntime"]:
        summary.append("CPU stages available: export, simplify, verify, Triton repository "
                       "(--target cpu)")
    else:
        summary.append("CPU stages need: pip install 'trtpack[onnx]'")
    try:
        require_modules(MODELOPT_MODULES, purpose="precision conversion (fp16/int8)",
                        install="'trtpack[modelopt]'")
        summary.append("precision conversion (fp16/int8): available")
    except MissingEnvironmentError as e:
        summary.append(f"{e} — {e.hint} (nvidia-modelopt without its [onnx] extra, which "
                       "would replace onnxruntime)")
    target = local_target()
    if target:
        summary.append(f"TensorRT engines: available for --target {target.name}")
    else:
        summary.append("TensorRT engines: not available here (needs an NVIDIA GPU and "
                       "TensorRT); use --target cpu or --no-engine")
    if not found["tensorrt"]:
        summary.append(f"TensorRT: {TENSORRT_INSTALL}")
    return {"components": components, "summary": summary}
