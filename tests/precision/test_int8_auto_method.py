"""``--calibration-method auto``: each build calibrates once, makes the ``max`` and the ``mse``
INT8 model, and keeps the one whose worst sample on the SEARCH split is higher (a tie:
``max``), never looking at the held-out split to choose."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx
import pytest
from onnx import numpy_helper

from tests.conftest import run_cli
from tests.precision_fixtures import (
    TINY_PROFILES,
    build_options,
    fp32_artifacts,
    make_context,
    run_stage,
    tiny_npz,
)
from trtpack.precision.conversion import Attempt
from trtpack.precision.int8 import method_choice
from trtpack.precision.int8.activation_ranges import activation_quantizers
from trtpack.precision.int8.conversion import Int8Conversion
from trtpack.precision.metrics import MethodChoice


@pytest.fixture(scope="module")
def tiny(tiny_build: Path) -> dict[str, Path]:
    return fp32_artifacts(tiny_build)


class Recorder:
    """What the conversion did, in order: each judged attempt, each set of split rows read
    (their check names) and the choice (``choose_method`` returning)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch,
                 search_worst: dict[str, float] | None = None) -> None:
        self.events: list[tuple[str, Any]] = []
        self.attempts: dict[str, Attempt] = {}
        self.scales: dict[str, dict[str, float]] = {}  # each judged model's activation scales
        judge, split_rows, choose = (Int8Conversion.judge, Int8Conversion.split_rows,
                                     method_choice.choose_method)
        recorder = self

        def judged(self: Int8Conversion, label: str, path: Path, excluded: Sequence[str]
                   ) -> Attempt:
            attempt = judge(self, label, path, excluded)
            if search_worst is not None and label in search_worst:
                # stands in for a judgement (the models are real): the comparison's cases
                attempt.search_worst = search_worst[label]
            recorder.attempts[label] = attempt
            recorder.scales[label] = _scales(str(path))  # read while the model exists
            recorder.events.append(("judge", label))
            return attempt

        def rows(self: Int8Conversion, session: Any, *splits: Any) -> Any:
            recorder.events.append(("split_rows", tuple(name for name, _ in splits)))
            return split_rows(self, session, *splits)

        def chosen(*args: Any, **kwargs: Any) -> tuple[Attempt, MethodChoice]:
            kept, choice = choose(*args, **kwargs)
            recorder.events.append(("chosen", choice.chosen))
            return kept, choice

        monkeypatch.setattr(Int8Conversion, "judge", judged)
        monkeypatch.setattr(Int8Conversion, "split_rows", rows)
        monkeypatch.setattr(method_choice, "choose_method", chosen)

    def before_choice(self) -> list[tuple[str, Any]]:
        return self.events[:self.events.index(("chosen", self.chosen()))]

    def chosen(self) -> str:
        return next(value for kind, value in self.events if kind == "chosen")


def _scales(path: str) -> dict[str, float]:
    model = onnx.load(path)
    inits = {i.name: i for i in model.graph.initializer}
    return {t: float(numpy_helper.to_array(inits[nodes[0].input[1]]))
            for t, nodes in activation_quantizers(model).items()}


def test_auto_keeps_the_method_with_the_better_search_worst(
        tiny: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tiny-bert with ``auto``: both models judged on the search split only (the split rows
    read before the choice are the search split's), the one with the higher search worst
    kept and served (its scales are that method's), the report and the stage's line name it
    with both worsts, and the held-out split is judged afterwards, on the kept model."""
    recorder = Recorder(monkeypatch)
    npz = tiny_npz(tmp_path / "calibration.npz")
    plan = build_options("tiny-bert", "int8", tmp_path / "out", TINY_PROFILES,
                         calibration=npz, calibration_method="auto")
    outcome, _, _ = run_stage(plan, tiny, tmp_path / "stage")
    by_max = recorder.attempts["quantize-max"].search_worst
    by_mse = recorder.attempts["quantize-mse"].search_worst
    assert by_max is not None and by_mse is not None and by_max != by_mse
    expected = "mse" if by_mse > by_max else "max"
    assert recorder.chosen() == expected
    before = recorder.before_choice()
    assert [e for e in before if e[0] == "judge"] == [("judge", "quantize-max"),
                                                      ("judge", "quantize-mse")]
    assert {e[1] for e in before if e[0] == "split_rows"} == {("int8-search",)}
    after = recorder.events[len(before):]
    assert any(e[0] == "split_rows" and "int8-heldout" in e[1] for e in after)
    assert recorder.attempts[f"quantize-{expected}"].split_rows  # judged on search rows
    assert all(r.check == "int8-search"
               for r in recorder.attempts[f"quantize-{expected}"].split_rows)
    calibration = outcome.metrics["calibration"]
    assert calibration["method"] == expected
    assert calibration["choice"] == {"chosen": expected,
                                     "search_worst": {"max": by_max, "mse": by_mse}}
    assert f"auto calibration chose {expected}" in outcome.message
    assert all(r.passed for r in outcome.verification)
    served = _scales(str(outcome.artifacts["precision_onnx"]))
    other = "max" if expected == "mse" else "mse"
    assert served == recorder.scales[f"quantize-{expected}"]  # the kept model is served
    assert served != recorder.scales[f"quantize-{other}"]


@pytest.mark.parametrize(("worsts", "expected"), [
    ({"quantize-max": 0.99, "quantize-mse": 0.995}, "mse"),
    ({"quantize-max": 0.995, "quantize-mse": 0.99}, "max"),
    ({"quantize-max": 0.99, "quantize-mse": 0.99}, "max"),  # a tie keeps max
])
def test_auto_compares_the_search_worsts_and_keeps_max_on_a_tie(
        tiny: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        worsts: dict[str, float], expected: str) -> None:
    """The comparison itself, both ways and on a tie: the two real models are built and
    judged, their search worsts then replaced by the case's (labelled stand-in), and the
    kept model is that method's (its scales differ between max and mse on tiny-bert)."""
    from trtpack.precision.calibration.data import load_calibration, save_feeds
    from trtpack.precision.source import prepare_source
    from trtpack.stages.precision import ConversionView

    recorder = Recorder(monkeypatch, worsts)
    plan = build_options("tiny-bert", "int8", tmp_path / "out", TINY_PROFILES,
                         calibration_method="auto")
    ctx, _, _ = make_context(plan, tiny, tmp_path / "stage")
    work = tmp_path / "work"
    work.mkdir()
    conv = Int8Conversion(ConversionView(ctx), work, prepare_source(tiny["onnx"],
                                                                    work / "source"))
    conv.calibration = load_calibration(plan.recipe, plan.profiles,
                                        tiny_npz(tmp_path / "c.npz"), tokenizer=None,
                                        max_samples=64, seed=0)
    save_feeds(work / "calibration.npz", conv.calibration.feeds)
    kept = conv.convert("quantize", ["MatMul", "Gemm", "Conv"], [], "fp32",
                        conv.split_references)
    assert conv.chosen_method == conv.method == expected == recorder.chosen()
    assert kept is recorder.attempts[f"quantize-{expected}"]
    assert kept.session is not None  # the kept model's session, open for what follows
    assert conv.method_choice is not None
    assert conv.method_choice.search_worst == {"max": worsts["quantize-max"],
                                               "mse": worsts["quantize-mse"]}
    lost = recorder.attempts["quantize-" + ("max" if expected == "mse" else "mse")].path
    assert kept.path.exists() and not lost.parent.exists()  # the other model deleted
    assert conv.qdq_calibration is not None  # the one calibration run, with histograms
    measured = conv.qdq_calibration[2]
    ranges, others = measured.ranges(expected), measured.ranges(
        "max" if expected == "mse" else "mse")
    scales = _scales(str(kept.path))
    differing = [t for t in scales if t in ranges and ranges[t] != pytest.approx(others[t])]
    assert differing  # the two methods' models differ here: the assertion tells them apart
    for tensor in differing:
        assert scales[tensor] == pytest.approx(ranges[tensor] / 127.0, rel=1e-5), tensor
    kept.session = None


def test_auto_is_accepted_by_a_recipe_and_the_cli(tmp_path: Path) -> None:
    """``calibration_method: auto`` validates in a recipe; ``--calibration-method auto`` is a
    choice of the CLI (a bad one is exit 2)."""
    from trtpack.sources.recipe import Recipe
    from trtpack.sources.resolve import resolve_model

    data = resolve_model("tiny-bert").model_dump()
    data["precision_options"]["int8"]["calibration_method"] = "auto"
    assert Recipe.model_validate(data).precision_options.int8.calibration_method == "auto"
    result = run_cli("build", "--help")
    assert "auto (max or mse" in " ".join(result.output.split())
    bad = run_cli("build", "tiny-bert", "--random-weights", "--target", "cpu",
                  "--out", str(tmp_path / "out"), "--calibration-method", "best")
    assert bad.exit_code == 2
