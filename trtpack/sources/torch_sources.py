"""PyTorch models given on the command line, told apart without importing torch:

    path/to/file.py:make_model    a factory in a file (its folder is importable beside it)
    my_pkg.models:make_model      a factory in an importable module
    model.pt2                     a saved torch.export ExportedProgram
    model.pt / model.jit          a TorchScript file (torch.jit.save)

A ``.pt2`` and a TorchScript file are both zip archives: ``<name>/models/model.json`` marks an
ExportedProgram, ``<name>/code/`` TorchScript; an archive with only ``data.pkl`` is a
``torch.save`` pickle, which trtpack refuses (loading it runs arbitrary code, and it holds
weights, not a model).

What a PyTorch source *is*, for the stage cache, is its files: the ``.pt2``/``.pt`` bytes, or
the factory's source file, the modules it imports from the user's own folders and the files it
reads (weights), as recorded when the model was last described (``SourceFiles``). Checking
them is a stat per file (content hashed only when a stat changed), so a rebuild with nothing
changed never imports torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict

from pydantic import ValidationError

if sys.version_info >= (3, 11):
    from typing import NotRequired
else:  # Python 3.10 (Ubuntu 22.04): a dependency there (pyproject.toml)
    from typing_extensions import NotRequired

from trtpack.errors import UserInputError
from trtpack.sources.recipe import Recipe, Source, safe_name

EXPORTED_PROGRAM_SUFFIXES = (".pt2",)
TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".jit", ".ts", ".torchscript")
_MODULE_REF = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_]\w*$")
SAVE_HINT = ("save the model itself: torch.export.save(torch.export.export(model, args), "
             "'model.pt2'), or torch.jit.save(torch.jit.script(model), 'model.pt'); or give "
             "the function that builds it: trtpack build path/to/file.py:make_model")


def torch_source(model: str) -> dict[str, str] | None:
    """The recipe ``source:`` of MODEL when it names a PyTorch model (``factory``,
    ``exported_program`` or ``torchscript``), else None. A file that looks like one but is
    not (a ``torch.save`` pickle, a damaged archive) is a ``UserInputError``."""
    ref, sep, func = model.rpartition(":")
    if sep and ref.endswith(".py"):
        path = Path(ref).expanduser()
        if not path.is_file():
            raise UserInputError(f"factory file '{ref}' does not exist")
        if not func.isidentifier():
            raise UserInputError(f"'{model}': '{func}' is not a function name",
                                 hint="write path/to/file.py:make_model")
        return {"factory": f"{path.resolve()}:{func}"}
    if _MODULE_REF.match(model) and not Path(model).exists():
        return {"factory": model}
    path = Path(model).expanduser()
    if not path.is_file():
        if path.suffix in (*EXPORTED_PROGRAM_SUFFIXES, *TORCHSCRIPT_SUFFIXES):
            raise UserInputError(f"PyTorch file '{model}' does not exist")
        return None
    kind = torch_file_kind(path)
    if kind is None:
        return None
    return {kind: str(path.resolve())}


def torch_file_kind(path: Path) -> str | None:
    """``exported_program`` or ``torchscript`` by the file's content; None for a file that is
    no PyTorch archive and not named like one. A pickle is a ``UserInputError``."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise UserInputError(f"cannot read '{path}': {e.strerror}") from None
    named = path.suffix in (*EXPORTED_PROGRAM_SUFFIXES, *TORCHSCRIPT_SUFFIXES)
    if head[:1] == b"\x80" and named:  # pickle protocol 2+: torch.save's legacy format
        raise UserInputError(f"'{path}' is a torch.save pickle (weights or a pickled "
                             "module), not a model trtpack can load safely", hint=SAVE_HINT)
    if head != b"PK\x03\x04":
        if named:
            raise UserInputError(f"'{path}' is named like a PyTorch model but is not a "
                                 "torch.export (.pt2) or TorchScript archive", hint=SAVE_HINT)
        return None
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as e:
        raise UserInputError(f"'{path}' is a damaged zip archive ({e})") from None
    parts = [n.split("/") for n in names]
    if any(len(p) >= 3 and p[1] == "models" and p[-1].endswith(".json") for p in parts):
        return "exported_program"
    if any(len(p) >= 3 and p[1] == "code" for p in parts):
        return "torchscript"
    if any(p[-1] == "data.pkl" for p in parts):
        raise UserInputError(f"'{path}' is a torch.save pickle (weights or a pickled "
                             "module), not a model trtpack can load safely", hint=SAVE_HINT)
    if named:
        raise UserInputError(f"'{path}' is a zip archive but neither a torch.export (.pt2) "
                             "nor a TorchScript model", hint=SAVE_HINT)
    return None


def file_digest(path: Path) -> str:
    """BLAKE3 of a file (trtpack's cache hashes everything with it)."""
    import blake3

    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    if path.stat().st_size:
        hasher.update_mmap(str(path))
    return hasher.hexdigest()


@dataclass(frozen=True)
class SourceFiles:
    """The files a PyTorch source was built from, each with its size, mtime and BLAKE3 when
    recorded: the source's identity for the stage cache."""

    files: dict[str, tuple[int, int, str]]

    @classmethod
    def of(cls, paths: list[str]) -> SourceFiles:
        files: dict[str, tuple[int, int, str]] = {}
        for name in sorted(set(paths)):
            path = Path(name)
            if path.is_file():
                st = path.stat()
                files[name] = (st.st_size, st.st_mtime_ns, file_digest(path))
        return cls(files)

    def current(self) -> SourceFiles | None:
        """These files as they are now when their contents are unchanged (stat first,
        BLAKE3 only for a file whose stat moved); None when any changed or went away."""
        now: dict[str, tuple[int, int, str]] = {}
        for name, (size, mtime, digest) in self.files.items():
            try:
                st = os.stat(name)
            except OSError:
                return None
            if st.st_size != size:
                return None
            if st.st_mtime_ns != mtime and file_digest(Path(name)) != digest:
                return None
            now[name] = (size, st.st_mtime_ns, digest)
        return SourceFiles(now)

    def key(self) -> str:
        """What the stage cache keys on: every file's path and content."""
        payload = json.dumps(sorted((n, d) for n, (_, _, d) in self.files.items()))
        return hashlib.sha256(payload.encode()).hexdigest()[:32]


class InputSpec(TypedDict):
    """A tensor input as the user describes it (``--input NAME=DTYPE[DIM,...]``)."""

    dtype: str
    axes: list[str | int]  # a name is a dynamic dim


class InputDescription(InputSpec):
    name: str
    kind: NotRequired[str]  # the sample generator's kind (``TensorSpec.kind``)


class OutputDescription(TypedDict):
    name: str
    axes: list[str | int]


class DescribeRequest(TypedDict, total=False):
    """What ``describe`` is asked (JSON, written by the build's process)."""

    source: dict[str, str]  # a recipe ``source:``: factory, torchscript or exported_program
    inputs: dict[str, InputSpec]
    arguments: dict[str, object]  # constants for forward's non-tensor arguments
    ranged: dict[str, str]  # inputs given a value range alone (``step=0..10``): name -> range
    sizes: dict[str, int]  # an example size per axis
    trtpack: str


class Description(TypedDict):
    """What a module or program is: its inputs, constants, outputs and dim ranges."""

    kind: Literal["module"]
    inputs: list[InputDescription]
    arguments: dict[str, object]
    outputs: list[OutputDescription]
    ranges: dict[str, list[int | None]]
    vocab_size: NotRequired[int | None]
    files: NotRequired[list[str]]
    source_files: NotRequired[str]  # the key of its files (``SourceFiles.key``)


class FolderDescription(TypedDict):
    """A factory that returned a model directory (a package that ships weights)."""

    kind: Literal["folder"]
    folder: str
    files: NotRequired[list[str]]  # until the memo keeps them apart
    source_files: NotRequired[str]


DescribedSource = Description | FolderDescription


def memo_path(cache_dir: Path, request: DescribeRequest) -> Path:
    """Where a description of ``request`` (the source and the input descriptions) is kept."""
    text = json.dumps({**request, "cwd": os.getcwd()}, sort_keys=True, default=str)
    return cache_dir / "sources" / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.json"


def read_memo(path: Path) -> tuple[DescribedSource, SourceFiles] | None:
    """A recorded description whose files are all unchanged, or None."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        files = SourceFiles({k: (int(v[0]), int(v[1]), str(v[2]))
                             for k, v in data["files"].items()})
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    now = files.current()
    if now is None:
        return None
    return data["description"], now


def write_memo(path: Path, description: DescribedSource, files: SourceFiles) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"description": description,
                               "files": {k: list(v) for k, v in files.files.items()}}),
                   encoding="utf-8")
    os.replace(tmp, path)


def default_profile(inputs: Sequence[InputDescription], ranges: dict[str, list[int | None]],
                    bounded: bool) -> str | None:
    """Sizes per dynamic axis in order: the batch 1:4:8 within its range; another axis (or a
    batch without a bound, when ``bounded``: an ExportedProgram's) has no default (None:
    the user gives --profile)."""
    from trtpack.shapes import BATCH_AXIS

    sizes: dict[str, tuple[int, int, int]] = {}
    for spec in inputs:
        for axis in spec["axes"]:
            if isinstance(axis, int) or axis in sizes:
                continue
            low, high = ranges.get(axis, [1, None])
            if axis != BATCH_AXIS or (high is None and bounded):
                return None
            low = low or 1
            top = min(8, high) if high is not None else 8
            sizes[axis] = (low, max(low, min(4, top)), max(low, top))
    if not sizes:
        return "x".join(str(a) for a in inputs[0]["axes"])
    return ":".join("x".join(str(v[i]) for v in sizes.values()) for i in range(3))


def unsized_axes(inputs: Sequence[InputDescription], ranges: dict[str, list[int | None]]
                 ) -> list[str]:
    """Dynamic axes with no default size: what --profile must give."""
    from trtpack.shapes import BATCH_AXIS

    names: list[str] = []
    for spec in inputs:
        for axis in spec["axes"]:
            if isinstance(axis, str) and axis not in names and (
                    axis != BATCH_AXIS or ranges.get(axis, [1, 8])[1] is None):
                names.append(axis)
    return names


def recipe_for_torch(source: dict[str, str], description: Description, *, name: str,
                     task: str | None, profiles: list[str]) -> Recipe:
    """The recipe of a described PyTorch source (``trtpack.pytorch.describe``): inputs and
    outputs as described, the generic task unless ``--task`` names a head, and a profile
    from the dims' ranges unless ``profiles`` (``--profile``) are given."""
    from trtpack.sources.onnx_recipe import input_kind, output_metric

    task = task or "generic"
    inputs: list[InputDescription] = [
        {"name": i["name"], "dtype": i["dtype"], "axes": list(i["axes"]),
         "kind": input_kind(i["name"], i["dtype"], len(i["axes"]))}
        for i in description["inputs"]]
    has_mask = any(i["kind"] == "attention_mask" for i in inputs)
    outputs = [{"name": o["name"], "axes": list(o["axes"]),
                "metric": output_metric(o["name"], list(o["axes"]), task, has_mask)}
               for o in description["outputs"]]
    ranges = description.get("ranges", {})
    bounded = bool(source.get("exported_program"))
    profile = default_profile(inputs, ranges, bounded)
    if not profiles and profile is None:
        axes = unsized_axes(inputs, ranges)
        where = Path(source.get("exported_program") or source.get("torchscript") or
                     source.get("factory", "")).name
        raise UserInputError(
            f"'{where}' leaves dynamic dimension(s) {', '.join(axes)} without a maximum: "
            "give their sizes with --profile MIN:OPT:MAX over "
            f"({', '.join(a for a in _axis_order(inputs))})",
            hint="e.g. --profile " + ":".join("x".join(
                str(s) for s in _example_sizes(inputs, k)) for k in range(3)))
    recipe = {
        "name": safe_name(name),
        "description": f"PyTorch model ({source_words(source)})",
        "task": task,
        "source": {**source, "arguments": description.get("arguments", {})},
        "vocab_size": description.get("vocab_size"),
        "inputs": inputs,
        "outputs": outputs,
        "profiles": profiles or [profile or ""],
    }
    try:
        return Recipe.model_validate(recipe)
    except ValidationError as e:
        first = e.errors()[0]
        raise UserInputError(f"the model's description does not make a recipe: "
                             f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
                             ) from None


def _axis_order(inputs: Sequence[InputDescription]) -> list[str]:
    names: list[str] = []
    for spec in inputs:
        names.extend(a for a in spec["axes"] if isinstance(a, str) and a not in names)
    return names


def _example_sizes(inputs: Sequence[InputDescription], corner: int) -> list[int]:
    from trtpack.shapes import BATCH_AXIS

    return [(1, 4, 8)[corner] if a == BATCH_AXIS else (16, 64, 128)[corner]
            for a in _axis_order(inputs)]


def source_words(source: Mapping[str, object]) -> str:
    return Source.model_validate(source).describe()
