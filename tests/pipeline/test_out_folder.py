"""``--out`` never deletes what trtpack did not write: a user's folder is refused (exit 2)
or, with ``--force``, built beside; a rebuild replaces exactly trtpack's earlier files (the
build's and what ``package`` added) and says so in one line; a user's own ``OUT.failed``
survives; stale ``.OUT.partial-PID``/``.OUT.old-PID`` folders of dead builds are swept."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import CliResult, run_cli
from trtpack.out_files import MANIFEST, manifest_files

BUILD = ("build", "tiny-bert", "--random-weights", "--target", "cpu",
         "--profile", "1x4:2x8:4x16")


def build(out: Path, cache: Path, *extra: str) -> CliResult:
    return run_cli(*BUILD, "--out", str(out), "--cache-dir", str(cache), *extra)


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_a_users_folder_is_refused_and_with_force_built_beside(tmp_path: Path,
                                                               cache_dir: Path) -> None:
    out = tmp_path / "mydir"
    (out / "notes").mkdir(parents=True)
    (out / "keep.txt").write_text("important")
    (out / "notes" / "n.md").write_text("mine")
    refused = build(out, cache_dir)
    assert refused.exit_code == 2, refused.output
    assert len(lines(refused.stderr)) == 1, refused.stderr
    assert "not a trtpack build" in refused.stderr and "--force" in refused.stderr
    assert sorted(p.name for p in out.rglob("*")) == ["keep.txt", "n.md", "notes"]
    assert [p.name for p in tmp_path.iterdir()] == ["mydir"]  # nothing beside it either

    forced = build(out, cache_dir, "--force")
    assert forced.exit_code == 0, forced.output
    assert (out / "keep.txt").read_text() == "important"
    assert (out / "notes" / "n.md").read_text() == "mine"
    assert (out / "model_repository" / "tiny-bert" / "config.pbtxt").is_file()
    ours = manifest_files(out)
    assert ours is not None and "keep.txt" not in ours and "notes/n.md" not in ours
    assert "model_repository/tiny-bert/config.pbtxt" in ours

    # now a trtpack build (with the user's files in it): a rebuild needs no --force
    again = build(out, cache_dir)
    assert again.exit_code == 0, again.output
    assert (out / "keep.txt").read_text() == "important"
    assert (out / "notes" / "n.md").read_text() == "mine"
    assert "kept 2 files trtpack did not write" in again.stderr


def test_a_rebuild_replaces_trtpacks_files_names_them_and_keeps_the_users(
        tmp_path: Path, cache_dir: Path) -> None:
    out = tmp_path / "out"
    assert build(out, cache_dir).exit_code == 0
    packaged = run_cli("package", str(out), "--sagemaker")
    assert packaged.exit_code == 0, packaged.output
    assert (out / "sagemaker" / "tiny-bert.tar.gz").is_file()
    assert "sagemaker/tiny-bert.tar.gz" in (manifest_files(out) or [])
    (out / "my-notes.txt").write_text("user's")
    (out / "model_repository" / "README.user").write_text("user's too")

    rebuilt = build(out, cache_dir)
    assert rebuilt.exit_code == 0, rebuilt.output
    replaced = [line for line in rebuilt.stderr.splitlines() if "replaced" in line]
    assert len(replaced) == 1, rebuilt.stderr
    assert f"replaced the earlier build in {out.resolve()}" in replaced[0]
    assert "sagemaker/" in replaced[0] and "model_repository/" in replaced[0]
    assert "kept 2 files trtpack did not write" in replaced[0]
    assert not (out / "sagemaker").exists()  # package's files were trtpack's: replaced
    assert (out / "my-notes.txt").read_text() == "user's"
    assert (out / "model_repository" / "README.user").read_text() == "user's too"
    assert json.loads((out / "report.json").read_text())["status"] == "ok"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_users_out_failed_folder_survives_a_build(tmp_path: Path, cache_dir: Path) -> None:
    out = tmp_path / "out"
    theirs = tmp_path / "out.failed"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("not trtpack's")
    assert build(out, cache_dir).exit_code == 0
    assert (theirs / "notes.txt").read_text() == "not trtpack's"
    # trtpack's own OUT.failed (its manifest says so) goes when a build succeeds
    (theirs / "notes.txt").unlink()
    theirs.rmdir()
    ours = tmp_path / "out.failed"
    ours.mkdir()
    (ours / "report.json").write_text("{}")
    (ours / MANIFEST).write_text(json.dumps({"files": ["report.json"]}))
    assert build(out, cache_dir).exit_code == 0
    assert not ours.exists()


def test_stale_folders_of_dead_builds_are_swept(tmp_path: Path, cache_dir: Path) -> None:
    out = tmp_path / "out"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    pid = int(dead.stdout)  # a process that has exited: its pid is (almost surely) free
    for kind in ("partial", "old"):
        (tmp_path / f".out.{kind}-{pid}" / "artifacts").mkdir(parents=True)
    assert build(out, cache_dir).exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], list(tmp_path.iterdir())


def test_an_onnx_from_a_build_folder_builds(tmp_path: Path, cache_dir: Path) -> None:
    """Its weights are hard links into the stage cache, which onnx's checker refuses."""
    first = tmp_path / "first"
    assert build(first, cache_dir).exit_code == 0
    artifact = first / "artifacts" / "export" / "model.onnx"
    assert Path(str(artifact) + ".data").stat().st_nlink > 1
    result = run_cli("build", str(artifact), "--target", "cpu", "--profile", "1x4:2x8:4x16",
                     "--out", str(tmp_path / "second"), "--cache-dir", str(cache_dir))
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "second" / "report.json").read_text())
    assert report["status"] == "ok"
    assert all(r["passed"] for r in report["verification"])


def test_a_build_made_before_manifests_is_rebuilt_keeping_the_users_files(
        tmp_path: Path, cache_dir: Path) -> None:
    """A build folder from a trtpack without manifests: its report.json says trtpack wrote
    it, so the files under the names such builds wrote are trtpack's; the rest stay."""
    out = tmp_path / "out"
    (out / "artifacts" / "export").mkdir(parents=True)
    (out / "artifacts" / "export" / "model.onnx").write_bytes(b"an old export")
    (out / "report.json").write_text(json.dumps({"versions": {"trtpack": "0.1.0"},
                                                 "stages": [], "status": "ok"}))
    (out / "keep.txt").write_text("mine")
    result = build(out, cache_dir)
    assert result.exit_code == 0, result.output
    assert "replaced the earlier build" in result.stderr
    assert (out / "keep.txt").read_text() == "mine"
    assert (out / "artifacts" / "export" / "model.onnx").read_bytes() != b"an old export"
    assert json.loads((out / "report.json").read_text())["status"] == "ok"
