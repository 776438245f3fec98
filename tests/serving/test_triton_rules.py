"""Configs and tokenizers checked against Triton's TensorRT-backend rules, mirrored by
``trtpack.serving.triton_rules`` (issue 25, items 3, 4 and 14)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.hf_models import minilm_dir
from tests.serving.python_models import python_model
from trtpack.errors import UserInputError
from trtpack.model_io import ModelIO, TensorIO
from trtpack.serving.config import engine_model_config, write_config
from trtpack.serving.tokenizer_model import (
    TEMPLATES_DIR,
    TOKENIZER_FOLDER,
    prepare_tokenizer,
    sequence_range,
    tokenizer_config,
)
from trtpack.serving.triton_rules import batch_coverage_problem, triton_view
from trtpack.shapes import ShapeProfile, TensorSpec, parse_profile
from trtpack.sources.recipe import TritonSettings

NAMES = ("input_ids", "attention_mask")
SPECS = [TensorSpec(n, "int64", ("batch", "sequence"), kind)
         for n, kind in zip(NAMES, ("token_ids", "attention_mask"), strict=True)]
IO = ModelIO(tuple(TensorIO(n, "int64", (-1, -1), True) for n in NAMES),
             (TensorIO("last_hidden_state", "float32", (-1, -1, 384), True),))
FIELDS = {"input_ids": "ids", "attention_mask": "attention_mask"}


def profiles(*texts: str) -> list[ShapeProfile]:
    return [parse_profile(t, SPECS) for t in texts]


def shapes(batch: int, length: int) -> dict[str, tuple[int, ...]]:
    return {n: (batch, length) for n in NAMES}


def test_the_mirror_refuses_what_triton_refuses() -> None:
    """A profile whose min batch is above max_batch_size fails Triton's load: the old
    smallest-max rule did that to disjoint profiles (batch 8 < profile 1's min 16)."""
    disjoint = profiles("1x128:4x128:8x128", "16x128:32x128:64x128")
    config = engine_model_config("m", IO, disjoint, TritonSettings())
    config.max_batch_size = 8  # what a074f0b wrote: the smallest profile max
    view = triton_view(config, disjoint)
    assert not view.loads and "profile 1" in view.load_errors[0]


def test_disjoint_batch_ranges_are_refused_naming_the_rule() -> None:
    problem = batch_coverage_problem(profiles("1x128:4x128:8x128", "16x128:32x128:64x128"))
    assert problem is not None and "batch 9-15" in problem and "dynamic batcher" in problem
    assert batch_coverage_problem(profiles("1x8:4x32:8x128", "8x128:16x256:32x512")) is None


def test_build_refuses_disjoint_profiles_before_any_work() -> None:
    result = run_cli("build", "tiny-bert", "--random-weights", "--target", "g5", "--no-engine",
                     "--profile", "1x16:4x16:8x16", "--profile", "16x16:32x16:64x16")
    assert result.exit_code == 2, result.output
    assert "batch 9-15" in result.output and "dynamic batcher" in result.output


def test_lengths_served_only_at_some_batches_are_warned_about() -> None:
    """1x8:4x32:8x128 + 8x128:16x128:32x128: a batch of 9+ texts shorter than 128 tokens
    fits no profile; the build says so before any work (tensor serving)."""
    from trtpack.api import BuildRequest, resolve_options

    request = BuildRequest(model="tiny-bert", target="g5", build_engine=False,
                           random_weights=True,
                           profiles=("1x8:4x32:8x64", "8x64:16x64:32x64"))
    _, warnings = resolve_options(request)
    assert any("sequence lengths 8-63" in w and "max_batch_size 32" in w for w in warnings)
    covered = BuildRequest(model="tiny-bert", target="g5", build_engine=False,
                           random_weights=True,
                           profiles=("1x8:4x32:8x64", "8x8:16x64:32x64"))
    assert not any("sequence lengths" in w for w in resolve_options(covered)[1])


def test_overlapping_profiles_load_and_every_profile_serves_its_whole_range() -> None:
    """Both profiles load, each is chosen for its own opt shape, and every corner of every
    profile (the larger one's batch 32 too) is served."""
    ps = profiles("1x8:4x32:8x128", "8x128:16x256:32x512")
    config = engine_model_config("m", IO, ps, TritonSettings())
    view = triton_view(config, ps)
    assert view.loads, view.load_errors
    assert view.reachable_profiles() == {0, 1}
    for p in ps:
        for _, corner in p.corners():
            assert view.select_profile(dict(corner)) is not None, corner
    assert view.select_profile(shapes(32, 512)) == 1
    assert view.select_profile(shapes(1, 300)) is None  # no profile: the tokenizer must not


def test_preferred_batch_sizes_skip_one_and_are_served() -> None:
    """An opt batch of 1 as a preferred size makes the batcher send requests one at a time;
    every preferred size must be a batch some profile serves."""
    ps = profiles("1x8:1x32:8x128", "8x128:16x128:32x128")
    config = engine_model_config("m", IO, ps, TritonSettings())
    sizes = list(config.dynamic_batching.preferred_batch_size)
    assert 1 not in sizes and sizes == [16, 32]
    view = triton_view(config, ps)
    for size in sizes:
        assert view.select_profile(shapes(size, 128)) is not None, size


@pytest.fixture(scope="module")
def text_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[ShapeProfile]]:
    """The tokenizer model of a --serve text repository over two profiles of different
    sequence ranges (MiniLM's real tokenizer)."""
    ps = profiles("1x8:4x32:8x128", "8x128:16x256:32x512")
    dest = tmp_path_factory.mktemp("tok") / "tokenizer"
    info = prepare_tokenizer(minilm_dir(), dest / "1" / TOKENIZER_FOLDER)
    seq = sequence_range(FIELDS, ps, info.model_max_length)
    (dest / "1").mkdir(exist_ok=True)
    write_config(dest / "config.pbtxt",
                 tokenizer_config("tok", IO, FIELDS, ps, TritonSettings(), seq, info.pad_id))
    shutil.copyfile(TEMPLATES_DIR / "tokenizer.py", dest / "1" / "model.py")
    return dest, ps


def _encode(model_dir: Path, texts: list[str]) -> dict[str, object]:
    import numpy as np

    with python_model(model_dir) as model:
        return model.encode(np.array([t.encode() for t in texts], dtype=np.object_))


def test_tokenizer_pads_to_lengths_served_at_every_batch(
        text_model: tuple[Path, list[ShapeProfile]]) -> None:
    """A 300-token text became [1, 300] (no profile takes it); now every request is padded
    to a length that some profile serves at any batch the batcher can form, 1 to 32."""
    model_dir, ps = text_model
    config = engine_model_config("m", IO, ps, TritonSettings())
    view = triton_view(config, ps)
    long_text = " ".join(["word"] * 300)
    for texts in (["Yes."], [long_text], ["Yes.", long_text]):
        ids = _encode(model_dir, texts)["ids"]
        length = ids.shape[1]  # type: ignore[attr-defined]
        for batch in (1, 8, 9, 32):
            assert view.select_profile(shapes(batch, length)) is not None, (texts, batch)


def test_tokenizer_pads_texts_of_similar_length_alike(
        text_model: tuple[Path, list[ShapeProfile]]) -> None:
    """Requests of 6 and 9 tokens get one length, so the dynamic batcher can merge them."""
    model_dir, _ = text_model
    a = _encode(model_dir, ["Thank you very much!"])["ids"]
    b = _encode(model_dir, ["The box arrived late today, sadly."])["ids"]
    assert a.shape[1] == b.shape[1]  # type: ignore[attr-defined]


def test_padding_buckets_are_few_and_at_most_double() -> None:
    """One profile serves 8..128 at every batch: powers of two between, so padding at most
    doubles a text and requests fall into five shapes, not 121."""
    assert sequence_range(FIELDS, profiles("1x8:4x32:8x128")).buckets == (8, 16, 32, 64, 128)
    assert sequence_range(FIELDS, profiles("1x8:4x32:8x128", "8x128:16x256:32x512")
                          ).buckets == (128,)


def test_left_padding_pads_to_the_shortest_served_length() -> None:
    """Extra left padding moves the text's positions (absolute position embeddings change the
    outputs), so a left-padding tokenizer pads exactly, to any served length."""
    seq = sequence_range(FIELDS, profiles("1x8:4x32:8x128"))
    assert seq.padding_lengths("left") == list(range(8, 129))
    assert seq.padding_lengths("right") == [8, 16, 32, 64, 128]


def test_no_served_length_is_refused() -> None:
    """Profiles whose sequence ranges never share a length at every batch."""
    with pytest.raises(UserInputError, match="no sequence length"):
        sequence_range(FIELDS, profiles("1x8:4x32:8x64", "9x128:16x256:32x512"))


# --- issue 32, items C and E -----------------------------------------------------------------

def test_profiles_not_starting_at_batch_one_are_refused() -> None:
    """Item C. The dynamic batcher forms every batch from 1 to max_batch_size; with one
    context, tensorrt_backend (``src/instance_state.cc`` line 1842 at e2ef6d7:
    ``if (trt_contexts_.size() != 1)``) skips profile evaluation and a batch below the
    profile's min fails in ``SetBindingDimensions`` ("request specifies invalid shape for
    input", line 4293); with several, ``GetMostOptimizedProfile`` finds none ("failed to
    find any Optimization Profile"). So batches 1-7 of 8x128:16x128:32x128 are never
    served."""
    problem = batch_coverage_problem(profiles("8x128:16x128:32x128"))
    assert problem is not None and "batch 1-7" in problem
    assert "--profile 1x128:4x128:8x128" in problem
    # the suggested profile closes the gap
    assert batch_coverage_problem(profiles("1x128:4x128:8x128", "8x128:16x128:32x128")) is None
    assert batch_coverage_problem(profiles("2x128:4x128:8x128")) is not None
    # no batcher for an unbatched model (max_batch_size 0): its requests carry their shape
    assert batch_coverage_problem(profiles("8x128:16x128:32x128"), batched=False) is None


def test_build_refuses_a_profile_set_without_batch_one() -> None:
    """Item C, the Done-when line: exit 2 naming the uncovered batches and the profile to
    add, before any work (``--no-engine``: the check runs for every GPU target)."""
    result = run_cli("build", "tiny-bert", "--random-weights", "--target", "g5", "--no-engine",
                     "--profile", "8x128:16x128:32x128")
    assert result.exit_code == 2, result.output
    assert "batch 1-7" in result.output and "1x128:4x128:8x128" in result.output


def test_profile_selection_is_tritons_arithmetic_quirk_included() -> None:
    """Item E. tensorrt_backend ``EvaluateTensorRTContext`` (``src/instance_state.cc`` at
    e2ef6d7, lines 1908-1910 and 1977-1983): ``input_shape_vec[0] = total_batch_size`` and
    then ``error_distance += std::abs(opt_dims.d[0] - total_batch_size)`` and, for
    ``idx >= 1``, ``std::abs(opt_dims.d[idx] - input_shape_vec[idx - 1])``: the opt
    sequence length is compared with the batch. For the GPU workflow's profiles at batch
    8 x 128 both profiles hold the shape; Triton's sums are 0: |4-8| + |32-8| = 28 and
    1: |16-8| + |128-8| = 128, so it runs profile 0 (a true per-dimension distance, 100
    against 8, would say profile 1)."""
    ps = profiles("1x8:4x32:8x128", "8x8:16x128:32x128")
    view = triton_view(engine_model_config("m", IO, ps, TritonSettings()), ps)
    assert view.select_profile(shapes(8, 128)) == 0
    assert view.select_profile(shapes(9, 8)) == 1  # only profile 1 holds batch 9


def test_no_profile_listed_means_profile_zero_alone() -> None:
    """Item E, the default profile set: tensorrt_backend ``InitOptimizationProfiles``
    (``src/instance_state.cc`` at e2ef6d7: "No optimization profile is set for this
    TensorRT plan" -> ``profile_name_index.emplace_back("default", 0)``) and
    ``ModelState::GetProfileIndices`` (``src/model_state.cc``: "If not specified then use
    the default." -> ``profile_indices->insert(0)``): an instance group without ``profile``
    gets one context, for profile 0."""
    ps = profiles("1x8:4x32:8x128", "8x8:16x128:32x128")
    config = engine_model_config("m", IO, ps, TritonSettings())
    for group in config.instance_group:
        del group.profile[:]
    view = triton_view(config, ps)
    assert view.served[1] is None and view.served[0] is not None
    assert view.select_profile(shapes(16, 128)) is None
