"""The engine stage on a machine without GPU/TensorRT: it stops with exit 3 before any work,
its fingerprint changes with what the engine depends on, and --no-engine skips it."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from trtpack.errors import MissingEnvironmentError
from trtpack.machine import gpus, packages
from trtpack.machine.targets import resolve_target
from trtpack.options import BuildPlan, FixedPrecision
from trtpack.pipeline.stage import STAGES
from trtpack.shapes import parse_profiles
from trtpack.sources.resolve import resolve_model
from trtpack.stages import engine as engine_stage
from trtpack.stages.artifacts import Artifacts
from trtpack.stages.base import StageContext

needs_no_gpu = pytest.mark.skipif(
    gpus.detect_gpu() is not None and packages.tensorrt_available(),
    reason="this machine has a GPU and TensorRT (tests/gpu covers the engine stage there)",
)


def _options(tmp_path: Path, **changes: object) -> BuildPlan:
    recipe = resolve_model("minilm")
    plan = BuildPlan(
        recipe=recipe, profiles=tuple(parse_profiles(recipe.profiles, recipe.input_specs())),
        precision_choice=FixedPrecision("fp16"), target=resolve_target("g5"),
        out_dir=tmp_path / "out", opset=18,
        cache_dir=tmp_path / "cache",
    )
    return replace(plan, **changes)  # type: ignore[arg-type]


def _context(plan: BuildPlan, tmp_path: Path) -> StageContext:
    stage_dir = tmp_path / "build" / "artifacts" / "engine"
    stage_dir.mkdir(parents=True)
    return StageContext(plan=plan, stage="engine", stage_dir=stage_dir,
                        build_dir=tmp_path / "build", artifacts=Artifacts(),
                        log=logging.getLogger("test-engine"), on_progress=lambda e: None)


@needs_no_gpu
def test_run_stops_with_exit_3_before_any_work(tmp_path: Path) -> None:
    # no artifacts at all: reaching for one would raise StageError, not this
    ctx = _context(_options(tmp_path), tmp_path)
    with pytest.raises(MissingEnvironmentError) as info:
        engine_stage.run(ctx)
    assert info.value.exit_code == 3
    assert "g5" in str(info.value) and "A10G" in str(info.value)
    assert list(ctx.stage_dir.iterdir()) == []
    assert not (tmp_path / "cache").exists()


def test_fingerprint_is_json_and_tracks_engine_inputs(tmp_path: Path) -> None:
    import json

    base = _options(tmp_path)
    fp = engine_stage.fingerprint(base)
    json.dumps(fp)
    assert fp["compute_capability"] == "8.6"
    recipe = base.recipe.model_copy(
        update={"engine": base.recipe.engine.model_copy(update={"optimization_level": 5})})
    changed = [
        _options(tmp_path, target=resolve_target("g6")),
        _options(tmp_path, precision_choice=FixedPrecision("int8")),
        _options(tmp_path, recipe=recipe),
        _options(tmp_path, profiles=tuple(parse_profiles(["1x8:2x16:4x32"],
                                                         base.recipe.input_specs()))),
    ]
    for plan in changed:
        assert engine_stage.fingerprint(plan) != fp
    # where the output goes does not change the engine
    assert engine_stage.fingerprint(_options(tmp_path, out_dir=tmp_path / "elsewhere")) == fp


def test_no_engine_and_cpu_target_skip_the_stage(tmp_path: Path) -> None:
    stage = next(s for s in STAGES if s.name == "engine")
    assert stage.module == "trtpack.stages.engine"
    assert stage.skip_reason(_options(tmp_path, build_engine=False)) == "--no-engine"
    assert stage.skip_reason(_options(tmp_path, target=resolve_target("cpu"))) is not None
    assert stage.skip_reason(_options(tmp_path)) is None


def test_final_path_maps_into_the_output_folder(tmp_path: Path) -> None:
    ctx = _context(_options(tmp_path), tmp_path)
    inside = ctx.stage_dir / "model.plan"
    assert engine_stage.final_path(ctx, inside) == \
        (tmp_path / "out").resolve() / "artifacts" / "engine" / "model.plan"
    assert engine_stage.final_path(ctx, Path("/elsewhere/x.onnx")) == Path("/elsewhere/x.onnx")


def test_engine_onnx_prefers_the_precision_onnx(tmp_path: Path) -> None:
    ctx = _context(_options(tmp_path), tmp_path)
    ctx.artifacts = Artifacts(onnx=Path("simplified.onnx"))
    assert engine_stage.engine_onnx(ctx) == Path("simplified.onnx")
    ctx.artifacts = Artifacts(onnx=Path("simplified.onnx"), precision_onnx=Path("fp16.onnx"))
    assert engine_stage.engine_onnx(ctx) == Path("fp16.onnx")


def test_polygraphy_and_tensorrt_messages_go_to_the_stage_log(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The library never prints: polygraphy's logger (which also carries TensorRT's
    messages) is routed to the stage log while building, and restored afterwards."""
    pytest.importorskip("polygraphy")
    from polygraphy.logger import G_LOGGER

    from trtpack.runtimes.polygraphy_setup import polygraphy_logging

    log = logging.getLogger("test-engine-log")
    log.propagate = False
    handler = logging.FileHandler(tmp_path / "engine.log")
    log.addHandler(handler)
    before = (G_LOGGER.use_python_logging_system, G_LOGGER.module_severity)
    try:
        with polygraphy_logging(log):
            G_LOGGER.info("building the engine")
            G_LOGGER.warning("a TensorRT warning")
    finally:
        log.removeHandler(handler)
        handler.close()
    captured = capsys.readouterr()
    assert "building the engine" not in captured.out + captured.err
    text = (tmp_path / "engine.log").read_text()
    assert "building the engine" in text and "a TensorRT warning" in text
    assert (G_LOGGER.use_python_logging_system, G_LOGGER.module_severity) == before
