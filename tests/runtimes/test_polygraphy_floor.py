"""The oldest polygraphy trtpack allows (``polygraphy>=X`` in pyproject.toml) has every name,
attribute and keyword argument trtpack's code uses, and the TensorRT names/loader tests pass
with it.

An image with an older polygraphy than the code needs fails late (``CreateConfig`` raised
``TypeError`` on ``tiling_optimization_level`` before polygraphy 0.49.17, and
``polygraphy.comparator.SimpleCompareFunc`` is not in 0.50.3). The uses are read from
trtpack's AST (what each module imports from polygraphy, the keywords of calls to those names,
the attributes taken from them, the methods called on objects they make) plus the keywords
trtpack passes through ``**`` (every builder option's ``config_kwargs``/``network_kwargs``);
the floor's wheel (pure Python) is fetched from PyPI once into
``$TRTPACK_CACHE_DIR/polygraphy-wheels`` and checked in a subprocess that imports it.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import re
import socket
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.version import Version

import trtpack
from trtpack.engine import builder as engine_plan
from trtpack.sources.recipe import EngineSettings

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(trtpack.__file__).parent


def polygraphy_floor() -> str:
    """X of ``"polygraphy>=X"`` in pyproject.toml (its one polygraphy requirement)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    floors = set(re.findall(r"""["']polygraphy\s*>=\s*([\w.]+)["']""", text))
    assert len(floors) == 1, f"one polygraphy floor expected in pyproject.toml, found {floors}"
    return floors.pop()


@dataclass
class Use:
    attrs: set[str] = field(default_factory=set)
    kwargs: set[str] = field(default_factory=set)
    methods: dict[str, set[str]] = field(default_factory=dict)


def polygraphy_uses(source: str) -> dict[tuple[str, str], Use]:
    """(module, name) -> what the code does with each name it imports from polygraphy."""
    tree = ast.parse(source)
    imported: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and \
                node.module.split(".")[0] == "polygraphy":
            for alias in node.names:
                imported[alias.asname or alias.name] = (node.module, alias.name)
    uses = {key: Use() for key in imported.values()}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                node.value.id in imported:
            uses[imported[node.value.id]].attrs.add(node.attr)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in imported:
            uses[imported[node.func.id]].kwargs |= {k.arg for k in node.keywords if k.arg}
    for func in ast.walk(tree):  # in one function, p = Profile(): p.add(...) is Profile.add
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        instances: dict[str, tuple[str, str]] = {}
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                    isinstance(node.value.func, ast.Name) and node.value.func.id in imported:
                instances.update({t.id: imported[node.value.func.id] for t in node.targets
                                  if isinstance(t, ast.Name)})
        for node in ast.walk(func):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    isinstance(node.func.value, ast.Name) and node.func.value.id in instances:
                use = uses[instances[node.func.value.id]]
                use.methods.setdefault(node.func.attr, set()).update(
                    k.arg for k in node.keywords if k.arg)
    return uses


def trtpack_polygraphy_uses() -> dict[tuple[str, str], Use]:
    uses: dict[tuple[str, str], Use] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for key, use in polygraphy_uses(path.read_text(encoding="utf-8")).items():
            into = uses.setdefault(key, Use())
            into.attrs |= use.attrs
            into.kwargs |= use.kwargs
            for method, kwargs in use.methods.items():
                into.methods.setdefault(method, set()).update(kwargs)
    # what trtpack passes through ** (every builder option, every enum value)
    for hardware, tiling, version_compatible, workspace, trt in itertools.product(
            engine_plan.HARDWARE_COMPATIBILITY_ENUM, [None, *engine_plan.TILING_ENUM],
            (False, True), (None, 256), ((10, 12), (11, 0))):
        settings = engine_plan.builder_settings(EngineSettings(
            hardware_compatibility=hardware,  # type: ignore[arg-type]
            tiling_level=tiling,  # type: ignore[arg-type]
            version_compatible=version_compatible, workspace_mb=workspace), trt)
        uses[("polygraphy.backend.trt", "CreateConfig")].kwargs |= set(settings.config_kwargs())
        uses[("polygraphy.backend.trt", "NetworkFromOnnxPath")].kwargs |= \
            set(settings.network_kwargs())
    return uses


CHECKER = r'''
import importlib, inspect, json, sys
import polygraphy
spec = json.load(sys.stdin)
problems = []

def keyword_names(obj):
    """Keywords obj accepts, or None for any; a class's **kwargs that go on to its base
    class's __init__ (polygraphy's CreateConfig) are followed along the MRO."""
    chain = [c.__dict__["__init__"] for c in obj.__mro__ if "__init__" in c.__dict__] \
        if isinstance(obj, type) else [obj]
    known = set()
    for func in chain:
        try:
            params = inspect.signature(func).parameters.values()
        except (TypeError, ValueError):
            return None
        known |= {p.name for p in params if p.kind is not p.VAR_KEYWORD}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return known
    return None

def accepts(obj, names, what):
    known = keyword_names(obj)
    if known is not None:
        problems.extend(f"{what} takes no keyword '{n}'" for n in sorted(set(names) - known))

for item in spec:
    where = f"{item['module']}.{item['name']}"
    try:
        module = importlib.import_module(item["module"])
        obj = getattr(module, item["name"]) if hasattr(module, item["name"]) else \
            importlib.import_module(where)  # a submodule: from polygraphy import cuda
    except (ImportError, AttributeError) as e:
        problems.append(f"{where}: {e}")
        continue
    problems.extend(f"{where} has no attribute '{a}'" for a in item["attrs"]
                    if not hasattr(obj, a))
    if item["kwargs"]:
        accepts(obj, item["kwargs"], where)
    for method, kwargs in item["methods"].items():
        if not hasattr(obj, method):
            problems.append(f"{where} has no method '{method}'")
        elif kwargs:
            accepts(getattr(obj, method), kwargs, f"{where}.{method}")
print(json.dumps({"version": polygraphy.__version__, "file": polygraphy.__file__,
                  "problems": problems}))
'''


def check_polygraphy(folder: Path | None, uses: dict[tuple[str, str], Use]) -> dict[str, object]:
    """Run the checker in a fresh interpreter whose polygraphy is the one in ``folder``
    (None: the installed one)."""
    spec = [{"module": m, "name": n, "attrs": sorted(u.attrs), "kwargs": sorted(u.kwargs),
             "methods": {k: sorted(v) for k, v in u.methods.items()}}
            for (m, n), u in sorted(uses.items())]
    env = dict(os.environ)
    if folder is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(folder), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", CHECKER], input=json.dumps(spec),
                          capture_output=True, text=True, env=env, timeout=300, check=True)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def wheel_cache_dir() -> Path:
    base = os.environ.get("TRTPACK_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "trtpack") / "polygraphy-wheels"


def wheels_of(folder: Path, version: str) -> list[Path]:
    """The polygraphy wheels of ``version`` in ``folder`` (0.49 is 0.49.0)."""
    return [w for w in sorted(folder.glob("polygraphy-*.whl"))
            if Version(w.name.split("-")[1]) == Version(version)]


def floor_polygraphy(version: str) -> Path:
    """The floor version's polygraphy, unpacked (fetched from PyPI once, then cached)."""
    cache = wheel_cache_dir()
    unpacked = cache / f"polygraphy-{version}"
    if (unpacked / "polygraphy" / "__init__.py").is_file():
        return unpacked
    cache.mkdir(parents=True, exist_ok=True)
    wheels = wheels_of(cache, version)
    if not wheels:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--disable-pip-version-check", "-q", "-d", str(cache), f"polygraphy=={version}"],
            capture_output=True, text=True, timeout=300, check=False)
        wheels = wheels_of(cache, version)
        if not wheels:
            try:
                socket.create_connection(("pypi.org", 443), timeout=5).close()
            except OSError:
                pytest.skip(f"polygraphy {version}'s wheel is not cached in {cache} and PyPI "
                            "cannot be reached")
            pytest.fail(f"pip download polygraphy=={version} failed: {done.stderr[-500:]}")
    partial = cache / f"polygraphy-{version}.partial"
    with zipfile.ZipFile(wheels[0]) as z:
        z.extractall(partial)
    partial.replace(unpacked)
    return unpacked


def test_the_reader_finds_what_trtpack_uses_of_polygraphy() -> None:
    uses = trtpack_polygraphy_uses()
    create = uses[("polygraphy.backend.trt", "CreateConfig")]
    assert {"profiles", "tf32", "builder_optimization_level", "memory_pool_limits",
            "hardware_compatibility_level", "version_compatible",
            "tiling_optimization_level"} <= create.kwargs
    assert "strongly_typed" in uses[("polygraphy.backend.trt", "NetworkFromOnnxPath")].kwargs
    assert uses[("polygraphy.backend.trt", "Profile")].methods["add"] >= {"min", "opt", "max"}
    assert "optimization_profile" in uses[("polygraphy.backend.trt", "TrtRunner")].kwargs
    assert {"use_python_logging_system", "module_severity", "colors"} <= \
        uses[("polygraphy.logger", "G_LOGGER")].attrs
    assert ("polygraphy.comparator", "SimpleCompareFunc") in uses


def test_the_installed_polygraphy_has_everything_and_the_check_can_fail() -> None:
    pytest.importorskip("polygraphy")
    uses = trtpack_polygraphy_uses()
    assert check_polygraphy(None, uses)["problems"] == []
    uses[("polygraphy.backend.trt", "CreateConfig")].kwargs.add("no_such_option")
    uses[("polygraphy.comparator", "NoSuchCompareFunc")] = Use()
    problems = check_polygraphy(None, uses)["problems"]
    assert isinstance(problems, list) and len(problems) == 2, problems


def test_the_polygraphy_floor_has_everything_trtpack_uses() -> None:
    version = polygraphy_floor()
    result = check_polygraphy(floor_polygraphy(version), trtpack_polygraphy_uses())
    assert Version(str(result["version"])) == Version(version)
    assert str(wheel_cache_dir()) in str(result["file"])
    assert result["problems"] == [], (
        f"polygraphy {version} (pyproject's floor) lacks what trtpack uses: "
        + "; ".join(map(str, result["problems"])))  # type: ignore[call-overload]


def test_the_tensorrt_names_and_loader_tests_pass_with_the_polygraphy_floor() -> None:
    """tests/runtimes/test_tensorrt_names.py's polygraphy parts (the real loaders over the
    TensorRT names stand-in: build, load, timing cache, nothing on stdout), run with the
    floor's polygraphy first on the path."""
    version = polygraphy_floor()
    folder = floor_polygraphy(version)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(folder), str(ROOT), env.get("PYTHONPATH", "")])
    seen = subprocess.run(
        [sys.executable, "-c", "import polygraphy; print(polygraphy.__version__)"],
        capture_output=True, text=True, env=env, check=True)
    assert Version(seen.stdout.strip()) == Version(version)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(ROOT / "tests" / "runtimes" / "test_tensorrt_names.py"),
         "-k", "polygraphy or timing_cache or stdout"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600, check=False)
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    assert re.search(r"\b\d+ passed\b", done.stdout) and " skipped" not in done.stdout, tail
