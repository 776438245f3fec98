"""Per-sample gates, the three calibration splits, readable layer names and calibration
input checks: the pure parts, on real arrays (fast)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_cli
from trtpack.cases import Case
from trtpack.errors import UserInputError
from trtpack.precision.calibration.files import check_calibration_input
from trtpack.precision.calibration.splits import STRATA, split_three, stratum
from trtpack.shapes import parse_profiles
from trtpack.sources.resolve import resolve_model
from trtpack.verify.compare import compare_cases
from trtpack.verify.sample_metrics import pooled_cosine_per_sample, sample_scores, top1_per_sample

TINY_PROFILES = ["1x4:2x8:4x16", "2x16:4x32:8x64"]


def _batch_with_one_bad_short_sample(seed: int = 0
                                     ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """A [4, 16, 32] batch: three long samples nearly exact, one 2-token sample whose two
    tokens are off (the padded positions after them are untouched)."""
    rng = np.random.default_rng(seed)
    hidden = rng.normal(size=(4, 16, 32)).astype(np.float32)
    mask = np.ones((4, 16), dtype=np.int64)
    mask[3, 2:] = 0
    ids = rng.integers(1000, 2000, size=(4, 16)).astype(np.int64)
    ids[3, 2:] = 0
    out = hidden + rng.normal(scale=0.01, size=hidden.shape).astype(np.float32)
    out[3, :2] += rng.normal(scale=0.2, size=(2, 32)).astype(np.float32)
    inputs = {"input_ids": ids, "attention_mask": mask,
              "token_type_ids": np.zeros_like(ids)}
    return inputs, hidden, out


def test_one_bad_short_sample_fails_the_gate_while_the_batch_mean_passes() -> None:
    inputs, ref, out = _batch_with_one_bad_short_sample()
    per_sample = pooled_cosine_per_sample(ref, out, inputs, "attention_mask")
    assert per_sample.shape == (4,)
    # what a batch-level number says: the mean over the batch passes the 0.99 gate
    assert per_sample.mean() >= 0.99
    flat = (ref * inputs["attention_mask"][..., None]).reshape(-1)
    flat_out = (out * inputs["attention_mask"][..., None]).reshape(-1)
    assert flat @ flat_out / np.linalg.norm(flat) / np.linalg.norm(flat_out) >= 0.99
    # ... while the short sample does not
    assert per_sample[3] < 0.99 and (per_sample[:3] > 0.999).all()

    recipe = resolve_model("tiny-bert")
    case = Case(0, "opt", inputs, {"last_hidden_state": ref})
    texts = ["a long one", "another long one", "a third", "Yes."]
    rows = compare_cases("int8-vs-fp32", recipe, "int8", [case],
                         [{"last_hidden_state": out}],
                         sample_text=lambda _inputs, i: texts[i])
    (row,) = [r for r in rows if r.output == "last_hidden_state"]
    assert not row.passed
    assert row.metric_value == pytest.approx(per_sample[3])
    assert row.metric_mean == pytest.approx(per_sample.mean())
    assert row.worst_sample == 3 and row.samples == 4
    assert row.worst_text == "Yes."
    assert "1 of 4 samples below 0.99" in row.reason and "Yes." in row.reason

    # the same batch without the bad sample passes
    good = out.copy()
    good[3] = ref[3] + (out[0] - ref[0])
    rows = compare_cases("int8-vs-fp32", recipe, "int8", [case], [{"last_hidden_state": good}])
    assert all(r.passed for r in rows if r.output == "last_hidden_state")


def test_padding_does_not_count_in_a_samples_metric() -> None:
    inputs, ref, _ = _batch_with_one_bad_short_sample()
    out = ref.copy()
    out[3, 2:] = 100.0  # garbage in the padded positions only
    assert pooled_cosine_per_sample(ref, out, inputs, "attention_mask").min() > 0.999999
    scores = sample_scores("cosine", ref, out, inputs, "attention_mask")
    assert scores is not None and scores.worst > 0.999999


def test_top1_is_judged_per_sample_on_unpadded_tokens() -> None:
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(2, 6, 10))
    mask = np.array([[1] * 6, [1, 1, 0, 0, 0, 0]])
    out = logits.copy()
    out[1, 0] = -logits[1, 0]  # one of sample 1's two real tokens flips
    out[1, 4] = -logits[1, 4]  # a padded position: does not count
    values = top1_per_sample(logits, out, {"attention_mask": mask}, "attention_mask")
    assert values.tolist() == [1.0, 0.5]


def test_three_splits_are_stratified_fixed_and_disjoint() -> None:
    lengths = [3] * 9 + [15] * 20 + [40] * 12
    first = split_three(lengths, 128, seed=0)
    assert first == split_three(lengths, 128, seed=0)
    assert first != split_three(lengths, 128, seed=1)
    rows = [*first.calibration, *first.search, *first.check, *first.held_out]
    assert sorted(rows) == list(range(len(lengths)))
    for split in (first.calibration, first.search, first.check, first.held_out):
        assert {stratum(lengths[i]) for i in split} == set(STRATA)


def test_calibration_input_is_checked_before_any_stage(tmp_path: Path) -> None:
    recipe = resolve_model("tiny-bert")
    profiles = parse_profiles(TINY_PROFILES, recipe.input_specs())
    too_long = tmp_path / "long.txt"
    too_long.write_text(("word " * 200 + "\n") * 3)
    # tiny-bert has no tokenizer: any text file is refused up front
    with pytest.raises(UserInputError, match="no tokenizer"):
        check_calibration_input(too_long, recipe, profiles)
    minilm = resolve_model("minilm")
    with pytest.raises(UserInputError, match="longer than the largest profile"):
        check_calibration_input(too_long, minilm,
                                parse_profiles(["1x8:4x32:8x128"], minilm.input_specs()))
    names = [s.name for s in recipe.input_specs()]
    ids = np.ones((4, 8), dtype=np.int64)
    cases = {
        "missing": ({n: ids for n in names[:-1]}, "no array for input"),
        "dtype": ({**{n: ids for n in names}, names[0]: ids.astype(np.float32)}, "dtype"),
        "rank": ({**{n: ids for n in names}, names[0]: ids[..., None]}, "rank"),
    }
    for label, (arrays, message) in cases.items():
        path = tmp_path / f"{label}.npz"
        np.savez(path, **arrays)  # type: ignore[arg-type]
        with pytest.raises(UserInputError, match=message):
            check_calibration_input(path, recipe, profiles)
    good = tmp_path / "good.npz"
    np.savez(good, **{n: ids for n in names})  # type: ignore[arg-type]
    check_calibration_input(good, recipe, profiles)


@pytest.mark.parametrize("problem", ["empty", "too-long", "npz-dtype", "method"])
def test_cli_bad_calibration_input_exits_2_before_export(tmp_path: Path, problem: str) -> None:
    path = tmp_path / "calibration.txt"
    path.write_text("A sentence that fits.\n")
    extra: list[str] = []
    if problem == "empty":
        path.write_text("\n \n")
    elif problem == "too-long":
        path.write_text(("word " * 80 + "\n") * 2)
    elif problem == "npz-dtype":
        path = tmp_path / "calibration.npz"
        names = [s.name for s in resolve_model("tiny-bert").input_specs()]
        np.savez(path, **{n: np.ones((4, 8), np.float32) for n in names})  # type: ignore
    else:
        extra = ["--calibration-method", "minmaxish"]
    profiles = [a for p in TINY_PROFILES for a in ("--profile", p)]
    out = tmp_path / "out"
    result = run_cli("build", "tiny-bert", "--random-weights", "--target", "cpu",
                     "--precision", "int8", "--calibration", str(path), *extra, *profiles,
                     "--out", str(out), "--cache-dir", str(tmp_path / "cache"))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert ("calibration-method" in result.output) if problem == "method" \
        else (str(path.name) in result.output)
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_module_paths_come_from_the_exporters_name_scopes() -> None:
    import onnx
    from onnx import helper

    from trtpack.precision.module_paths import display_name, module_paths

    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="node_MatMul_48")
    entry = node.metadata_props.add()
    entry.key = "pkg.torch.onnx.name_scopes"
    entry.value = ("['', 'model', 'model.encoder', 'model.encoder.layer.3', "
                   "'model.encoder.layer.3.attention.self.query', 'linear']")
    bare = helper.make_node("Add", ["y", "b"], ["z"], name="node_Add_49")
    paths = module_paths([node, bare])
    assert paths == {"node_MatMul_48": "encoder.layer.3.attention.self.query"}
    assert display_name("node_MatMul_48", "MatMul", paths) == \
        "encoder.layer.3.attention.self.query (MatMul)"
    assert display_name("node_Add_49", "Add", paths) == "node_Add_49 (Add)"
    assert isinstance(onnx.NodeProto(), type(node))


def test_simplify_carries_node_metadata_over() -> None:
    from onnx import helper

    from trtpack.onnx_tools.simplify_graph import node_metadata_by_output, reattach_node_metadata

    before = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="m")],
                               "g", [], [])
    entry = before.node[0].metadata_props.add()
    entry.key, entry.value = "pkg.torch.onnx.name_scopes", "['', 'model', 'model.fc', 'linear']"
    carried = node_metadata_by_output(helper.make_model(before))
    after = helper.make_model(helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fused")], "g", [], []))
    assert reattach_node_metadata(after, carried) == 1
    assert after.graph.node[0].metadata_props[0].value.endswith("'model.fc', 'linear']")


def test_a_comparison_computes_no_statistics_for_the_silenced_log(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``quiet_polygraphy``: polygraphy's INFO lines of output statistics (medians and
    quantiles of each output and each difference: 2.7 s of a 16.8M-value comparison) are not
    built while its log is silent, and its loggers are polygraphy's own again after; the
    comparison's max differences are still polygraphy's, equal to numpy's."""
    from polygraphy.comparator import util as compare_util

    from trtpack.verify.compare import quiet_polygraphy

    built: list[str] = []
    original = compare_util.str_output_stats
    monkeypatch.setattr(compare_util, "str_output_stats",
                        lambda *a, **k: built.append("stats") or original(*a, **k))
    loggers = compare_util.log_output_stats, compare_util.log_compared_output_stats
    inputs, ref, out = _batch_with_one_bad_short_sample()
    rows = compare_cases("fp16-vs-fp32", resolve_model("tiny-bert"), "fp16",
                         [Case(0, "opt", inputs, {"last_hidden_state": ref})],
                         [{"last_hidden_state": out}])
    assert built == []
    (row,) = rows
    assert row.max_abs_diff == pytest.approx(float(np.abs(ref - out).max()), rel=1e-6)
    assert (compare_util.log_output_stats, compare_util.log_compared_output_stats) == loggers
    with quiet_polygraphy():
        pass
    compare_util.log_output_stats(ref, False, "reference")  # outside: polygraphy's own
    assert built == ["stats"]
