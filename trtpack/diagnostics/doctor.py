"""What this machine has, for ``trtpack doctor``: packages, GPU, TensorRT."""

from __future__ import annotations

from typing import TypedDict


class Component(TypedDict):
    """A package (or the GPU) ``trtpack doctor`` looks for: its version, None when missing."""

    name: str
    version: str | None
    purpose: str


class EnvironmentReport(TypedDict):
    components: list[Component]
    summary: list[str]  # what the components allow, one line each


def environment_report() -> EnvironmentReport:
    from trtpack.errors import MissingEnvironmentError, require_modules
    from trtpack.machine.gpus import cuda_visible_gpus
    from trtpack.machine.local_targets import local_target
    from trtpack.machine.packages import PACKAGES, TENSORRT_INSTALL, required_modules

    # TensorRT is installed as 'tensorrt' (NGC) or 'tensorrt-cu12/-cu13' (pip): any of them
    components: list[Component] = [{"name": p.name, "version": p.version(), "purpose": p.purpose}
                  for p in PACKAGES if p.shown]
    seen = cuda_visible_gpus()
    gpu = seen.first
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
        require_modules(required_modules("modelopt"), purpose="precision conversion (fp16/int8)",
                        install="'trtpack[modelopt]'")
        summary.append("precision conversion (fp16/int8): available")
    except MissingEnvironmentError as e:
        summary.append(f"{e} — {e.hint} (nvidia-modelopt without its [onnx] extra, which "
                       "would replace onnxruntime)")
    if seen.problem is not None:
        summary.append(f"GPU: {seen.problem}")
    target = local_target()
    if target:
        summary.append(f"TensorRT engines: available for --target {target.name}")
    else:
        summary.append("TensorRT engines: not available here (needs an NVIDIA GPU and "
                       "TensorRT); use --target cpu or --no-engine")
    if not found["tensorrt"]:
        summary.append(f"TensorRT: {TENSORRT_INSTALL}")
    else:
        from trtpack.engine.triton_release import VERSION_COMPATIBLE_BACKEND_CONFIG, triton_serving

        summary.append(f"Triton: engines built here (TensorRT {found['tensorrt']}) are "
                       f"{triton_serving(str(found['tensorrt']), False).summary()}; "
                       f"version-compatible ones (engine.version_compatible) also need "
                       f"{VERSION_COMPATIBLE_BACKEND_CONFIG}")
    return {"components": components, "summary": summary}
