"""Which stage processes exist while each stage runs: the export, the build's memory peak (it
holds the whole PyTorch model), has only the simplify's process warming up beside it; later
stages have the next two."""

from __future__ import annotations

from pathlib import Path

from trtpack.api import BuildRequest, resolve_options
from trtpack.pipeline.runner import Pipeline
from trtpack.stages.base import ProgressEvent


def test_only_the_next_stage_warms_up_beside_the_export(tmp_path: Path) -> None:
    options, _ = resolve_options(BuildRequest(
        model="tiny-bert", profiles=["1x4:2x8:4x16"], precision="fp32", target="cpu",
        random_weights=True, out=tmp_path / "out", cache_dir=tmp_path / "cache",
        use_cache=False))
    alive: dict[str, list[str]] = {}

    def on_progress(event: ProgressEvent) -> None:
        if event.kind == "start":  # the runner has started the processes it wants by now
            alive[event.stage] = sorted(pipeline.processes)

    pipeline = Pipeline(options, on_progress)
    report = pipeline.run()
    assert report.status == "ok"
    assert alive["export"] == ["export", "simplify"]
    # fp32: no precision stage; the CPU model's process is the second after the simplify
    assert alive["simplify"] == ["cpu_model", "simplify", "verify"]
    assert alive["verify"] == ["cpu_model", "verify"]
    assert alive["cpu_model"] == ["cpu_model"]
    assert pipeline.processes == {}  # every one ended with the build
    # the CPU model's fusion ran in its process while verify ran (its head start): the
    # stage took it up instead of fusing again
    cpu_model = next(s for s in report.stages if s.name == "cpu_model")
    assert cpu_model.metrics["head_start_seconds"] > 0
    log = (options.out_dir / "logs" / "cpu_model.log").read_text()
    assert log.count("fusing the transformer graph") == 1
    assert "the fusion ran while the stage before ran" in log
