"""Model archives for SageMaker multi-model endpoints (Triton containers).

How SageMaker's Triton loads one archive (``docker/sagemaker/serve`` and
``src/sagemaker_server.cc`` in triton-inference-server/server): the archive is extracted to
``/opt/ml/models/<hash>/model/`` and registered as a model repository of its own; each
top-level folder is a model (``<model>/config.pbtxt``, ``<model>/1/...``). With one folder
that model is loaded; with several, the folder whose config says ``platform: "ensemble"`` is
loaded (with the members it names), so an archive holds at most one ensemble. The loaded model
answers under the archive's name (the ``TargetModel`` of InvokeEndpoint, e.g.
``minilm_ensemble.tar.gz``).

So: one ``<model>.tar.gz`` per model a client calls (the model, its CPU fallback, each
ensemble with its members packed beside it). Python-backend helpers (tokenizer,
post-processing) travel only inside their ensemble's archive. Archives are reproducible: sorted
entries, no owners, fixed times.
"""

from __future__ import annotations

import gzip
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from trtpack.errors import UserInputError
from trtpack.out_files import record_files
from trtpack.serving.config import read_config
from trtpack.serving.layout import REPOSITORY, engine_triton_serving

NOTE = "SAGEMAKER.md"
DEFAULT_DEST = "sagemaker"


@dataclass(frozen=True)
class SageMakerArchive:
    path: Path
    entry: str  # the model SageMaker loads from this archive
    members: tuple[str, ...]  # every model folder in it (entry first)

    @property
    def target_model(self) -> str:
        return self.path.name


@dataclass(frozen=True)
class SageMakerPackage:
    dest: Path
    repository: Path
    archives: tuple[SageMakerArchive, ...]
    note: Path


def _is_repository(path: Path) -> bool:
    return path.is_dir() and any(path.glob("*/config.pbtxt"))


def find_model_repository(path: Path) -> Path:
    """The model repository of a build output folder (or the repository itself)."""
    if not path.exists():
        raise UserInputError(f"'{path}' does not exist")
    for candidate in (path / REPOSITORY, path):
        if _is_repository(candidate):
            return candidate
    raise UserInputError(
        f"'{path}' is neither a trtpack build output (with {REPOSITORY}/) nor a Triton model "
        "repository (folders with config.pbtxt)"
    )


def _configs(repository: Path) -> dict[str, Any]:
    return {p.parent.name: read_config(p) for p in sorted(repository.glob("*/config.pbtxt"))}


def _members(name: str, configs: dict[str, Any], seen: tuple[str, ...] = ()) -> list[str]:
    """An ensemble's member models, nested ensembles included, in first-use order."""
    if name in seen:
        raise UserInputError(f"ensemble '{name}' contains itself")
    found: list[str] = []
    for step in configs[name].ensemble_scheduling.step:
        member = step.model_name
        if member not in configs:
            raise UserInputError(f"ensemble '{name}' calls '{member}', which is not in the "
                                 "repository")
        for m in [member, *(_members(member, configs, (*seen, name))
                            if configs[member].platform == "ensemble" else [])]:
            if m not in found:
                found.append(m)
    return found


def archive_contents(repository: Path) -> list[tuple[str, list[str]]]:
    """(entry model, model folders in its archive) for each archive to write."""
    configs = _configs(repository)
    ensembles = [n for n, c in configs.items() if c.platform == "ensemble"]
    in_ensemble = {m for e in ensembles for m in _members(e, configs)}
    archives: list[tuple[str, list[str]]] = []
    for name, config in configs.items():
        if config.platform == "ensemble":
            archives.append((name, [name, *_members(name, configs)]))
        elif not (config.backend == "python" and name in in_ensemble):
            archives.append((name, [name]))
    return archives


def _add_tree(tar: tarfile.TarFile, folder: Path, arcname: str) -> None:
    """Regular files and folders only (hard links in the repository become copies)."""
    paths = [folder, *sorted(folder.rglob("*"))]
    for path in paths:
        name = arcname if path == folder else f"{arcname}/{path.relative_to(folder).as_posix()}"
        info = tarfile.TarInfo(name)
        info.mtime = 0
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        if path.is_dir():
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
        elif path.is_file():
            info.size = path.stat().st_size
            info.mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
            with path.open("rb") as f:
                tar.addfile(info, f)


def write_archive(repository: Path, models: list[str], path: Path,
                  compresslevel: int = 1) -> None:
    """A tar.gz of model folders. Weights barely compress (level 1 saves ~10% on MiniLM at
    ~25 MB/s on 2 cores; level 0 writes a stored gzip stream at disk speed)."""
    tmp = path.with_name(path.name + ".partial")
    with tmp.open("wb") as raw, \
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0,
                          compresslevel=compresslevel) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        for model in models:
            _add_tree(tar, repository / model, model)
    tmp.replace(path)


def archive_members(path: Path) -> list[str]:
    """Every entry of an archive (folders end with '/'), in archive order."""
    with tarfile.open(path, "r:gz") as tar:
        return [m.name + ("/" if m.isdir() else "") for m in tar.getmembers()]


def _largest_python_tensor_bytes(repository: Path, configs: dict[str, Any]) -> int:
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


def _shared_models(archives: tuple[SageMakerArchive, ...]) -> dict[str, list[str]]:
    """Model folders packed in more than one archive -> those archives' names."""
    where: dict[str, list[str]] = {}
    for archive in archives:
        for member in archive.members:
            where.setdefault(member, []).append(archive.target_model)
    return {m: names for m, names in where.items() if len(names) > 1}


def _server_features(shared: bool, cache: bool, python: bool,
                     args: bool) -> list[ServerFeature]:
    """What these archives need of the Triton release, besides the engine's TensorRT."""
    return [f for f, needed in ((SAGEMAKER_ADDITIONAL_ARGS, args), (MODEL_NAMESPACING, shared),
                                (CACHE_CONFIG, cache), (ERROR_ONLY_RESPONSE, python))
            if needed]


def _release_line(serving: TritonServing | None, features: list[ServerFeature]) -> str:
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


def _container(serving: TritonServing | None, shared: dict[str, list[str]], cache: bool,
               python: bool, args: bool) -> str:
    """What the SageMaker Triton image and its flags must be for these archives."""
    lines = [_release_line(serving, _server_features(bool(shared), cache, python, args))]
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
        lines.append(f"- `--model-namespacing=true`: SageMaker registers each archive as a "
                     f"repository of its own, and `{model}` is in {' and '.join(names)} (as are "
                     f"{len(shared) - 1} other model(s)); Triton refuses two models of one name "
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


def _note(package: SageMakerPackage, configs: dict[str, Any]) -> str:
    rows = "\n".join(
        f"| `{a.target_model}` | `{a.entry}` | {', '.join(f'`{m}`' for m in a.members)} |"
        for a in package.archives
    )
    python = [n for n, c in configs.items() if c.backend == "python"]
    cache = any(c.response_cache.enable for c in configs.values())
    serving = next((s for s in (engine_triton_serving(package.repository / name)
                                for name in configs) if s is not None), None)
    shared = _shared_models(package.archives)
    args = [*(["--model-namespacing=true"] if shared else []),
            *(["--cache-config=local,size=268435456"] if cache else []),
            *(serving.backend_config if serving else ())]
    shm = _largest_python_tensor_bytes(package.repository, configs)
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
            "`numpy` and `tokenizers`. `tokenizers` is not part of Triton's Python backend: "
            "unless the image has it, pack an environment with conda-pack (the Python version "
            "of the image's backend stub), put it in the model folder and point the model at "
            "it with the `EXECUTION_ENV_PATH` parameter "
            "(`$$TRITON_MODEL_DIRECTORY/env.tar.gz`).\n"
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
        + _container(serving, shared, cache, bool(python), bool(args))
        + deps
    )


def package_sagemaker(path: Path, dest: Path | None = None, *,
                      compresslevel: int = 1) -> SageMakerPackage:
    """Write ``<model>.tar.gz`` archives and ``SAGEMAKER.md`` for a build output folder or a
    model repository. ``dest`` defaults to ``<path>/sagemaker``; it must not be inside the
    repository (Triton would take it for a model folder)."""
    repository = find_model_repository(path)
    dest = dest or path / DEFAULT_DEST
    if dest.resolve().is_relative_to(repository.resolve()):
        raise UserInputError(f"--dest {dest} is inside the model repository {repository}")
    configs = _configs(repository)
    dest.mkdir(parents=True, exist_ok=True)
    archives = []
    for entry, models in archive_contents(repository):
        archive = dest / f"{entry}.tar.gz"
        write_archive(repository, models, archive, compresslevel)
        archives.append(SageMakerArchive(archive, entry, tuple(models)))
    note = dest / NOTE
    package = SageMakerPackage(dest, repository, tuple(archives), note)
    note.write_text(_note(package, configs), encoding="utf-8")
    # in a build folder: a rebuild replaces these with the rest of trtpack's files
    record_files(path, [a.path for a in archives] + [note])
    return package


def package(path: Path, dest: Path | None = None) -> SageMakerPackage:
    """``trtpack package --format sagemaker`` (``trtpack.serving.package_formats``)."""
    return package_sagemaker(path, dest)
