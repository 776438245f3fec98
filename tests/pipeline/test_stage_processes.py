"""Which stage processes exist while each stage runs: the export, the build's memory peak (it
holds the whole PyTorch model), has only the simplify's process warming up beside it until
its exporter works on one core with a small model (then the next three); later stages have
the next two."""

from __future__ import annotations

from pathlib import Path

from trtpack.api import BuildRequest, resolve_options
from trtpack.pipeline.runner import Pipeline
from trtpack.pipeline.stage_runs import SMALL_MODEL_BYTES, StageRuns
from trtpack.resources import ResourceMeter
from trtpack.stages.base import ProgressEvent


def test_only_the_next_stage_warms_up_beside_the_export(tmp_path: Path) -> None:
    plan, _ = resolve_options(BuildRequest(
        model="tiny-bert", profiles=["1x4:2x8:4x16"], precision="fp32", target="cpu",
        random_weights=True, out=tmp_path / "out", cache_dir=tmp_path / "cache",
        use_cache=False))
    alive: dict[str, list[str]] = {}

    def on_progress(event: ProgressEvent) -> None:
        if event.kind == "start":  # the runner has started the processes it wants by now
            alive[event.stage] = sorted(pipeline.processes)
        elif event.message.startswith("exporting to ONNX"):  # after its spare_core message
            alive["exporter"] = sorted(pipeline.processes)

    pipeline = Pipeline(plan, on_progress)
    report = pipeline.run()
    assert report.status == "ok"
    assert alive["export"] == ["export", "simplify"]
    # tiny-bert is a small model: the later stages import while the exporter traces
    assert alive["exporter"] == ["cpu_model", "export", "simplify", "verify"]
    # fp32: no precision stage; the CPU model's process is the second after the simplify
    assert alive["simplify"] == ["cpu_model", "simplify", "verify"]
    assert alive["verify"] == ["cpu_model", "verify"]
    assert alive["cpu_model"] == ["cpu_model"]
    assert pipeline.processes == {}  # every one ended with the build
    # the CPU model's fusion ran in its process while verify ran (its head start): the
    # stage took it up instead of fusing again
    cpu_model = next(s for s in report.stages if s.name == "cpu_model")
    assert cpu_model.metrics["head_start_seconds"] > 0
    log = (plan.out_dir / "logs" / "cpu_model.log").read_text()
    assert log.count("fusing the transformer graph") == 1
    assert "the fusion ran while the stage before ran" in log


def test_a_large_model_keeps_later_stages_waiting_when_the_export_spares_a_core(
        tmp_path: Path) -> None:
    """Each warming process holds 80-140 MB of imports: beside a model over
    SMALL_MODEL_BYTES none starts early; at that size the next three do, left out of the
    export's memory."""
    plan, _ = resolve_options(BuildRequest(
        model="tiny-bert", profiles=["1x4:2x8:4x16"], precision="fp32", target="cpu",
        random_weights=True, out=tmp_path / "out", cache_dir=tmp_path / "cache",
        use_cache=False))
    runs = StageRuns(plan, lambda event: None)
    planned = runs.planned_stages({})
    export = planned[0]
    assert export.stage.name == "export"
    logs = tmp_path / "build" / "logs"
    logs.mkdir(parents=True)
    meter = ResourceMeter()
    try:
        runs.warm_on_spare_core(export, SMALL_MODEL_BYTES + 1, logs, meter)
        assert runs.processes == {}
        runs.warm_on_spare_core(export, SMALL_MODEL_BYTES, logs, meter)
        assert sorted(runs.processes) == ["cpu_model", "simplify", "verify"]
        assert meter.exclude == {p.pid for p in runs.processes.values()}
    finally:
        runs.end()
    assert runs.processes == {}
