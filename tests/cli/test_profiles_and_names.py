"""What a newcomer typed (issue 46): a profile of one shape, a profile given twice, a
``--cache-dir`` that does not exist yet, a misspelt model name."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import trtpack

BUILD = ("build", "tiny-bert", "--random-weights", "--target", "cpu", "--precision", "fp32")


def _error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.strip()]


def test_a_profile_given_twice_is_refused(tmp_path: Path) -> None:
    for second in ("1x4:2x8:4x16", "input_ids=1x4:2x8:4x16"):
        done = trtpack(*BUILD, "--profile", "1x4:2x8:4x16", "--profile", second,
                       "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "c"))
        assert done.returncode == 2, done.stderr
        lines = _error_lines(done.stderr)
        assert len(lines) == 1 and lines[0].startswith("error: profile "), lines
        assert "must be a different shape range" in lines[0]
        assert not (tmp_path / "out").exists() and not (tmp_path / "c").exists()


def test_one_shape_is_static_with_a_note_and_a_new_cache_says_so(tmp_path: Path) -> None:
    cache = tmp_path / "typo-cache"
    done = trtpack(*BUILD, "--profile", "1x8", "--out", str(tmp_path / "out"),
                   "--cache-dir", str(cache))
    assert done.returncode == 0, done.stdout + done.stderr
    text = " ".join((done.stdout + done.stderr).split())
    assert "--profile 1x8 is one shape (min = opt = max)" in text
    assert "max_batch_size 1" in text
    assert text.count("a new empty cache") == 1
    config = (tmp_path / "out/model_repository/tiny-bert/config.pbtxt").read_text()
    assert "max_batch_size: 1" in config
    assert cache.is_dir()
    again = trtpack(*BUILD, "--profile", "1x8", "--out", str(tmp_path / "out"),
                    "--cache-dir", str(cache))
    assert again.returncode == 0 and "new empty cache" not in again.stdout + again.stderr


def test_a_misspelt_model_name_gets_a_did_you_mean() -> None:
    for typed, meant in (("minlm", "minilm"), ("resnet50", "resnet-50"), ("tiny_bert",
                                                                          "tiny-bert")):
        done = trtpack("build", typed, "--target", "cpu", usage_error=True)
        assert done.returncode == 2
        lines = _error_lines(done.stderr)
        assert lines[0].startswith(f"error: unknown model '{typed}'"), lines
        assert lines[-1] == f"hint: did you mean '{meant}'?", lines
    far = trtpack("build", "qwertyuiop", "--target", "cpu", usage_error=True)
    assert far.returncode == 2 and "did you mean" not in far.stderr


FACTORY = '''
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)

    def forward(self, image):
        return self.conv(image).mean((2, 3))


def make():
    return Net()
'''


def test_an_undescribed_conv_input_gets_a_conv_shaped_hint(tmp_path: Path) -> None:
    factory = tmp_path / "conv_factory.py"
    factory.write_text(FACTORY)
    done = trtpack("build", f"{factory}:make", "--target", "cpu", "--out",
                   str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"))
    assert done.returncode == 2, done.stdout + done.stderr
    text = " ".join(done.stderr.split())
    assert "--input image=float32[batch,3,224,224]" in text, text
    assert "float32[batch,16]" not in text


def test_inspect_names_onnx_files_and_reads_a_failed_build(tmp_path: Path) -> None:
    helped = trtpack("inspect", "--help", env={"COLUMNS": "200"})
    assert "an ONNX file" in helped.stdout, helped.stdout
    failed = tmp_path / "out.failed"
    (failed / "logs").mkdir(parents=True)
    (failed / "report.json").write_text("{}")
    done = trtpack("inspect", str(failed))
    assert done.returncode == 0, done.stderr
    assert "a trtpack build folder" in " ".join(done.stdout.split())


def test_the_repository_view_names_dynamic_dims(tiny_build: Path, tmp_path: Path) -> None:
    """``inspect`` of a repository names each dynamic dimension as the ONNX view does
    (``[batch, sequence]``, not ``[batch, -1]``): from the served ONNX, else from the build's
    recipe (a repository whose version holds no ONNX, as a TensorRT plan's does not)."""
    import shutil

    def inspected(path: Path) -> str:
        done = trtpack("inspect", str(path), env={"COLUMNS": "200"})
        assert done.returncode == 0, done.stderr
        return done.stdout

    onnx_view = inspected(next((tiny_build / "artifacts").glob("*/model.onnx")))
    assert "[batch, sequence]" in onnx_view, onnx_view
    def unnamed(text: str) -> bool:  # a shape holding a bare -1
        import re

        return re.search(r"\[[^\]]*\b-1\b[^\]]*\]", text) is not None

    shown = inspected(tiny_build / "model_repository")
    assert "[batch, sequence]" in shown and not unnamed(shown), shown
    copy = tmp_path / "out"
    shutil.copytree(tiny_build / "model_repository", copy / "model_repository")
    shutil.copy(tiny_build / "recipe.yaml", copy / "recipe.yaml")
    for served in (copy / "model_repository").glob("*/1/model.onnx"):
        served.unlink()
    from_recipe = inspected(copy / "model_repository")
    assert "[batch, sequence]" in from_recipe and not unnamed(from_recipe), from_recipe
    (copy / "recipe.yaml").unlink()  # nothing names them: the config's -1 stays
    assert "[batch, -1]" in inspected(copy / "model_repository")
