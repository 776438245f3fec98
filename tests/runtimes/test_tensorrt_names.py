"""trtpack's TensorRT code against the real TensorRT API of every supported version.

Checked against the bindings' names, not run: the wheels' ``tensorrt.so`` cannot load
without libnvinfer (and a GPU), so these tests read the names it defines (see
tests/runtimes/tensorrt_names.py) and check that

1. every TensorRT attribute trtpack's TensorRT module uses (read from its AST) exists in
   each supported version;
2. the real polygraphy loaders trtpack calls, run with trtpack's options over a stand-in
   ``tensorrt`` module that has only one version's names, touch only names that version
   has (or that polygraphy probes and tolerates missing), and turn each option into the
   TensorRT call it should become. The stand-in is a check of names and of calls made,
   not of TensorRT's behaviour: it builds nothing.

The wheels are fetched from PyPI on first use into ``$TRTPACK_CACHE_DIR/tensorrt-bindings``
(default ``~/.cache/trtpack/tensorrt-bindings``); the tests skip only when that folder is
empty and PyPI cannot be reached.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import trtpack.runtimes.tensorrt as tensorrt_api_module
from tests.runtimes.tensorrt_names import (
    SUPPORTED_BINDINGS,
    BindingsNames,
    StandInTensorRT,
    bindings_wheels,
    reset_polygraphy_tensorrt,
    tensorrt_names,
    used_tensorrt_names,
)
from trtpack.engine import builder as engine_plan
from trtpack.machine.packages import MIN_TENSORRT, parse_version
from trtpack.runtimes.polygraphy_setup import polygraphy_logging
from trtpack.shapes import parse_profiles
from trtpack.sources.recipe import EngineSettings
from trtpack.sources.resolve import resolve_model

TENSORRT_API = Path(tensorrt_api_module.__file__)
LOG = logging.getLogger("trtpack.test.tensorrt-names")


@pytest.fixture(scope="module")
def bindings() -> dict[str, tuple[Path, BindingsNames]]:
    fetch = bindings_wheels()
    if fetch.skip_reason:
        pytest.skip(fetch.skip_reason)
    assert not fetch.errors, "; ".join(fetch.errors)
    return {label: (wheel, tensorrt_names(wheel)) for label, wheel in fetch.wheels.items()}


def test_the_supported_versions_span_two_majors_from_the_minimum(
        bindings: dict[str, tuple[Path, BindingsNames]]) -> None:
    versions = [parse_version(names.version) for _, names in bindings.values()]
    assert len(bindings) == len(SUPPORTED_BINDINGS)
    assert min(versions)[:2] == MIN_TENSORRT
    assert {v[0] for v in versions} >= {10, 11}
    for label, (_, names) in bindings.items():
        assert label.endswith(names.version)
        # the reading works: names every TensorRT 10/11 has are found
        assert not names.missing({"Builder", "IBuilderConfig", "set_memory_pool_limit"})


def test_tensorrt_11_removed_what_the_reading_says(
        bindings: dict[str, tuple[Path, BindingsNames]]) -> None:
    """The names really differ between versions, so a missing name would be caught."""
    for _, names in bindings.values():
        removed = {"EXPLICIT_BATCH", "IInt8EntropyCalibrator2", "int8_calibrator"}
        if parse_version(names.version)[0] >= 11:
            assert names.missing(removed) == sorted(removed), names.version
        else:
            assert names.missing(removed) == [], names.version


def test_the_ast_reader_finds_attributes_through_values_and_annotations() -> None:
    source = '''
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    import tensorrt as trt

def f(engine: trt.ICudaEngine, other) -> None:
    dtype = engine.get_tensor_dtype("x")
    dtype.name
    other.not_tensorrt
    for i in range(engine.num_io_tensors):
        pass

def g() -> None:
    import tensorrt as trt
    trt.TensorIOMode.INPUT
    getattr(trt, "BuilderFlag").TF32
    hasattr(trt.BuilderFlag, "FP16")
'''
    assert used_tensorrt_names(source) == {
        "ICudaEngine", "get_tensor_dtype", "name", "num_io_tensors", "TensorIOMode", "INPUT",
        "BuilderFlag", "TF32", "FP16",
    }


def test_every_name_trtpacks_tensorrt_module_uses_exists_in_every_supported_version(
        bindings: dict[str, tuple[Path, BindingsNames]]) -> None:
    used = used_tensorrt_names(TENSORRT_API.read_text(encoding="utf-8"))
    assert len(used) >= 5  # the reader found the module's TensorRT calls (see the test above)
    missing = [f"TensorRT {names.version} ({label}) has no '{name}', which "
               f"{TENSORRT_API.name} uses"
               for label, (_, names) in bindings.items() for name in names.missing(used)]
    assert not missing, "\n".join(missing)


def test_a_misspelled_tensorrt_name_in_the_module_is_reported_in_every_version(
        bindings: dict[str, tuple[Path, BindingsNames]]) -> None:
    """The check above can fail: a copy of runtimes/tensorrt.py with one TensorRT method
    misspelled has exactly that name missing, in every supported version."""
    source = TENSORRT_API.read_text(encoding="utf-8")
    assert "engine.get_tensor_mode(" in source
    typo = source.replace("engine.get_tensor_mode(", "engine.get_tensor_mdoe(")
    used, used_with_typo = used_tensorrt_names(source), used_tensorrt_names(typo)
    assert "get_tensor_mdoe" in used_with_typo
    for label, (_, names) in bindings.items():
        new = set(names.missing(used_with_typo)) - set(names.missing(used))
        assert new == {"get_tensor_mdoe"}, label


# ------------------------------------------------------------------ polygraphy over the stand-in


@pytest.fixture
def stand_in() -> Iterator[None]:
    """Remove the stand-in ``tensorrt`` (and polygraphy's handles to it) afterwards."""
    pytest.importorskip("polygraphy")
    saved = sys.modules.get("tensorrt")
    reset_polygraphy_tensorrt()
    try:
        yield
    finally:
        reset_polygraphy_tensorrt()
        if saved is None:
            sys.modules.pop("tensorrt", None)
        else:
            sys.modules["tensorrt"] = saved


def _install(wheel: Path, names: BindingsNames) -> StandInTensorRT:
    reset_polygraphy_tensorrt()
    module = StandInTensorRT(names, wheel)
    sys.modules["tensorrt"] = module
    return module


def _option_sets() -> list[EngineSettings]:
    """Every engine option trtpack passes, every enum value of each at least once."""
    hardware = list(engine_plan.HARDWARE_COMPATIBILITY_ENUM)
    tiling = [None, *engine_plan.TILING_ENUM]
    count = max(len(hardware), len(tiling))
    return [EngineSettings(workspace_mb=None if i == 0 else 256 * i,
                           optimization_level=i % 6,
                           hardware_compatibility=hardware[i % len(hardware)],  # type: ignore[arg-type]
                           version_compatible=i % 2 == 1,
                           tiling_level=tiling[i % len(tiling)])  # type: ignore[arg-type]
            for i in range(count)]


def _tiny_onnx(path: Path) -> list[tuple[str, tuple[int, ...]]]:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Cast", ["input_ids"], ["ids_f"], to=TensorProto.FLOAT),
         helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["ids_f", "mask_f"], ["out"])],
        "tiny",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
         for n in ("input_ids", "attention_mask")],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", "sequence"])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return [("input_ids", (-1, -1)), ("attention_mask", (-1, -1))]


@pytest.mark.parametrize("label", [f"{d} {v}" for d, v in SUPPORTED_BINDINGS])
def test_polygraphy_build_and_load_with_trtpacks_options_touch_only_existing_names(
        label: str, bindings: dict[str, tuple[Path, BindingsNames]], stand_in: None,
        tmp_path: Path, record_property: Callable[[str, object], None]) -> None:
    """Runs trtpack's ``build_engine`` / ``load_engine`` / ``engine_tensors`` (the real
    polygraphy 0.53.6 loaders underneath) over a stand-in TensorRT with one version's names.
    A name check, not TensorRT: the "engine" is a few made-up bytes."""
    from polygraphy.exception import PolygraphyException

    wheel, names = bindings[label]
    onnx = tmp_path / "model.onnx"
    inputs = _tiny_onnx(onnx)
    recipe = resolve_model("minilm")
    profiles = parse_profiles(["1x8:4x32:8x128", "8x128:16x128:32x128"],
                              recipe.input_specs())
    trt_profiles = engine_plan.tensorrt_profiles(profiles, [n for n, _ in inputs])
    version = parse_version(names.version)
    tolerated: set[str] = set()
    for index, engine in enumerate(_option_sets()):
        module = _install(wheel, names)
        module.model(inputs, [("input_ids", True, "INT64", (-1, -1)),
                              ("attention_mask", True, "INT64", (-1, -1)),
                              ("out", False, "FLOAT", (-1, -1))])
        rec = module.recorder
        settings = engine_plan.builder_settings(engine, version)
        cache = tmp_path / f"timing-{index}.cache"
        for attempt in ("miss", "hit"):  # no timing cache yet, then the one the build saved
            try:
                tensorrt_api_module.build_engine(onnx, tmp_path / "model.plan", trt_profiles,
                                                 settings, cache, LOG)
                engine_obj = tensorrt_api_module.load_engine(tmp_path / "model.plan", LOG)
                tensors = tensorrt_api_module.engine_tensors(engine_obj)
                tensorrt_api_module.engine_profile_count(engine_obj)
            except (AttributeError, PolygraphyException) as e:
                pytest.fail(f"TensorRT {names.version} ({label}), options {engine}, timing "
                            f"cache {attempt}: {e}; names missing in this version: "
                            f"{sorted(set(rec.missing))}")
            assert cache.is_file(), "the timing cache was not saved"
        assert [t.name for t in tensors] == ["input_ids", "attention_mask", "out"]
        assert [t.mode for t in tensors] == ["input", "input", "output"]
        tolerated |= set(rec.missing)
        _assert_options_reached_tensorrt(rec, settings, trt_profiles, onnx, label)
    # Some names polygraphy only probes (inside try/except or hasattr) and goes on without:
    # TensorRT 11 has no int8_calibrator, 11.0 no QuantizationFlag (read only to print the
    # config). Those must not be names trtpack or its options need; what each option needs
    # is checked call by call above.
    needed = used_tensorrt_names(TENSORRT_API.read_text(encoding="utf-8")) | {
        "clear_flag", "set_flag", "TF32", "VERSION_COMPATIBLE", "set_memory_pool_limit",
        "MemoryPoolType", "WORKSPACE", "builder_optimization_level", "set_shape",
        "add_optimization_profile", "create_timing_cache", "set_timing_cache",
        "get_timing_cache", "parse_from_file", "build_serialized_network",
        "deserialize_cuda_engine", "STRONGLY_TYPED", "NetworkDefinitionCreationFlag",
        "hardware_compatibility_level", "HardwareCompatibilityLevel",
        "tiling_optimization_level", "TilingOptimizationLevel",
        *engine_plan.HARDWARE_COMPATIBILITY_ENUM.values(), *engine_plan.TILING_ENUM.values()}
    assert not tolerated & needed, (
        f"TensorRT {names.version} ({label}) lacks {sorted(tolerated & needed)}")
    record_property("tolerated_missing_names", sorted(tolerated))


def _assert_options_reached_tensorrt(rec: object, settings: engine_plan.BuilderSettings,
                                     profiles: list[engine_plan.TrtProfile], onnx: Path,
                                     label: str) -> None:
    from tests.runtimes.tensorrt_names import Recorder

    assert isinstance(rec, Recorder)
    where = f"TensorRT {rec.version} ({label}), {settings.to_dict()}"
    kwargs = settings.config_kwargs()
    assert rec.calls("parse_from_file")[-1][0] == (str(onnx),), where
    # TF32 off: polygraphy clears the flag (inside a suppress(AttributeError), so a missing
    # name would silently leave TF32 on: the recorder would list it as missing)
    assert any(str(a[0]) == "<TensorRT stand-in BuilderFlag.TF32>"
               for a, _ in rec.calls("clear_flag")), where
    assert rec.sets("builder_optimization_level")[-1] == settings.optimization_level, where
    if "memory_pool_limits" in kwargs:
        (pool, size), _ = rec.calls("set_memory_pool_limit")[-1]
        assert (repr(pool), size) == ("<TensorRT stand-in MemoryPoolType.WORKSPACE>",
                                      settings.workspace_bytes), where
    for key, enum in (("hardware_compatibility_level", "HardwareCompatibilityLevel"),
                      ("tiling_optimization_level", "TilingOptimizationLevel")):
        if key in kwargs:
            assert repr(rec.sets(key)[-1]) == f"<TensorRT stand-in {enum}.{kwargs[key]}>", where
        else:
            assert not rec.sets(key), where
    flags = [repr(a[0]) for a, _ in rec.calls("set_flag")]
    assert ("<TensorRT stand-in BuilderFlag.VERSION_COMPATIBLE>" in flags) == \
        settings.version_compatible, where
    assert not [f for f in flags if f.split(".")[-1].rstrip(">") in
                ("FP16", "INT8", "BF16", "FP8", "TF32")], where  # precision is in the ONNX
    assert ("STRONGLY_TYPED" in rec.touched) == settings.strongly_typed_flag, where
    # one optimization profile per --profile, every input's min/opt/max set, twice per
    # build attempt pair (miss + hit)
    set_shapes = [a for a, _ in rec.calls("set_shape")]
    expected = [(name, list(mn), list(opt), list(mx))
                for p in profiles for name, (mn, opt, mx) in p.items()]
    got = [(a[0], list(a[1]), list(a[2]), list(a[3])) for a in set_shapes]
    assert got == expected * 2, where
    assert len(rec.calls("add_optimization_profile")) == 2 * len(profiles), where
    # the first build starts from an empty timing cache (polygraphy's CreateConfig), the
    # second sets the one the first saved on top (trtpack's ConfigWithTimingCache)
    assert [a[0] for a, _ in rec.calls("create_timing_cache")][:3] == \
        [b"", b"", b"stand-in timing cache"], where
    assert [k for _, k in rec.calls("set_timing_cache")] == [{"ignore_mismatch": False}] * 3


# ------------------------------------------------------------------ nothing on stdout


@pytest.mark.parametrize("label", [f"{d} {v}" for d, v in SUPPORTED_BINDINGS[::3]])
def test_building_the_loaders_and_the_engine_prints_nothing_to_stdout(
        label: str, bindings: dict[str, tuple[Path, BindingsNames]], stand_in: None,
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """``trtpack build --json`` runs the engine stage in its own process: anything polygraphy
    prints would land before the JSON. The config and network loaders the build uses are
    constructed (and the build run, over the names stand-in) with nothing on stdout; the
    same construction outside ``polygraphy_logging`` does print, so this can fail."""
    import polygraphy.logger.logger as polygraphy_logger

    wheel, names = bindings[label]
    onnx = tmp_path / "model.onnx"
    inputs = _tiny_onnx(onnx)
    recipe = resolve_model("minilm")
    profiles = engine_plan.tensorrt_profiles(
        parse_profiles(["1x8:4x32:8x128"], recipe.input_specs()), [n for n, _ in inputs])
    log = logging.getLogger("trtpack.test.stdout")
    log.propagate = False
    for engine in _option_sets():
        settings = engine_plan.builder_settings(engine, parse_version(names.version))
        module = _install(wheel, names)
        module.model(inputs, [("input_ids", True, "INT64", (-1, -1)),
                              ("attention_mask", True, "INT64", (-1, -1)),
                              ("out", False, "FLOAT", (-1, -1))])
        polygraphy_logger.COLORED_MODULE_PRESENT = None  # its first use may print() a warning
        capfd.readouterr()
        with polygraphy_logging(log):
            tensorrt_api_module.engine_loaders(onnx, profiles, settings)
        tensorrt_api_module.build_engine(onnx, tmp_path / "model.plan", profiles, settings,
                                         tmp_path / "t.cache", log)
        tensorrt_api_module.load_engine(tmp_path / "model.plan", log)
        assert capfd.readouterr().out == "", settings
    tensorrt_api_module.engine_loaders(onnx, profiles, settings)  # not routed
    assert "TF32 is disabled" in capfd.readouterr().out


@pytest.mark.parametrize("accepted", [True, False])
def test_a_timing_cache_tensorrt_refuses_is_reported_and_replaced(
        accepted: bool, bindings: dict[str, tuple[Path, BindingsNames]], stand_in: None,
        tmp_path: Path) -> None:
    """``set_timing_cache`` returns False when TensorRT refuses a cache timed on another
    device. polygraphy ignored that result and, on save, combined the refused file into the
    new cache with ``ignore_mismatch=True``; trtpack reports it and writes only the build's
    own cache. Over the names stand-in (newest supported version): ``set_timing_cache``
    answers ``accepted``, and a serialized cache is the stand-in's bytes."""
    label = f"{SUPPORTED_BINDINGS[-1][0]} {SUPPORTED_BINDINGS[-1][1]}"
    wheel, names = bindings[label]
    onnx = tmp_path / "model.onnx"
    inputs = _tiny_onnx(onnx)
    profiles = engine_plan.tensorrt_profiles(
        parse_profiles(["1x8:4x32:8x128"], resolve_model("minilm").input_specs()),
        [n for n, _ in inputs])
    module = _install(wheel, names)
    module.model(inputs, [("input_ids", True, "INT64", (-1, -1)),
                          ("attention_mask", True, "INT64", (-1, -1)),
                          ("out", False, "FLOAT", (-1, -1))])
    rec = module.recorder
    rec.returns["set_timing_cache"] = lambda cache, ignore_mismatch: \
        accepted or "foreign" not in repr(cache)
    rec.returns["create_timing_cache"] = lambda data: _TimingCache(bytes(data))
    cache = tmp_path / "timing.cache"
    cache.write_bytes(b"foreign device's timings")
    settings = engine_plan.builder_settings(EngineSettings(), parse_version(names.version))
    result = tensorrt_api_module.build_engine(onnx, tmp_path / "model.plan", profiles,
                                              settings, cache, LOG)
    assert result.timing_cache_rejected is not accepted
    assert cache.read_bytes() == b"stand-in timing cache"  # never the refused bytes combined
    assert not rec.calls("combine")
    assert list(tmp_path.glob("*.partial")) == []
    # the file was offered to TensorRT once, and replaced by an empty cache when refused
    offered = [a[0] for a, _ in rec.calls("set_timing_cache")]
    assert [repr(c) for c in offered] == ["<timing cache b''>",
                                          "<timing cache b\"foreign device's timings\">"] + \
        ([] if accepted else ["<timing cache b''>"])


class _TimingCache:
    """A stand-in ``ITimingCache`` that remembers the bytes it was made from."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __repr__(self) -> str:
        return f"<timing cache {self.data!r}>"


def test_fetching_skips_only_when_nothing_is_cached_and_pypi_is_unreachable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    import tests.runtimes.tensorrt_names as names_module

    def failing_pip(*args: object, **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess([], 1, "", "ERROR: No matching distribution found")

    monkeypatch.setattr(names_module.subprocess, "run", failing_pip)
    monkeypatch.setattr(names_module, "_pypi_reachable", lambda timeout=5: False)
    offline = bindings_wheels(tmp_path / "empty")
    assert offline.skip_reason is not None and "PyPI cannot be reached" in offline.skip_reason
    monkeypatch.setattr(names_module, "_pypi_reachable", lambda timeout=5: True)
    broken = bindings_wheels(tmp_path / "empty")
    assert broken.skip_reason is None and len(broken.errors) == len(SUPPORTED_BINDINGS)
    assert "No matching distribution" in broken.errors[0]
    cached = tmp_path / "cached"
    cached.mkdir()
    (cached / "tensorrt_cu12_bindings-10.12.0.36-cp312-none-manylinux_2_28_x86_64.whl").touch()
    monkeypatch.setattr(names_module, "_pypi_reachable", lambda timeout=5: False)
    partial = bindings_wheels(cached)  # a cache that is not empty is used, the rest is an error
    assert partial.skip_reason is None and list(partial.wheels) == \
        ["tensorrt-cu12-bindings 10.12.0.36"] and len(partial.errors) == 3
