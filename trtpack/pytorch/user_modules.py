"""A PyTorch source the user made, loaded: a ``module:function`` (or ``file.py:function``)
factory, a saved ExportedProgram (``.pt2``), a TorchScript file (torch imported inside)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Union

from trtpack.errors import MissingEnvironmentError, UserInputError, first_line
from trtpack.sources.recipe import Source

if TYPE_CHECKING:
    import torch

ExportInput = Union["torch.nn.Module", "torch.export.ExportedProgram"]
"""What the exporter takes: a module, or the ExportedProgram of a ``.pt2`` itself."""


def _import_file(path: Path) -> ModuleType:
    """The module in ``path``, imported with its folder first on ``sys.path`` (so it imports
    its sibling modules as it would when run from there)."""
    import importlib.util
    import sys

    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = path.stem if path.stem.isidentifier() else "trtpack_factory"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserInputError(f"cannot import '{path}' as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def call_ref(ref: str, what: str) -> object:
    """What the function ``ref`` returns, not yet checked (the caller checks what it is)."""
    module_name, _, func_name = ref.rpartition(":")
    if not module_name or not func_name:
        raise UserInputError(f"{what} '{ref}' must be 'package.module:function' or "
                             "'path/to/file.py:function'")
    try:
        module = _import_file(Path(module_name)) if module_name.endswith(".py") else \
            importlib.import_module(module_name)
    except ImportError as e:
        raise MissingEnvironmentError(
            f"{what} '{ref}': cannot import '{module_name}' ({e})",
            hint=f"pip install the package that provides {module_name}",
        ) from None
    func = getattr(module, func_name, None)
    if func is None or not callable(func):
        raise UserInputError(f"{what} '{ref}': '{module_name}' has no function '{func_name}'")
    return func()


def call_factory(ref: str) -> object:
    """What the factory ``ref`` returns: a module, a (module, example inputs) pair, or a model
    directory (a package that ships weights)."""
    return call_ref(ref, "model factory")


def load_torchscript(path: str) -> torch.jit.ScriptModule:
    """A TorchScript module in eval mode (``torch.jit.load``: TorchScript only, nothing is
    unpickled as Python objects)."""
    import torch

    try:
        return torch.jit.load(path, map_location="cpu").eval()
    except RuntimeError as e:
        first = first_line(e, "unreadable")
        raise UserInputError(f"'{path}' is not a loadable TorchScript model: {first}") from None


def load_exported_program(path: str) -> torch.export.ExportedProgram:
    """A saved ExportedProgram (``torch.export.load``). A program whose inputs or outputs
    are classes registered with pytree (a Hugging Face ``ModelOutput``) loads only once
    their modules are imported: those named in its signature are imported first."""
    import warnings

    import torch

    for module in pytree_modules(Path(path)):
        try:
            importlib.import_module(module)
        except ImportError:
            raise UserInputError(f"'{path}' returns a type from '{module}', which is not "
                                 "installed here", hint=f"install the package of {module}"
                                 ) from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return torch.export.load(path)
        except Exception as e:  # torch raises several kinds for a damaged or foreign archive
            first = first_line(e)
            raise UserInputError(f"'{path}' is not a loadable ExportedProgram: {first}"
                                 ) from None


def pytree_modules(path: Path) -> list[str]:
    """The modules of the classes a ``.pt2``'s input and output specs name (outside Python,
    collections and torch): what must be imported before ``torch.export.load``."""
    import re
    import zipfile

    names: set[str] = set()
    with zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            parts = member.split("/")
            if len(parts) >= 3 and parts[1] == "models" and member.endswith(".json"):
                text = archive.read(member).decode("utf-8", errors="replace")
                names |= set(re.findall(r'\\"type\\": \\"([A-Za-z_][\w]*(?:\.\w+)+)\\"',
                                        text))
    modules = {n.rpartition(".")[0] for n in names}
    return sorted(m for m in modules
                  if m.split(".")[0] not in ("builtins", "collections", "torch", "typing"))


def split_factory_result(made: object, ref: str) -> tuple[torch.nn.Module, object]:
    """A factory's module and its example inputs (None when it gave none; a tensor, a tuple
    or a dict of values for ``forward``, read by ``describe``)."""
    import torch

    if isinstance(made, torch.nn.Module):
        return made, None
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
        return made[0], made[1]
    raise UserInputError(f"factory '{ref}' returned {type(made).__name__}; return a "
                         "torch.nn.Module, a (module, example inputs) pair, or a model "
                         "directory")


def call_program_module(module: torch.nn.Module, named: Mapping[str, torch.Tensor]) -> Any:
    """Call an ExportedProgram's module (``program.module()``) with inputs by name: it takes
    them as the program was exported, positional or keyword (its ``_in_spec``)."""
    spec = getattr(module, "_in_spec", None)
    keywords: list[str] = []
    if spec is not None and len(spec.children_specs) == 2:
        keywords = [str(k) for k in (spec.children_specs[1].context or [])]
    args = [v for n, v in named.items() if n not in keywords]
    return module(*args, **{n: v for n, v in named.items() if n in keywords})


def torch_source_module(source: Source) -> tuple[torch.nn.Module, ExportInput]:
    """The module of a PyTorch source, in eval mode, and what the exporter takes: the
    ExportedProgram itself for a ``.pt2``, else the module."""
    if source.exported_program:
        program = load_exported_program(source.exported_program)
        return program.module(), program
    if source.torchscript:
        script = load_torchscript(source.torchscript)
        return script, script
    assert source.factory is not None
    module, _ = split_factory_result(call_factory(source.factory), source.factory)
    module.eval()
    return module, module
