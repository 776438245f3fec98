"""A newcomer's mistakes, each through the real CLI in a process of its own (issue 34): one
``error:`` line (and a ``hint:``), the documented exit code, no traceback; a reader that
leaves (``trtpack ... | head``) ends the command quietly with exit 141."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, trtpack

TINY = ["build", "tiny-bert", "--target", "cpu"]


def one_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The one error line of a command that failed with ``code``; nothing after it but its
    hint, and no traceback."""
    assert result.returncode == code, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "│" not in result.stderr, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    errors = [i for i, line in enumerate(lines) if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    after = lines[errors[0] + 1:]
    assert all(line.startswith(("hint:", "report and logs:")) for line in after), after
    return "\n".join(lines[errors[0]:])


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny-bert CPU build (random weights, seconds) for the commands that read one."""
    folder = tmp_path_factory.mktemp("tiny")
    result = trtpack(*TINY, "--out", str(folder / "out"), "--cache-dir", str(folder / "cache"))
    assert result.returncode == 0, result.stderr[-3000:]
    return folder


# --- item 1: what was a traceback with exit 1 -------------------------------------------

def test_out_under_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "outfile").write_text("mine")
    error = one_error(trtpack(*TINY, "--out", str(tmp_path / "outfile" / "sub"),
                              "--cache-dir", str(tmp_path / "cache"), usage_error=True), 2)
    assert f"'{tmp_path / 'outfile'}' is a file, not a folder" in error
    assert (tmp_path / "outfile").read_text() == "mine"


def test_out_where_nothing_can_be_written_is_one_line(tmp_path: Path) -> None:
    # /proc takes no new files, even from root
    error = one_error(trtpack(*TINY, "--out", "/proc/x", "--cache-dir", str(tmp_path),
                              usage_error=True), 2)
    assert "--out '/proc/x': cannot write there" in error and "hint:" in error


def test_package_dest_that_is_a_file_is_one_line(tiny_build: Path, tmp_path: Path) -> None:
    dest = tmp_path / "archive"
    dest.write_text("mine")
    error = one_error(trtpack("package", str(tiny_build / "out"), "--format", "sagemaker",
                              "--dest", str(dest), usage_error=True), 2)
    assert f"--dest '{dest}': '{dest}' is a file, not a folder" in error
    assert dest.read_text() == "mine"
    # the format word is read as build's choices are, case-insensitively
    written = trtpack("package", str(tiny_build / "out"), "--format", "SageMaker",
                      "--dest", str(tmp_path / "archives"))
    assert written.returncode == 0, written.stderr
    assert (tmp_path / "archives" / "tiny-bert.tar.gz").is_file()


def closed_pipe_run(*args: str) -> subprocess.CompletedProcess[str]:
    """``trtpack ARGS | head`` with the reader already gone: every write to stdout fails."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "trtpack.cli", *args], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=300, check=False,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        os.close(write_end)


@pytest.mark.parametrize("words", [["recipes", "list"], ["--help"], ["build", "--help"],
                                   ["--version"]], ids=" ".join)
def test_a_broken_pipe_ends_quietly_with_141(words: list[str]) -> None:
    result = closed_pipe_run(*words)
    assert result.returncode == 141, result.stderr
    assert result.stderr == ""


def test_a_build_piped_to_head_is_built_and_ends_with_141(tiny_build: Path) -> None:
    result = closed_pipe_run(*TINY, "--out", str(tiny_build / "piped"),
                             "--cache-dir", str(tiny_build / "cache"))
    assert result.returncode == 141, result.stderr[-3000:]
    assert "error" not in result.stderr and "Traceback" not in result.stderr
    assert json.loads((tiny_build / "piped" / "report.json").read_text())["status"] == "ok"


# --- item 7: the small messages ---------------------------------------------------------

def test_calibration_folder_is_said_to_be_a_folder(tmp_path: Path) -> None:
    error = one_error(trtpack(*TINY, "--precision", "int8", "--calibration", str(tmp_path),
                              "--out", str(tmp_path / "out"), usage_error=True), 2)
    assert "is a folder; give a file" in error and "does not exist" not in error


@pytest.mark.parametrize("target", [["--target", "cpu"], ["--target", "g5", "--no-engine"]])
def test_calibration_token_ids_past_the_vocabulary_are_bad_input(
        tiny_build: Path, tmp_path: Path, target: list[str]) -> None:
    """Was exit 4 with ONNX Runtime's Gather message (or, on the CPU, a build that never
    read the file): tiny-bert's embedding table has 1000 rows."""
    import numpy as np

    ids = np.random.default_rng(0).integers(0, 1000, size=(8, 16))
    ids[3, 5] = 4_836_156
    npz = tmp_path / "calibration.npz"
    np.savez(npz, input_ids=ids, attention_mask=np.ones_like(ids),
             token_type_ids=np.zeros_like(ids))
    error = one_error(trtpack("build", "tiny-bert", *target, "--precision", "int8",
                              "--calibration", str(npz), "--out", str(tmp_path / "out"),
                              "--cache-dir", str(tiny_build / "cache"), usage_error=True), 2)
    assert "'input_ids' holds token id 4836156, outside the vocabulary [0, 1000)" in error
    assert not (tmp_path / "out").exists()


def test_a_missing_path_is_not_an_unknown_model(tmp_path: Path) -> None:
    error = one_error(trtpack("build", "/nonexistent/dir/", "--target", "cpu", usage_error=True), 2)
    assert "'/nonexistent/dir/' does not exist" in error and "unknown model" not in error
    missing = tmp_path / "models" / "bert"
    error = one_error(trtpack("build", f"{missing}/", "--target", "cpu", usage_error=True), 2)
    assert f"hint: '{tmp_path}' exists" in error


def test_a_misspelt_set_key_names_the_close_one(tmp_path: Path) -> None:
    error = one_error(trtpack(*TINY, "--set", "triton.instance_cnt=2",
                              "--out", str(tmp_path / "out"), usage_error=True), 2)
    assert "did you mean triton.instance_count?" in error


def test_an_empty_recipe_is_said_to_be_empty(tmp_path: Path) -> None:
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("# nothing yet\n")
    error = one_error(trtpack("build", str(recipe), "--target", "cpu", usage_error=True), 2)
    assert "is empty" in error and "NoneType" not in error
    assert "trtpack recipes show minilm" in error


def test_hidden_size_not_divisible_by_the_heads_is_bad_input(tmp_path: Path) -> None:
    text = (ROOT / "trtpack" / "recipes" / "tiny-bert.yaml").read_text()
    assert "hidden_size: 64" in text
    recipe = tmp_path / "odd.yaml"
    recipe.write_text(text.replace("hidden_size: 64", "hidden_size: 65"))
    error = one_error(trtpack("build", str(recipe), "--target", "cpu",
                              "--out", str(tmp_path / "out"), usage_error=True), 2)
    assert "config.hidden_size 65 is not a multiple of config.num_attention_heads 4" in error
    assert not (tmp_path / "out.failed").exists()  # refused before any stage


def test_choice_words_are_read_case_insensitively(tiny_build: Path) -> None:
    # --target CPU was accepted; --precision FP16 and --serve TENSOR now are too
    result = trtpack(*TINY[:2], "--target", "CPU", "--precision", "FP32", "--serve", "TENSOR",
                     "--fallback", "Off", "--out", str(tiny_build / "upper"),
                     "--cache-dir", str(tiny_build / "cache"), "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["precision"] == "fp32"
    error = one_error(trtpack(*TINY, "--precision", "fp64", usage_error=True), 2)
    assert "--precision must be fp32, fp16, int8 or auto, not 'fp64'" in error


def test_serve_text_without_a_tokenizer_suggests_tokenizer(tmp_path: Path) -> None:
    error = one_error(trtpack(*TINY, "--serve", "text", "--out", str(tmp_path / "out"),
                              usage_error=True), 2)
    assert "--tokenizer" in error and "--serve tensor" in error


def test_a_jsonl_calibration_file_is_read_by_its_text_field(tmp_path: Path) -> None:
    from trtpack.errors import UserInputError
    from trtpack.precision.calibration.files import read_text_samples

    good = tmp_path / "cal.jsonl"
    good.write_text('{"text": "hello world", "label": 1}\n\n{"text": "another line"}\n')
    assert read_text_samples(good) == ["hello world", "another line"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"sentence": "no text field"}\n')
    with pytest.raises(UserInputError, match=r'line 2: no "text" string field \(found: sentence'):
        read_text_samples(bad)
    # through the CLI: the file is checked before any stage (minilm has a tokenizer)
    error = one_error(trtpack("build", "minilm", "--target", "cpu", "--precision", "int8",
                              "--calibration", str(bad), "--out", str(tmp_path / "out"),
                              usage_error=True), 2)
    assert 'line 2: no "text" string field' in error


def test_cache_commands_refuse_a_file_or_a_missing_cache_dir(tmp_path: Path) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    error = one_error(trtpack("cache", "info", "--cache-dir", str(a_file), usage_error=True), 2)
    assert "is a file, not a stage cache folder" in error
    error = one_error(trtpack("cache", "verify", "--cache-dir", str(tmp_path / "missing"),
                              usage_error=True), 2)
    assert "does not exist" in error
    assert not (tmp_path / "missing").exists()


def test_cache_prune_without_an_age_needs_yes(tiny_build: Path) -> None:
    cache = tiny_build / "cache"
    stages = cache / "stages"
    before = sorted(p.name for p in stages.iterdir())
    assert before
    error = one_error(trtpack("cache", "prune", "--cache-dir", str(cache), usage_error=True), 2)
    assert "add --yes" in error and "--older-than" in error
    assert sorted(p.name for p in stages.iterdir()) == before  # nothing deleted


def test_sagemaker_note_names_the_other_shared_models() -> None:
    from trtpack.serving.sagemaker_note import container_section

    one = container_section(None, {"tok": ["a_ensemble", "b_ensemble"]}, False, True, False)
    assert "`tok` is in a_ensemble and b_ensemble;" in one and "other model" not in one
    three = container_section(None, {"tok": ["a", "b"], "post": ["a", "b"], "x": ["a", "c"]},
                              False, True, False)
    assert "(so are `post` and `x`)" in three
