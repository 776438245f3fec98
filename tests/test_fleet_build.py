"""``trtpack fleet build MANIFEST --target cpu``: every model of a small manifest (tiny-bert and
two small convolutional ONNX models) built through the real CLI into one Triton repository,
which parses with Triton's own schema and packs into one SageMaker bundle; a bad manifest is
one error line and exit 2; a failed or interrupted fleet build leaves no output folder."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli, sigint_as_default
from trtpack.testing.models import conv_onnx

CONV_PROFILE = "1x3x8x8:2x3x16x16:4x3x32x32"


def _manifest(folder: Path, *, third: str | None = None) -> Path:
    conv_onnx(folder / "conv-a.onnx", seed=1)
    conv_onnx(folder / "conv-b.onnx", channels=(8, 16), seed=2)
    third = third or f"{{source: {folder / 'conv-b.onnx'}, profiles: ['{CONV_PROFILE}']}}"
    path = folder / "fleet.yaml"
    path.write_text(
        "instance_types: [g5]\n"
        "models:\n"
        "  - {source: tiny-bert, random_weights: true, profiles: ['1x4:2x8:4x16']}\n"
        f"  - {{source: {folder / 'conv-a.onnx'}, profiles: ['{CONV_PROFILE}']}}\n"
        f"  - {third}\n")
    return path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> tuple[Path, str]:
    """The small manifest built once (two builds at once allowed), and its stderr; in the
    session cache (what a fleet build makes of its builds is the subject, not their stages:
    tiny-bert's are other tests' too)."""
    folder = tmp_path_factory.mktemp("fleet")
    result = run_cli("fleet", "build", str(_manifest(folder)), "--target", "cpu",
                     "--jobs", "2", "--out", str(folder / "out"),
                     "--cache-dir", str(cache_dir))
    assert result.exit_code == 0, result.output
    return folder / "out", result.stderr


def test_every_model_is_in_one_repository_triton_parses(fleet: tuple[Path, str]) -> None:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    out, _ = fleet
    repository = out / "model_repository"
    configs = {}
    for path in sorted(repository.glob("*/config.pbtxt")):
        config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
        configs[config.name] = config
        assert config.name == path.parent.name
    assert {"tiny-bert", "conv-a", "conv-b"} <= set(configs)
    for name in ("tiny-bert", "conv-a", "conv-b"):  # each one's ONNX, for ONNX Runtime
        assert configs[name].platform == "onnxruntime_onnx"
        assert (repository / name / "1" / "model.onnx").is_file()
    record = json.loads((out / "fleet.json").read_text())
    assert [m["name"] for m in record["models"]] == ["tiny-bert", "conv-a", "conv-b"]
    assert all(m["memory_estimate"] > 0 for m in record["models"])
    for name in ("tiny-bert", "conv-a", "conv-b"):  # each build's own report is kept
        assert json.loads((out / "builds" / name / "report.json").read_text())["model"] == name
    # the served ONNX is the build's: conv-b has 16 output features, conv-a 32
    assert configs["conv-b"].output[0].dims[-1] == 16
    assert configs["conv-a"].output[0].dims[-1] == 32


def test_progress_lines_say_each_build_and_the_assembly(fleet: tuple[Path, str]) -> None:
    _, stderr = fleet
    lines = [line for line in stderr.splitlines() if line.startswith("fleet: ")]
    for name in ("tiny-bert", "conv-a", "conv-b"):
        assert any(line.startswith(f"fleet: building {name} (estimate ") for line in lines)
        assert any(line.startswith(f"fleet: built {name} in ") for line in lines)
    assert lines[-1] == "fleet: assembling 3 model(s) into one repository"


def test_one_sagemaker_bundle_holds_every_model(fleet: tuple[Path, str],
                                                tmp_path: Path) -> None:
    out, _ = fleet
    dest = tmp_path / "sagemaker"
    result = run_cli("package", str(out), "--sagemaker", "--dest", str(dest))
    assert result.exit_code == 0, result.output
    packed = set()
    for archive in dest.glob("*.tar.gz"):
        with tarfile.open(archive) as tar:
            packed |= {n.split("/")[0] for n in tar.getnames()}
    served = {p.parent.name for p in (out / "model_repository").glob("*/config.pbtxt")}
    assert packed == served
    assert (dest / "SAGEMAKER.md").is_file()


def test_a_bad_model_in_the_manifest_is_one_error_line_and_nothing_written(
        tmp_path: Path) -> None:
    manifest = _manifest(tmp_path, third="{source: no-such-recipe}")
    result = run_cli("fleet", "build", str(manifest), "--target", "cpu",
                     "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"))
    assert result.exit_code == 2, result.output
    assert result.stderr.count("error:") == 1
    assert "model 'no-such-recipe'" in result.stderr
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.fleet-*"))


def test_two_models_serving_one_name_are_refused(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path, third=f"{{name: again, source: {tmp_path / 'conv-a.onnx'}, "
                                         f"profiles: ['{CONV_PROFILE}']}}")
    result = run_cli("fleet", "build", str(manifest), "--target", "cpu", "--jobs", "1",
                     "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache"))
    assert result.exit_code == 2, result.output
    assert result.stderr.count("error:") == 1
    assert "models 'conv-a' and 'again' are both served as 'conv-a'" in result.stderr
    assert not (tmp_path / "cache").exists()  # refused before any build
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.fleet-*"))


def test_an_interrupted_fleet_build_leaves_no_repository(tmp_path: Path) -> None:
    manifest = _manifest(tmp_path)
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "trtpack.cli", "fleet", "build", str(manifest), "--target",
         "cpu", "--jobs", "1", "--out", str(out), "--cache-dir", str(tmp_path / "cache")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=sigint_as_default)
    assert process.stderr is not None
    for line in process.stderr:  # the first build is running
        if line.startswith("fleet: building "):
            break
    time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert not out.exists()
    assert not list(tmp_path.glob(".out.fleet-*"))
    # and no build it started runs on
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            assert str(out) not in (proc / "cmdline").read_bytes().decode(errors="replace")
