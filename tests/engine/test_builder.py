"""Engine build plan, pure parts: profiles -> TensorRT shapes, builder settings as the
polygraphy/TensorRT arguments they become, timing-cache paths, the trtexec command.

These check what trtpack *would pass* to polygraphy/TensorRT; no TensorRT runs here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trtpack.engine.builder import (
    BuilderSettings,
    builder_settings,
    command_text,
    tensorrt_profiles,
    timing_cache_path,
    trtexec_command,
)
from trtpack.errors import UserInputError
from trtpack.shapes import parse_profiles
from trtpack.sources.recipe import EngineSettings
from trtpack.sources.resolve import resolve_model

TRT10 = (10, 13, 0, 35)
TRT11 = (11, 4, 1)


@pytest.fixture
def minilm_profiles() -> list:
    recipe = resolve_model("minilm")
    return parse_profiles(["1x8:4x32:8x128", "8x128:16x256:32x512"], recipe.input_specs())


def test_profiles_become_min_opt_max_per_input(minilm_profiles: list) -> None:
    p0, p1 = tensorrt_profiles(minilm_profiles)
    assert list(p0) == ["input_ids", "attention_mask", "token_type_ids"]
    assert p0["input_ids"] == ((1, 8), (4, 32), (8, 128))
    assert p1["attention_mask"] == ((8, 128), (16, 256), (32, 512))


def test_profiles_only_for_inputs_the_network_has(minilm_profiles: list) -> None:
    (p0, _) = tensorrt_profiles(minilm_profiles, ["input_ids", "attention_mask"])
    assert set(p0) == {"input_ids", "attention_mask"}


def test_profile_missing_a_network_input_is_an_error(minilm_profiles: list) -> None:
    with pytest.raises(UserInputError, match=r"no shape for the model input.*pixel_values"):
        tensorrt_profiles(minilm_profiles, ["input_ids", "pixel_values"])


def test_default_settings_set_no_precision_flags_and_keep_tf32_off() -> None:
    settings = builder_settings(EngineSettings(), TRT10)
    kwargs = settings.config_kwargs()
    assert kwargs == {"tf32": False, "builder_optimization_level": 3}
    for flag in ("fp16", "int8", "bf16", "fp8", "precision_constraints"):
        assert flag not in kwargs


def test_all_options_map_to_polygraphy_create_config_kwargs() -> None:
    engine = EngineSettings(workspace_mb=2048, optimization_level=5,
                            hardware_compatibility="ampere+", version_compatible=True,
                            tiling_level="moderate")
    kwargs = builder_settings(engine, TRT10).config_kwargs()
    assert kwargs == {
        "tf32": False,
        "builder_optimization_level": 5,
        "memory_pool_limits": {"WORKSPACE": 2048 * 2**20},
        "hardware_compatibility_level": "AMPERE_PLUS",
        "version_compatible": True,
        "tiling_optimization_level": "MODERATE",
    }


def test_kwargs_are_parameters_of_the_installed_polygraphy_create_config() -> None:
    """Every key we pass is a real parameter of polygraphy's CreateConfig (signature only;
    calling it needs TensorRT)."""
    import inspect

    pytest.importorskip("polygraphy")
    from polygraphy.backend.trt.config import CreateConfig, _CreateConfigCommon

    params = set(inspect.signature(CreateConfig.__init__).parameters) | set(
        inspect.signature(_CreateConfigCommon.__init__).parameters)
    engine = EngineSettings(workspace_mb=1, hardware_compatibility="same_compute_capability",
                            version_compatible=True, tiling_level="fast")
    settings = builder_settings(engine, TRT10)
    assert set(settings.config_kwargs()) <= params
    assert {"profiles", "load_timing_cache"} <= params

    from polygraphy.backend.trt.loader import EngineBytesFromNetwork, NetworkFromOnnxPath

    assert set(settings.network_kwargs()) <= set(
        inspect.signature(NetworkFromOnnxPath.__init__).parameters)
    assert "save_timing_cache" in inspect.signature(EngineBytesFromNetwork.__init__).parameters


def test_strongly_typed_flag_on_tensorrt_10_only() -> None:
    assert builder_settings(EngineSettings(), TRT10).network_kwargs() == {"strongly_typed": True}
    # TensorRT 11: every network is strongly typed; the creation flag is not needed
    assert builder_settings(EngineSettings(), TRT11).network_kwargs() == {}
    assert builder_settings(EngineSettings(), TRT11).to_dict()["strongly_typed"] is True


def test_timing_cache_per_gpu_and_version(tmp_path: Path) -> None:
    a = timing_cache_path(tmp_path, "NVIDIA A10G", (8, 6), "10.13.0.35")
    assert a == tmp_path / "tensorrt" / "timing-NVIDIA_A10G-sm86-trt10.13.0.35.cache"
    assert timing_cache_path(tmp_path, "NVIDIA A10G", (8, 9), "10.13.0.35") != a
    assert timing_cache_path(tmp_path, "NVIDIA A10G", (8, 6), "11.4.1") != a
    assert timing_cache_path(tmp_path, "NVIDIA A10G", (8, 6), "10.13.0.35", "ampere+").name == \
        "timing-NVIDIA_A10G-sm86-trt10.13.0.35-ampereplus.cache"
    assert "/" not in timing_cache_path(tmp_path, "a/b", (8, 6), "10.13/evil").name


def test_gpus_sharing_a_compute_capability_get_their_own_timing_cache(tmp_path: Path) -> None:
    """L4/L40S (8.9), A100 40/80 GB (8.0), H100/H200 (9.0): one compute capability, different
    devices, whose timings TensorRT does not share; a CI matrix's shared folder keeps them
    apart (they shared one file, named by compute capability)."""
    from trtpack.machine.targets import TARGETS

    gpus = {t.gpu for t in TARGETS if t.gpu is not None}
    same_cc = [(a, b) for a in gpus for b in gpus
               if a.name < b.name and a.compute_capability == b.compute_capability]
    assert {frozenset((a.name, b.name)) for a, b in same_cc} >= {
        frozenset(("L4", "L40S")), frozenset(("A100-SXM4-40GB", "A100-SXM4-80GB")),
        frozenset(("H100", "H200"))}
    shared = tmp_path / "ci-timing"
    for a, b in same_cc:
        assert timing_cache_path(tmp_path, a.name, a.compute_capability, "10.13.3.9",
                                 shared_dir=shared) != \
            timing_cache_path(tmp_path, b.name, b.compute_capability, "10.13.3.9",
                              shared_dir=shared)


def test_trtexec_command_two_profiles_all_options(minilm_profiles: list) -> None:
    engine = EngineSettings(workspace_mb=1024, optimization_level=4,
                            hardware_compatibility="ampere+", version_compatible=True,
                            tiling_level="full")
    cmd = trtexec_command(Path("/o/model.onnx"), Path("/o/model.plan"),
                          tensorrt_profiles(minilm_profiles), builder_settings(engine, TRT10),
                          Path("/c/timing.cache"))
    assert cmd[:4] == ["trtexec", "--onnx=/o/model.onnx", "--saveEngine=/o/model.plan",
                       "--skipInference"]
    assert "--stronglyTyped" in cmd
    assert cmd.index("--profile=0") < cmd.index("--profile=1")
    p0 = cmd.index("--profile=0")
    assert cmd[p0 + 1] == ("--minShapes=input_ids:1x8,attention_mask:1x8,token_type_ids:1x8")
    assert cmd[p0 + 3] == \
        "--maxShapes=input_ids:8x128,attention_mask:8x128,token_type_ids:8x128"
    p1 = cmd.index("--profile=1")
    assert cmd[p1 + 2].startswith("--optShapes=input_ids:16x256,")
    for flag in ("--memPoolSize=workspace:1024M", "--builderOptimizationLevel=4",
                 "--hardwareCompatibilityLevel=ampere+", "--versionCompatible",
                 "--tilingOptimizationLevel=3", "--noTF32",
                 "--timingCacheFile=/c/timing.cache"):
        assert flag in cmd
    for precision_flag in ("--fp16", "--int8", "--best"):
        assert precision_flag not in cmd


def test_trtexec_command_tensorrt_11_and_defaults(minilm_profiles: list) -> None:
    cmd = trtexec_command(Path("m.onnx"), Path("m.plan"), tensorrt_profiles(minilm_profiles[:1]),
                          builder_settings(EngineSettings(), TRT11), None)
    assert "--stronglyTyped" not in cmd  # always on in TensorRT 11
    assert not any(c.startswith(("--profile=", "--memPoolSize", "--hardwareCompat",
                                 "--tilingOptimizationLevel", "--timingCacheFile"))
                   for c in cmd)
    assert "--builderOptimizationLevel=3" in cmd and "--versionCompatible" not in cmd


def test_same_compute_capability_spelling() -> None:
    settings = BuilderSettings(TRT10, hardware_compatibility="same_compute_capability")
    assert settings.config_kwargs()["hardware_compatibility_level"] == "SAME_COMPUTE_CAPABILITY"
    cmd = trtexec_command(Path("m.onnx"), Path("m.plan"), [], settings, None)
    assert "--hardwareCompatibilityLevel=sameComputeCapability" in cmd


def test_command_text_quotes_paths_with_spaces() -> None:
    assert command_text(["trtexec", "--onnx=/a b/m.onnx"]) == "trtexec '--onnx=/a b/m.onnx'"


def test_polygraphy_profiles_from_the_plan(minilm_profiles: list) -> None:
    """The real polygraphy Profile objects (they are plain mappings; TensorRT is only needed
    when CreateConfig turns them into optimization profiles)."""
    pytest.importorskip("polygraphy")
    from trtpack.runtimes.polygraphy_setup import polygraphy_profiles

    p0, p1 = polygraphy_profiles(tensorrt_profiles(minilm_profiles))
    assert list(p0) == ["input_ids", "attention_mask", "token_type_ids"]
    shape = p1["token_type_ids"]
    assert [list(shape.min), list(shape.opt), list(shape.max)] == \
        [[8, 128], [16, 256], [32, 512]]
    assert "tensorrt" not in __import__("sys").modules


def test_runner_and_loader_signatures_we_call() -> None:
    import inspect

    pytest.importorskip("polygraphy")
    from polygraphy.backend.trt import EngineFromBytes, Profile, TrtRunner

    assert list(inspect.signature(Profile.add).parameters)[1:] == ["name", "min", "opt", "max"]
    assert "optimization_profile" in inspect.signature(TrtRunner.__init__).parameters
    assert "serialized_engine" in inspect.signature(EngineFromBytes.__init__).parameters


def test_shared_timing_cache_folder_keeps_one_file_per_gpu_and_version(tmp_path: Path) -> None:
    shared = tmp_path / "ci-timing"
    a = timing_cache_path(tmp_path, "NVIDIA A10G", (8, 6), "10.13.0.35", shared_dir=shared)
    assert a == shared / "timing-NVIDIA_A10G-sm86-trt10.13.0.35.cache"
    t4 = timing_cache_path(tmp_path, "Tesla T4", (7, 5), "10.13.0.35", shared_dir=shared)
    assert t4.parent == shared and t4 != a


def test_timing_cache_option_takes_a_folder(tmp_path: Path) -> None:
    from trtpack.api import BuildRequest, resolve_options

    folder = tmp_path / "timing"
    plan, _ = resolve_options(BuildRequest("tiny-bert", target="g5", build_engine=False,
                                              timing_cache=folder, out=tmp_path / "o"))
    assert plan.timing_cache == folder.resolve()
    file = tmp_path / "timing.cache"
    file.write_bytes(b"x")
    with pytest.raises(UserInputError, match="is a file; give a folder"):
        resolve_options(BuildRequest("tiny-bert", target="g5", build_engine=False,
                                     timing_cache=file, out=tmp_path / "o"))


def test_provenance_names_the_fields_that_may_differ_between_builds() -> None:
    from dataclasses import fields

    from trtpack.engine.provenance import VARIES_BETWEEN_BUILDS, EngineProvenance

    known = {f.name for f in fields(EngineProvenance)}
    assert set(VARIES_BETWEEN_BUILDS) <= known
    assert {"plan_sha256", "built_at", "timing_cache"} <= set(VARIES_BETWEEN_BUILDS)
    # what identifies the inputs is never among them (merge compares these)
    assert not {"onnx_sha256", "precision", "profiles", "inputs", "outputs",
                "tensorrt_version", "compute_capability"} & set(VARIES_BETWEEN_BUILDS)
