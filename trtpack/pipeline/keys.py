"""What a stage's cache key depends on besides its options and the stage before it: the code
it runs and the packages that code uses, so that two machines share an entry whenever they
would compute the same thing (another trtpack commit that left the stage's code alone, or
another version of a package the stage never imports, keeps the key).

``stage_dependencies(module)`` is, for the stage module ``module``:

- ``code``: the sha256 of the source of every trtpack module the stage runs: its module and,
  transitively, every trtpack module those import (at the top or inside a function) or name
  in a string (``"trtpack.precision.modelopt_worker"``, run in a process of its own), with
  the ``__init__`` of each package on the way (Python runs them on import);
- ``packages``: the installed version of every distribution those modules import, and of
  every distribution those require, transitively (torch's exporter uses onnxscript without
  trtpack importing it);
- ``data``: the sha256 of the package's data files (``trtpack/data``: the default INT8
  calibration text);
- ``python``: the interpreter's major.minor version and the machine's architecture.

Nothing else of the machine is in a key: not trtpack's version number, not the packages a
stage does not use. ``trtpack cache constraints`` prints the versions every stage key holds as
a pip constraints file, so that a fleet's runners install the same ones and share keys."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import platform
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import trtpack

PACKAGE_ROOT = Path(trtpack.__file__).resolve().parent
DATA_FOLDERS = ("data",)
_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class PackageSources(Mapping[str, str]):
    """Every trtpack module's source by module name (``trtpack.pipeline.cache``), read when
    first asked for."""

    def __init__(self, root: Path = PACKAGE_ROOT) -> None:
        self.paths: dict[str, Path] = {}
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root.parent).with_suffix("").parts
            self.paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
        self._read: dict[str, str] = {}

    def __getitem__(self, name: str) -> str:
        if name not in self._read:
            self._read[name] = self.paths[name].read_text(encoding="utf-8")
        return self._read[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.paths)

    def __len__(self) -> int:
        return len(self.paths)

    def __contains__(self, name: object) -> bool:
        return name in self.paths


@functools.cache
def package_sources() -> PackageSources:
    return PackageSources()


_FROM = re.compile(r"^[ \t]*from[ \t]+([\w.]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]*)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w., \t]+)", re.M)
_STRING = re.compile(r"[\"'](trtpack(?:\.[a-z_][a-z0-9_]*)+)[\"']")


def _imports(source: str, known: Mapping[str, str], strings: bool = True
             ) -> tuple[set[str], set[str]]:
    """The trtpack modules ``source`` imports (at the top or in a function) or names in a
    string (unless not ``strings``: the package's ``__init__`` names the modules of its lazy
    attributes, which importing it does not run), and the top-level names of the other
    packages it imports. Read from the text, not parsed (a build computes this for every
    module a stage runs): an import written in a docstring counts too, which only adds."""
    names: list[str] = []
    for module, imported in _FROM.findall(source):
        names.append(module)
        names += [f"{module}.{n.split()[0]}" for n in imported.strip("()").split(",")
                  if n.split()]
    for imported in _IMPORT.findall(source):
        names += [n.split()[0] for n in imported.split(",") if n.split()]
    if strings:
        names += _STRING.findall(source)
    ours: set[str] = set()
    theirs: set[str] = set()
    for name in names:
        if name.split(".")[0] == "trtpack":
            ours.update(n for n in _with_parents(name) if n in known)
        elif name and name[0] != ".":
            theirs.add(name.split(".")[0])
    return ours, theirs


def _with_parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def module_closure(module: str, sources: Mapping[str, str]) -> tuple[list[str], set[str]]:
    """The trtpack modules ``module`` runs (itself, what it imports, transitively, and the
    packages' ``__init__`` on the way), sorted, and the top-level names of the other
    packages they import."""
    seen: set[str] = set()
    third_party: set[str] = set()
    todo = [n for n in _with_parents(module) if n in sources]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        ours, theirs = _imports(sources[name], sources, strings=name != "trtpack")
        third_party |= theirs
        todo.extend(ours - seen)
    return sorted(seen), third_party


def code_digest(modules: list[str], sources: Mapping[str, str]) -> str:
    digest = hashlib.sha256()
    for name in modules:
        digest.update(name.encode() + b"\0" + sources[name].encode() + b"\0")
    return digest.hexdigest()[:16]


# import names whose distribution has another name, beside those of trtpack's package table
# (an import name missing from both is looked up in every installed distribution's files)
OTHER_DISTRIBUTION_NAMES = {"google": "protobuf", "yaml": "PyYAML", "pynvml": "nvidia-ml-py",
                            "PIL": "pillow", "sklearn": "scikit-learn"}


def _distributions(import_name: str) -> list[str]:
    """The installed distributions providing the top-level ``import_name``: from trtpack's
    package table (``machine.packages``) or ``OTHER_DISTRIBUTION_NAMES``, else a
    distribution of that name, else the installed distributions' file lists (slow: read
    once, only for a name found no other way)."""
    from trtpack.machine.packages import PACKAGES

    named = [d for p in PACKAGES if p.module == import_name
             for d in (*p.distributions, p.name)]
    named += [OTHER_DISTRIBUTION_NAMES[import_name]] \
        if import_name in OTHER_DISTRIBUTION_NAMES else []
    for name in [*named, import_name]:
        if _metadata(name) is not None:
            return [name]
    if named:
        return []  # known, not installed
    return _all_distributions().get(import_name, [])


@functools.cache
def _all_distributions() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


@functools.cache
def _metadata(distribution: str) -> tuple[str, tuple[str, ...]] | None:
    """The installed ``distribution``'s version and the distributions it requires (those
    of no extra); None when it is not installed."""
    try:
        metadata = importlib.metadata.distribution(distribution).metadata
    except importlib.metadata.PackageNotFoundError:
        return None
    required = []
    for line in metadata.get_all("Requires-Dist") or []:
        if re.search(r"extra\s*==", line):
            continue
        match = _REQUIREMENT_NAME.match(line)
        if match:
            required.append(match.group(1))
    return str(metadata["Version"]), tuple(required)


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def package_versions(top_level: set[str]) -> dict[str, str]:
    """``{distribution: version}`` of the installed distributions providing the import
    names ``top_level`` and of everything they require, transitively (the standard library
    and what is not installed are left out)."""
    todo = sorted({d for name in top_level for d in _distributions(name)})
    versions: dict[str, str] = {}
    while todo:
        name = todo.pop()
        key = _normalized(name)
        if key in versions:
            continue
        found = _metadata(name)
        if found is None:
            continue
        versions[key], required = found
        todo.extend(r for r in required if _normalized(r) not in versions)
    versions.pop("trtpack", None)  # its code is in ``code``, module by module
    return dict(sorted(versions.items()))


def data_digest() -> str:
    digest = hashlib.sha256()
    for folder in DATA_FOLDERS:
        for path in sorted((PACKAGE_ROOT / folder).rglob("*")):
            if path.is_file():
                digest.update(str(path.relative_to(PACKAGE_ROOT)).encode() + b"\0")
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def stage_dependencies(module: str) -> dict[str, object]:
    """What the key of the stage in ``module`` holds besides its options (see the module's
    docstring). Computed once per process."""
    sources = package_sources()
    modules, third_party = module_closure(module, sources)
    return {
        "code": code_digest(modules, sources),
        "packages": package_versions(third_party - set(sys.stdlib_module_names)),
        "data": data_digest(),
        "python": f"{sys.version_info.major}.{sys.version_info.minor} {platform.machine()}",
    }


def constraints(modules: list[str]) -> str:
    """A pip constraints file pinning every distribution the keys of the stages in
    ``modules`` hold, at the versions installed here."""
    pinned: dict[str, str] = {}
    for module in modules:
        packages = stage_dependencies(module)["packages"]
        assert isinstance(packages, dict)
        pinned.update(packages)
    lines = [f"{name}=={version}" for name, version in sorted(pinned.items())]
    return "\n".join(lines) + "\n"
