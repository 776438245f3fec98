"""Engine: a strongly typed TensorRT engine for the target GPU, verified against ONNX Runtime.

Builds ``model.plan`` from the precision ONNX (or the simplified FP32 ONNX for fp32) with
one optimization profile per ``--profile`` and the recipe's ``engine:`` options, reusing
the timing cache of this GPU and TensorRT version (``CACHE/tensorrt/``, the one place this
stage writes outside its folder). Then deserializes it, records its real I/O and the
versions in ``model.plan.json``, runs it at every profile's min/opt/max and compares with
the FP32 ONNX Runtime outputs ("engine-vs-onnx" rows), and leaves the equivalent trtexec
command in the report and in ``trtexec.sh``. TensorRT is imported only inside ``run``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from trtpack import __version__
from trtpack.cases import load_cases
from trtpack.engine import builder
from trtpack.engine.provenance import (
    PLAN_FILENAME,
    EngineProvenance,
    io_records,
    onnx_hashes,
    provenance_path,
)
from trtpack.engine.triton_release import triton_serving
from trtpack.machine import packages
from trtpack.machine.gpus import cuda_driver_version
from trtpack.machine.local_targets import check_engine_environment
from trtpack.machine.packages import parse_version
from trtpack.model_io import engine_model_io, model_io_from_onnx
from trtpack.onnx_tools.files import sha256_file
from trtpack.options import BuildPlan
from trtpack.report import JsonObject
from trtpack.stages.artifacts import Artifacts
from trtpack.stages.base import StageContext, StageMetrics, StageOutcome
from trtpack.verify.compare import compare_cases

CHECK = "engine-vs-onnx"



@dataclass
class EngineMetrics(StageMetrics):
    tensorrt: str  # TensorRT version that built the engine
    gpu: str
    compute_capability: str
    profiles: int
    build_seconds: float
    plan_bytes: int
    timing_cache: JsonObject  # path, hit, shared, bytes and sha256 before/after, rejected
    trtexec: str  # the equivalent trtexec command
    cases: int
    failed: int  # verification rows that failed

def fingerprint(plan: BuildPlan) -> JsonObject:
    gpu = plan.target.gpu
    return {
        "target": plan.target.name,
        "compute_capability": gpu.sm if gpu else None,
        "profiles": [p.to_dict() for p in plan.profiles],
        "precision": plan.precision,
        "engine": plan.recipe.engine.model_dump(),
        "tolerance": plan.recipe.verify.model_dump(),
        "tensorrt": packages.tensorrt_version(),  # read when called: a stand-in replaces it
    }


def engine_onnx(ctx: StageContext) -> Path:
    """The ONNX the engine is built from: what would be served without an engine (the
    precision stage's ONNX, else the simplified FP32; ``Artifacts.served_model``)."""
    return ctx.artifacts.served_model(gpu=True)


def final_path(ctx: StageContext, path: Path) -> Path:
    """Where ``path`` (inside the build folder being written) will be once the build
    folder is renamed to OUT: the paths a reproduce command must use."""
    build_dir = ctx.stage_dir.parent.parent  # BUILD/artifacts/<stage>
    if path.is_relative_to(build_dir):
        return ctx.plan.out_dir.resolve() / path.relative_to(build_dir)
    return path


def run(ctx: StageContext) -> StageOutcome:
    from trtpack.runtimes import tensorrt as tensorrt_api
    from trtpack.runtimes.polygraphy_setup import cuda_versions

    o = ctx.plan
    env = check_engine_environment(o.target, o.recipe.engine.hardware_compatibility)
    assert env.gpu is not None
    onnx = engine_onnx(ctx)
    onnx_io = model_io_from_onnx(onnx)
    profiles = builder.tensorrt_profiles(o.profiles, [t.name for t in onnx_io.inputs])
    trt_version = tensorrt_api.tensorrt_version()
    settings = builder.builder_settings(o.recipe.engine, parse_version(trt_version))
    cache = builder.timing_cache_path(o.cache_dir, env.gpu.name, env.gpu.compute_capability,
                                      trt_version, settings.hardware_compatibility,
                                      o.timing_cache)
    shared = None
    if o.cache_url is not None and o.use_cache:  # the fleet's caches of this device, combined
        from trtpack.engine.timing_caches import SharedTimingCaches, combine_into

        shared = SharedTimingCaches(o.cache_url, cache.stem, warn=ctx.log.warning)
        downloaded = shared.download()
        combined = combine_into(cache, tensorrt_api.TimingCacheMaker(), downloaded) \
            if downloaded else None
    plan = ctx.stage_dir / PLAN_FILENAME
    cache_hit = cache.is_file() and cache.stat().st_size > 0
    ctx.progress(f"building on {env.gpu.name} (sm {env.gpu.sm}) with TensorRT {trt_version}, "
                 f"{len(profiles)} profile(s), timing cache {'hit' if cache_hit else 'miss'}")
    built = tensorrt_api.build_engine(onnx, plan, profiles, settings, cache, ctx.log)

    engine = tensorrt_api.load_engine(plan, ctx.log)
    engine_io = engine_model_io(tensorrt_api.engine_tensors(engine),
                                {t.name for t in (*onnx_io.inputs, *onnx_io.outputs)
                                 if t.batch_dynamic})
    cases = load_cases(ctx.needs(ctx.artifacts.fp32_outputs, "fp32_outputs"))
    ctx.progress(f"running the engine on {len(cases)} cases (min/opt/max of every profile)")
    outputs = tensorrt_api.run_cases(engine, cases, ctx.log)
    rows = compare_cases(CHECK, o.recipe, o.precision, cases, outputs)
    del engine

    trtexec = builder.trtexec_command(final_path(ctx, onnx), final_path(ctx, plan), profiles,
                                          settings, cache)
    command = builder.command_text(trtexec)
    script = ctx.stage_dir / "trtexec.sh"
    script.write_text("#!/usr/bin/env bash\n# Builds the same engine with trtexec "
                      f"(TensorRT {trt_version}, {env.gpu.name}).\nset -euo pipefail\n"
                      f"{command}\n", encoding="utf-8")
    script.chmod(0o755)

    cuda_runtime, cuda_driver = cuda_versions()
    onnx_sha, onnx_data_sha = onnx_hashes(onnx)
    inputs, outputs_rec = io_records(engine_io)
    timing: JsonObject = {
        "path": str(cache), "hit": cache_hit, "shared": o.timing_cache is not None,
        "bytes_before": built.timing_cache_bytes_before,
        "bytes_after": built.timing_cache_bytes_after,
        "sha256_before": built.timing_cache_sha256_before,
        "sha256_after": built.timing_cache_sha256_after,
        "rejected": built.timing_cache_rejected}
    if shared is not None:  # this job's cache as an object of its own
        timing["remote"] = {
            "downloaded": len(downloaded),
            "combined": combined.combined if combined else 0,
            "refused": combined.refused if combined else 0,
            "uploaded": shared.upload(cache.read_bytes()) if cache.is_file() else None,
            "failed": shared.failed}
    provenance = EngineProvenance(
        trtpack_version=__version__, tensorrt_version=trt_version, gpu_name=env.gpu.name,
        compute_capability=env.gpu.sm, target=o.target.name, precision=o.precision,
        profiles=[p.to_dict() for p in o.profiles], build_options=settings.to_dict(),
        onnx_sha256=onnx_sha, plan_sha256=sha256_file(plan), plan_bytes=built.plan_bytes,
        inputs=inputs, outputs=outputs_rec, cuda_runtime_version=cuda_runtime,
        cuda_driver_version=cuda_driver or cuda_driver_version(), driver_version=env.gpu.driver,
        onnx_file=onnx.name, onnx_data_sha256=onnx_data_sha,
        built_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        build_seconds=round(built.seconds, 3), timing_cache=timing, trtexec=command,
        triton=triton_serving(trt_version, settings.version_compatible).to_dict(),
    )
    prov_path = provenance_path(plan)
    provenance.save(prov_path)

    failed = sum(not r.passed for r in rows)
    return StageOutcome(
        artifacts=Artifacts(engine=plan, engine_provenance=prov_path, engine_trtexec=script),
        verification=rows,
        metrics=EngineMetrics(
            tensorrt=trt_version, gpu=env.gpu.name, compute_capability=env.gpu.sm,
            profiles=len(profiles), build_seconds=round(built.seconds, 3),
            plan_bytes=built.plan_bytes, timing_cache=timing, trtexec=command,
            cases=len(cases), failed=failed),
        message=(f"{env.gpu.name} sm{env.gpu.sm}, TensorRT {trt_version}, "
                 f"{built.plan_bytes / 2**20:.1f} MB in {built.seconds:.1f} s, timing cache "
                 f"{'refused' if built.timing_cache_rejected else 'hit' if cache_hit else 'miss'}; "
                 f"{len(rows) - failed}/{len(rows)} checks "
                 "passed"),
    )
