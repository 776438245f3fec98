"""TensorRT's API names, read from the real bindings wheels, and a recording stand-in.

Three parts, used by tests/runtimes/test_tensorrt_names.py:

- ``bindings_wheels()`` fetches (once; cached) the ``tensorrt-cu12/-cu13-bindings`` wheels of
  the TensorRT versions trtpack supports from PyPI with ``pip download --no-deps``;
  ``tensorrt_names(wheel)`` reads the names their ``tensorrt_bindings/tensorrt.so`` defines.
  The .so cannot be imported without libnvinfer, but it is a pybind11 module: every class,
  attribute, method, enum member and argument name is stored in it as a string. The
  package's ``__init__.py`` adds a few (``__version__``, ``Logger.Severity``). The ``tensorrt``
  module a user imports after ``pip install tensorrt-cu12`` (11.4.0.106's sdist) is exactly
  ``from tensorrt_bindings import *`` and ``from tensorrt_bindings import __version__``.
- ``used_tensorrt_names(source)`` reads trtpack's TensorRT module's AST and returns every
  attribute it takes from TensorRT (the ``tensorrt`` module and objects that come from it).
- ``StandInTensorRT`` is a module object installed as ``tensorrt`` that answers only the
  names one version's bindings define (any other raises AttributeError, as that TensorRT
  would) and records every name touched and every call made. It lets the real polygraphy
  loaders run with trtpack's options on a CPU. It is a check of *names* and of which calls
  trtpack's options lead to, NOT of TensorRT's behaviour: it builds nothing, and the few
  values it returns (a network with the ONNX's inputs, an "engine" with that I/O, bytes for
  a plan) are made up so that polygraphy's code paths can run to the end.
"""

from __future__ import annotations

import ast
import os
import re
import socket
import subprocess
import sys
import types
import zipfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The TensorRT versions trtpack supports (trtpack.machine.packages.MIN_TENSORRT is 10.12): the
# oldest, the first and the newest 11.x for CUDA 12, and the newest for CUDA 13.
SUPPORTED_BINDINGS: tuple[tuple[str, str], ...] = (
    ("tensorrt-cu12-bindings", "10.12.0.36"),
    ("tensorrt-cu12-bindings", "11.0.0.114"),
    ("tensorrt-cu12-bindings", "11.4.0.106"),
    ("tensorrt-cu13-bindings", "11.4.0.106"),
)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
SO_PATH = "tensorrt_bindings/tensorrt.so"
INIT_PATH = "tensorrt_bindings/__init__.py"


def bindings_cache_dir() -> Path:
    base = os.environ.get("TRTPACK_CACHE_DIR")
    root = Path(base) if base else Path.home() / ".cache" / "trtpack"
    return root / "tensorrt-bindings"


def _wheel_in(folder: Path, dist: str, version: str) -> Path | None:
    pattern = f"{dist.replace('-', '_')}-{version}-*.whl"
    found = sorted(folder.glob(pattern))
    return found[0] if found else None


def _pypi_reachable(timeout: float = 5) -> bool:
    try:
        with socket.create_connection(("pypi.org", 443), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass(frozen=True)
class Fetch:
    wheels: dict[str, Path]  # label ("tensorrt-cu12-bindings 10.12.0.36") -> wheel
    skip_reason: str | None = None  # set only when nothing is cached and PyPI is unreachable
    errors: tuple[str, ...] = ()  # pip failures while PyPI was reachable: a test failure


def bindings_wheels(folder: Path | None = None,
                    supported: Sequence[tuple[str, str]] = SUPPORTED_BINDINGS) -> Fetch:
    """The supported versions' bindings wheels, downloaded into ``folder`` on first use."""
    folder = folder or bindings_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    wheels: dict[str, Path] = {}
    errors: list[str] = []
    for dist, version in supported:
        label = f"{dist} {version}"
        wheel = _wheel_in(folder, dist, version)
        if wheel is None:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--python-version", "3.12", "--disable-pip-version-check", "-q", "-d",
                   str(folder)]
            for platform in PLATFORMS:
                cmd += ["--platform", platform]
            done = subprocess.run([*cmd, f"{dist}=={version}"], capture_output=True,
                                  text=True, timeout=300, check=False)
            wheel = _wheel_in(folder, dist, version)
            if wheel is None:
                lines = [ln for ln in done.stderr.splitlines() if ln.strip()
                         and not ln.startswith("WARNING: Location")]
                errors.append(f"{label}: pip download failed: "
                              f"{lines[-1] if lines else done.returncode}")
                continue
        wheels[label] = wheel
    if not wheels and errors and not _pypi_reachable():
        return Fetch({}, "no TensorRT bindings wheel is cached in "
                     f"{folder} and PyPI cannot be reached", ())
    return Fetch(wheels, None, tuple(errors))


@dataclass(frozen=True)
class BindingsNames:
    """The names one TensorRT version's bindings define.

    The linker merges a string into the tail of a longer one ("INPUT" is stored only as the
    end of "CONDITIONAL_INPUT"), so a name is present when it is a stored identifier or the
    end of a NUL-terminated one (a misspelling that happens to be the end of another name
    would pass: a limit of reading names from a binary).
    """

    version: str
    names: frozenset[str]
    c_strings: tuple[str, ...] = ()

    def has(self, name: str) -> bool:
        return name in self.names or any(s.endswith(name) for s in self.c_strings)

    def missing(self, names: Iterable[str]) -> list[str]:
        return sorted(n for n in set(names) if not self.has(n))


def tensorrt_names(wheel: Path) -> BindingsNames:
    """Every identifier stored in the wheel's ``tensorrt.so`` (pybind11 keeps the names of
    classes, attributes, methods, enum members and arguments as strings) plus the names its
    ``__init__.py`` defines, and the version the wheel is."""
    with zipfile.ZipFile(wheel) as z:
        binary = z.read(SO_PATH)
        init = z.read(INIT_PATH).decode("utf-8")
    names = {m.decode("ascii") for m in re.findall(rb"[A-Za-z_][A-Za-z0-9_]*", binary)}
    c_strings = {m.decode("ascii") for m in re.findall(rb"([A-Za-z_][A-Za-z0-9_]*)\x00", binary)}
    tree = ast.parse(init)
    version = ""
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                    if target.id == "__version__" and isinstance(node.value, ast.Constant):
                        version = str(node.value.value)
                elif isinstance(target, ast.Attribute):
                    names.add(target.attr)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
    return BindingsNames(version, frozenset(names), tuple(sorted(c_strings)))


# ---------------------------------------------------------------- trtpack's own TensorRT names


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id == "getattr" and node.args:
            node = node.args[0]  # getattr(trt, "X") is trt.X
        else:
            node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _tensorrt_aliases(tree: ast.AST) -> set[str]:
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "tensorrt":
                    aliases.add(alias.asname or "tensorrt")
    return aliases


def used_tensorrt_names(source: str) -> set[str]:
    """Every attribute name trtpack's code takes from TensorRT, read from its AST.

    TensorRT values are: the names ``tensorrt`` is imported as (anywhere in the module,
    ``TYPE_CHECKING`` included); parameters annotated with a TensorRT type
    (``engine: trt.ICudaEngine``, whose class name counts too); and, inside a function,
    names assigned from or looping over a TensorRT value. Every attribute taken along a
    chain starting at one (``engine.get_tensor_dtype(n).name``) is used, as is the literal
    name in ``getattr``/``hasattr`` on one.
    """
    tree = ast.parse(source)
    aliases = _tensorrt_aliases(tree)
    used: set[str] = set()

    def annotation_is_tensorrt(annotation: ast.AST | None) -> bool:
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            annotation = ast.parse(annotation.value, mode="eval").body
        if isinstance(annotation, ast.Attribute) and _root_name(annotation) in aliases:
            used.add(annotation.attr)
            return True
        return False

    def tainted(node: ast.AST, names: set[str]) -> bool:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id == "getattr" and node.args:
            return tainted(node.args[0], names)
        if isinstance(node, ast.Attribute | ast.Call | ast.Subscript | ast.Name):
            return _root_name(node) in names
        return False

    def visit_function(func: ast.FunctionDef | ast.AsyncFunctionDef, outer: set[str]) -> None:
        names = set(outer)
        for arg in [*func.args.args, *func.args.kwonlyargs, *func.args.posonlyargs]:
            if annotation_is_tensorrt(arg.annotation):
                names.add(arg.arg)
        for node in ast.walk(func):  # assignments in source order taint their targets
            if isinstance(node, ast.Assign) and tainted(node.value, names):
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.For) and tainted(node.iter, names) and \
                    isinstance(node.target, ast.Name):
                names.add(node.target.id)
        collect(func, names)

    def collect(scope: ast.AST, names: set[str]) -> None:
        for node in ast.walk(scope):
            if isinstance(node, ast.Attribute):
                chain_root = _root_name(node.value)
                if chain_root in names:
                    used.add(node.attr)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                    node.func.id in ("getattr", "hasattr") and len(node.args) >= 2 and \
                    tainted(node.args[0], names) and isinstance(node.args[1], ast.Constant):
                used.add(str(node.args[1].value))

    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            visit_function(node, aliases)
    collect(tree, aliases)
    return used


# ---------------------------------------------------------------- the recording stand-in


UNSET_ATTRIBUTES = frozenset({"int8_calibrator"})
"""Attributes a fresh TensorRT object has as None (no calibrator unless one is set)."""


class HostMemory(bytes):
    """Bytes that also work as ``with x.serialize() as buffer`` (IHostMemory)."""

    def __enter__(self) -> HostMemory:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _Base:
    """What a class deriving from a stand-in TensorRT class (``class L(trt.ILogger)``) gets."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


@dataclass
class Recorder:
    version: str
    bindings: BindingsNames
    touched: set[str] = field(default_factory=set)
    missing: list[str] = field(default_factory=list)  # in order, repeats kept
    events: list[tuple[str, str, tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)
    returns: dict[str, Callable[..., Any]] = field(default_factory=dict)

    def touch(self, name: str) -> None:
        self.touched.add(name)
        if not self.bindings.has(name):
            self.missing.append(name)
            raise AttributeError(f"TensorRT {self.version} has no attribute '{name}' "
                                 "(trtpack's names stand-in)")

    def calls(self, method: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        return [(a, k) for kind, name, a, k in self.events if kind == "call" and name == method]

    def sets(self, attribute: str) -> list[Any]:
        return [a[0] for kind, name, a, _ in self.events if kind == "set" and name == attribute]


class Fake:
    """Any TensorRT object or enum member: attributes are checked against the version's names
    and recorded; calls are recorded and return another ``Fake`` (or what ``returns`` says)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # see make(): keeps subclassing easy
        pass

    @classmethod
    def make(cls, rec: Recorder, path: str, values: dict[str, Any] | None = None) -> Fake:
        obj = object.__new__(cls)
        object.__setattr__(obj, "_rec", rec)
        object.__setattr__(obj, "_path", path)
        object.__setattr__(obj, "_values", values or {})
        return obj

    def __getattr__(self, name: str) -> Any:
        rec: Recorder = object.__getattribute__(self, "_rec")
        if name == "__members__":
            rec.touch(name)
            return {}
        if name.startswith("__"):
            raise AttributeError(name)
        rec.touch(name)
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        if name in UNSET_ATTRIBUTES:
            return None
        return Fake.make(rec, f"{object.__getattribute__(self, '_path')}.{name}")

    def __setattr__(self, name: str, value: Any) -> None:
        rec: Recorder = object.__getattribute__(self, "_rec")
        rec.touch(name)
        rec.events.append(("set", name, (value,), {}))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        rec: Recorder = object.__getattribute__(self, "_rec")
        path: str = object.__getattribute__(self, "_path")
        method = path.rsplit(".", 1)[-1]
        rec.events.append(("call", method, args, kwargs))
        if method in rec.returns:
            return rec.returns[method](*args, **kwargs)
        return Fake.make(rec, f"{path}()")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (_Base,)

    def __repr__(self) -> str:
        return f"<TensorRT stand-in {object.__getattribute__(self, '_path')}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Fake) and repr(self) == repr(other)

    def __hash__(self) -> int:
        return hash(repr(self))

    def __int__(self) -> int:
        return 0

    __index__ = __int__

    def __bool__(self) -> bool:
        return True

    def __iter__(self) -> Any:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __lt__(self, other: object) -> bool:
        return False

    __le__ = __gt__ = __ge__ = __lt__

    def __enter__(self) -> Fake:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class StandInTensorRT(types.ModuleType):
    """A ``tensorrt`` module that has exactly one version's names (see the module doc)."""

    def __init__(self, bindings: BindingsNames, wheel: Path) -> None:
        super().__init__("tensorrt")
        self.__version__ = bindings.version
        self.__file__ = str(wheel)
        self._rec = Recorder(bindings.version, bindings)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        self._rec.touch(name)
        return Fake.make(self._rec, name)

    @property
    def recorder(self) -> Recorder:
        return self._rec

    def model(self, inputs: Iterable[tuple[str, tuple[int, ...]]],
              tensors: Iterable[tuple[str, bool, str, tuple[int, ...]]]) -> None:
        """What the stand-in's network and engine report: the ONNX's inputs (name, shape with
        -1 for dynamic), and the engine's I/O (name, is_input, DataType member, shape)."""
        rec = self._rec
        inputs = list(inputs)
        tensors = list(tensors)
        by_name = {t[0]: t for t in tensors}

        def network(*args: Any, **kwargs: Any) -> Fake:
            return Fake.make(rec, "INetworkDefinition", {"num_inputs": len(inputs)})

        def network_input(index: int) -> Fake:
            name, shape = inputs[index]
            return Fake.make(rec, f"ITensor[{name}]", {"name": name, "shape": shape,
                                                      "is_shape_tensor": False})

        def engine(buffer: Any) -> Fake:
            return Fake.make(rec, "ICudaEngine", {"num_io_tensors": len(tensors),
                                                  "num_optimization_profiles": 1})

        def mode(name: str) -> Fake:
            return Fake.make(rec, "TensorIOMode.INPUT" if by_name[name][1]
                             else "TensorIOMode.OUTPUT")

        rec.returns.update({
            "create_network": network,
            "get_input": network_input,
            "build_serialized_network": lambda *a, **k: HostMemory(b"stand-in plan"),
            "serialize": lambda *a, **k: HostMemory(b"stand-in timing cache"),
            "deserialize_cuda_engine": engine,
            "get_tensor_name": lambda i: tensors[i][0],
            "get_tensor_mode": mode,
            "get_tensor_dtype": lambda name: Fake.make(rec, f"DataType.{by_name[name][2]}",
                                                       {"name": by_name[name][2]}),
            "get_tensor_shape": lambda name: by_name[name][3],
        })


def polygraphy_lazy_modules() -> list[Any]:
    """polygraphy's lazily imported ``tensorrt`` handles (each caches the module it imported)."""
    found = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("polygraphy") or module is None:
            continue
        for value in list(vars(module).values()):
            if type(value).__name__ == "LazyModule":
                found.append(value)
    return found


def reset_polygraphy_tensorrt() -> None:
    """Forget any ``tensorrt`` polygraphy imported (a stand-in of another version)."""
    for lazy in polygraphy_lazy_modules():
        if isinstance(object.__getattribute__(lazy, "module"), StandInTensorRT):
            object.__setattr__(lazy, "module", None)
    util = sys.modules.get("polygraphy.backend.trt.util")
    if util is not None:
        util.TRT_LOGGER = None  # type: ignore[attr-defined]
