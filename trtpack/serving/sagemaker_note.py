"""``SAGEMAKER.md``: how to serve a package's archives, and the container they need.

The endpoint's environment (shared memory for Python models, tritonserver flags) and the NGC
release: no older than the features the archives use, and one whose TensorRT loads the engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trtpack.engine.triton_release import (
    CACHE_CONFIG,
    ERROR_ONLY_RESPONSE,
    MODEL_NAMESPACING,
    SAGEMAKER_ADDITIONAL_ARGS,
    ServerFeature,
    TritonServing,
    minimum_release,
    release_key,
)
from trtpack.serving.layout import engine_triton_serving
from trtpack.serving.sagemaker_archives import SageMakerArchive, SageMakerPackage

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig


def largest_python_tensor_bytes(repository: Path, configs: dict[str, ModelConfig]) -> int:
    """Bytes of the largest tensor a Python model exchanges, with dynamic dims at 512."""
    from tritonclient.grpc import model_config_pb2 as pb

    sizes = {"TYPE_FP32": 4, "TYPE_INT64": 8, "TYPE_INT32": 4, "TYPE_FP16": 2}
    largest = 0
    for config in configs.values():
        if config.backend != "python":
            continue
        batch = max(1, int(config.max_batch_size))
        for t in [*config.input, *config.output]:
            elems = batch
            for d in t.dims:
                elems *= 512 if d < 0 else int(d)
            largest = max(largest, elems * sizes.get(pb.DataType.Name(t.data_type), 8))
    return largest


def shared_models(archives: tuple[SageMakerArchive, ...]) -> dict[str, list[str]]:
    """Model folders packed in more than one archive -> those archives' names."""
    where: dict[str, list[str]] = {}
    for archive in archives:
        for member in archive.members:
            where.setdefault(member, []).append(archive.target_model)
    return {m: names for m, names in where.items() if len(names) > 1}


def loaded_twice_section(shared: dict[str, list[str]]) -> str:
    """Why a client should invoke one archive of each shared model folder: SageMaker's
    front end registers every archive as a repository of its own and loads the target model
    from it (tritonserver ``src/sagemaker_server.cc``, ``SageMakerMMELoadModel``: lines
    1087-1125 at e1db8a6; ``TRITONSERVER_ServerRegisterModelRepository`` per archive), so
    a model folder packed in two archives that are both invoked is loaded twice: two copies
    of its weights (an engine: in GPU memory) under the two namespaces."""
    if not shared:
        return ""
    rows = "\n".join(f"- `{model}` is in the archives {' and '.join(f'`{n}`' for n in names)}"
                     for model, names in shared.items())
    return (
        "\n## Invoke one archive per model\n\n"
        "SageMaker registers each archive as a repository of its own and loads the invoked "
        "model from it, members included:\n\n"
        f"{rows}\n\n"
        "so invoking both archives of one model folder loads that model twice: two copies of "
        "its weights (an engine's in GPU memory) and two sets of instances. Serve text through "
        "the ensemble's archive alone, or tensors through the model's archive alone; a "
        "client that needs both pays for both copies (`SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT` "
        "below lets SageMaker unload the idle one).\n"
    )


def server_features(shared: bool, cache: bool, python: bool,
                     args: bool) -> list[ServerFeature]:
    """What these archives need of the Triton release, besides the engine's TensorRT."""
    return [f for f, needed in ((SAGEMAKER_ADDITIONAL_ARGS, args), (MODEL_NAMESPACING, shared),
                                (CACHE_CONFIG, cache), (ERROR_ONLY_RESPONSE, python))
            if needed]


def release_line(serving: TritonServing | None, features: list[ServerFeature]) -> str:
    """The NGC release to use: no older than any feature needs, and (with an engine) one
    whose TensorRT loads the engine."""
    floor = minimum_release(features)
    needs = "".join(f"\n  - {f.what}: {f.release} ({f.source})" for f in features)
    sagemaker = "on SageMaker, the Triton image of that NGC release"
    if serving is None:
        return (f"- Minimum release: **{floor.release}** (`nvcr.io/nvidia/tritonserver:"
                f"{floor.release}-py3` or later; {sagemaker} or later), for:{needs}"
                if floor else "")
    ok = [r for r in serving.releases
          if floor is None or release_key(r.release) >= release_key(floor.release)]
    if ok:
        later = " or a later one that loads it" if serving.version_compatible else ""
        return (f"- Release: **{ok[0].release}** (`{ok[0].image}`{later}; {sagemaker}): its "
                f"TensorRT {ok[0].tensorrt} loads the engine"
                + (f", and it is no older than {floor.release}, for:{needs}" if floor else "."))
    if serving.releases and floor is not None:  # every table release that loads it is older
        return (f"- Release: none in trtpack's table both loads the engine "
                f"({serving.release_text()}) and is no older than {floor.release}, for:{needs}")
    return ("- Release: the one whose TensorRT loads the engine (see *TensorRT* below)"
            + (f", no older than **{floor.release}**, for:{needs}" if floor else "."))


def container_section(serving: TritonServing | None, shared: dict[str, list[str]], cache: bool,
               python: bool, args: bool) -> str:
    """What the SageMaker Triton image and its flags must be for these archives."""
    lines = [release_line(serving, server_features(bool(shared), cache, python, args))]
    if serving is not None:
        lines.append(f"- TensorRT: the engine needs {serving.tensorrt_needed} (the builder's, "
                     f"from `model.plan.json`), on a GPU of the build's family: the SageMaker "
                     f"Triton image of the NGC release that ships it: "
                     f"{serving.release_text()}.")
    if serving is not None and serving.backend_config:
        lines.append(f"- `{' '.join(serving.backend_config)}`: the engine is version-compatible; "
                     "Triton's TensorRT backend refuses such engines without it.")
    if shared:
        model, names = next(iter(shared.items()))
        others = [f"`{m}`" for m in list(shared)[1:]]
        more = "" if not others else (f" (so is {others[0]})" if len(others) == 1 else
                                      f" (so are {', '.join(others[:-1])} and {others[-1]})")
        lines.append(f"- `--model-namespacing=true`: SageMaker registers each archive as a "
                     f"repository of its own, and `{model}` is in {' and '.join(names)}{more}; "
                     "Triton refuses two models of one name "
                     "across repositories unless namespacing is on (the SageMaker entrypoint "
                     "turns it on by default since server PR #5540; the flag is repeated here "
                     "in case `SAGEMAKER_TRITON_DISABLE_MODEL_NAMESPACING` is set).")
    if cache:
        lines.append("- `--cache-config=local,size=268435456`: the configs enable the response "
                     "cache, which needs a cache at server start.")
    if python:
        lines.append("- A python_backend that accepts `pb_utils.InferenceResponse(error=...)` "
                     "with no output tensors: the tokenizer and post-processing models answer "
                     "a bad request that way.")
    lines = [line for line in lines if line]
    if not lines:
        return ""
    return ("\n## Container\n\nThe flags go in `SAGEMAKER_TRITON_ADDITIONAL_ARGS` (above).\n\n"
            + "\n".join(lines) + "\n")


def sagemaker_note(package: SageMakerPackage, configs: dict[str, ModelConfig]) -> str:
    """The text of ``SAGEMAKER.md`` for ``package``."""
    rows = "\n".join(
        f"| `{a.target_model}` | `{a.entry}` | {', '.join(f'`{m}`' for m in a.members)} |"
        for a in package.archives
    )
    python = [n for n, c in configs.items() if c.backend == "python"]
    cache = any(c.response_cache.enable for c in configs.values())
    serving = next((s for s in (engine_triton_serving(package.repository / name)
                                for name in configs) if s is not None), None)
    shared = shared_models(package.archives)
    args = [*(["--model-namespacing=true"] if shared else []),
            *(["--cache-config=local,size=268435456"] if cache else []),
            *(serving.backend_config if serving else ())]
    shm = largest_python_tensor_bytes(package.repository, configs)
    shm_default = max(16 * 2**20, 1 << (max(shm, 1) * 2 - 1).bit_length())
    env = [
        "| `SAGEMAKER_MULTI_MODEL` | `true` | what `Mode: MultiModel` gives the container; its "
        "serve script then registers each archive as its own repository |",
        f"| `SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE` | `{shm_default}` | Python backend shared "
        f"memory; the largest tensor a Python model here exchanges is about {shm} bytes "
        "(dynamic dims taken as 512) |" if python else "",
        "| `SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE` | `1048576` | growth step of that memory |"
        if python else "",
        f"| `SAGEMAKER_TRITON_ADDITIONAL_ARGS` | `{' '.join(args)}` | tritonserver flags: "
        "see *Container* below |" if args else "",
        "| `SAGEMAKER_TRITON_MODEL_LOAD_GPU_LIMIT` | e.g. `0.8` | optional: refuse loads past "
        "that share of GPU memory so SageMaker unloads idle models |",
        "| `SAGEMAKER_TRITON_LOG_VERBOSE` | `false` | the container logs verbosely by default |",
    ]
    deps = ""
    if python:
        deps = (
            "\n## Python-backend models\n\n"
            f"{', '.join(f'`{n}`' for n in python)} run in the container's Python and need "
            "`numpy` (Triton's Python backend has it) and `tokenizers`, which the build "
            "copied into the tokenizer model's `1/vendor/` folder (PyPI's abi3 Linux build "
            "serves the images' Python 3.10 and 3.12): nothing to install. Only when the "
            "build warned that it could not carry `tokenizers` (a non-abi3 or non-Linux "
            "install) does the image's Python need it.\n"
        )
    return (
        "# SageMaker multi-model endpoint archives\n\n"
        f"From the Triton model repository `{package.repository}`. Upload every archive under "
        "one S3 prefix, create the model with the SageMaker Triton image, "
        "`Mode: MultiModel` and that prefix as `ModelDataUrl`, and call a model with "
        "`InvokeEndpoint(TargetModel=<archive name>)`.\n\n"
        "| TargetModel | model loaded | model folders in the archive |\n| --- | --- | --- |\n"
        f"{rows}\n\n"
        "An archive holds one model folder per model (`<model>/config.pbtxt`, "
        "`<model>/1/...`); an ensemble's archive holds the ensemble and every member, and "
        "SageMaker loads the folder whose config says `platform: \"ensemble\"`.\n\n"
        "## Container environment\n\n| variable | value | why |\n| --- | --- | --- |\n"
        + "\n".join(e for e in env if e) + "\n"
        "\nFor a single-model endpoint instead (one archive as `model.tar.gz`), set "
        "`SAGEMAKER_TRITON_DEFAULT_MODEL_NAME` to the model to load (the ensemble for text).\n"
        + loaded_twice_section(shared)
        + container_section(serving, shared, cache, bool(python), bool(args))
        + deps
    )
