"""The fleet manifest and its job matrix (``trtpack fleet plan``): the matrix gpu.yml's fleet
job runs, validated as a workflow with the plan in its ``fromJSON`` slot."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, run_cli

MANIFEST = ROOT / "fleet.yaml"
GPU_WORKFLOW = ROOT / ".github" / "workflows" / "gpu.yml"
SLOT = "${{ fromJSON(needs.fleet-plan.outputs.matrix) }}"


def _plan(manifest: Path) -> dict:
    result = run_cli("fleet", "plan", str(manifest))
    assert result.exit_code == 0, result.output
    assert len(result.stdout.splitlines()) == 1  # one line: a step output
    return json.loads(result.stdout)


def _validated_with_plan(plan: dict, tmp_path: Path) -> list[dict]:
    """gpu.yml with ``plan`` in its ``fromJSON`` slot, validated as a GitHub workflow by
    check-jsonschema; the engine jobs' matrix entries."""
    text = GPU_WORKFLOW.read_text()
    assert text.count(SLOT) == 1
    planned = tmp_path / "gpu.yml"
    planned.write_text(text.replace(SLOT, json.dumps(plan)))  # JSON is YAML
    checker = shutil.which("check-jsonschema") or str(
        Path(ROOT / ".venv" / "bin" / "check-jsonschema"))
    if not Path(checker).is_file():
        pytest.skip("check-jsonschema (the dev extras) is not installed")
    done = subprocess.run([checker, "--builtin-schema", "vendor.github-workflows",
                           str(planned)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    jobs: list[dict] = yaml.safe_load(planned.read_text())["jobs"]["engines"]["strategy"][
        "matrix"]["include"]
    return jobs


def test_the_plan_is_the_matrix_gpu_yml_runs(tmp_path: Path) -> None:
    manifest = yaml.safe_load(MANIFEST.read_text())
    jobs = _validated_with_plan(_plan(MANIFEST), tmp_path)
    pairs = {(j["model"], j["instance_type"]) for j in jobs}
    names = [m.get("name") or m["source"] for m in manifest["models"]]
    assert len(names) == 3
    assert pairs == {(n, t) for n in names for t in manifest["instance_types"]}
    assert len(jobs) == 3 * len(manifest["instance_types"])
    for job in jobs:  # its convert (a --no-engine build) and engine commands
        assert job["convert"].startswith("trtpack build ") and "--no-engine" in job["convert"]
        assert job["engine"].startswith(f"trtpack engine onnx/{job['model']} --target "
                                        f"{job['instance_type']} ")
    # the GPU tests run once per family: on its first job
    assert sorted(j["instance_type"] for j in jobs if j["gpu_tests"]) == \
        sorted(manifest["instance_types"])


def test_three_models_on_three_families_in_gpu_yml(tmp_path: Path) -> None:
    """The issue's line: three models x three families, the plan in gpu.yml's slot, every
    pair found; g4dn, g5 and p4d differ in compute capability: one fleet repository."""
    path = tmp_path / "three.yaml"
    path.write_text("instance_types: [g4dn, g5, p4d]\nmodels:\n"
                    "  - {source: tiny-bert, random_weights: true}\n  - minilm\n"
                    "  - {name: bert-base-fp16, source: bert-base, precision: fp16}\n")
    jobs = _validated_with_plan(_plan(path), tmp_path)
    assert {(j["model"], j["instance_type"]) for j in jobs} == {
        (m, t) for m in ("tiny-bert", "minilm", "bert-base-fp16")
        for t in ("g4dn", "g5", "p4d")}
    assert {j["repository"] for j in jobs} == {1}


def test_gpu_models_sharing_a_compute_capability_get_repositories_of_their_own(
        tmp_path: Path) -> None:
    """g6 (L4) and g6e (L40S) share 8.9; p5en has p5e's H200: the layout rule of the GPU
    path (``machine.targets.fleet_repositories``)."""
    path = _manifest(tmp_path, "instance_types: [g6, g6e, p5e, p5en]\nmodels: [tiny-bert]\n")
    repositories = {j["instance_type"]: j["repository"] for j in _plan(path)["include"]}
    assert repositories == {"g6": 1, "g6e": 2, "p5e": 1, "p5en": 0}


def _manifest(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


def test_over_256_jobs_is_refused_in_one_line(tmp_path: Path) -> None:
    models = "\n".join(f"  - {{name: m{n}, source: tiny-bert}}" for n in range(86))
    path = _manifest(tmp_path, f"instance_types: [g4dn, g5, p4d]\nmodels:\n{models}\n")
    result = run_cli("fleet", "plan", str(path))
    assert result.exit_code == 2
    assert result.stderr.count("error:") == 1 and "258 jobs" in result.stderr
    assert "256" in result.stderr


@pytest.mark.parametrize(("text", "says"), [
    ("instance_types: [g5]\nmodels: []\n", "needs a 'models' list"),
    ("instance_types: [z9]\nmodels: [tiny-bert]\n", "unknown target 'z9'"),
    ("instance_types: [cpu]\nmodels: [tiny-bert]\n", "not a GPU family"),
    ("instance_types: [g5]\nmodels: [tiny-bert, tiny-bert]\n", "two models are named"),
    ("instance_types: [g5]\nmodels: [{source: tiny-bert, precision: fp8}]\n", "fp8"),
    ("instance_types: [g5]\nmodels: [{source: tiny-bert, batch: 4}]\n", "unknown key 'batch'"),
    ("models: [tiny-bert]\n", "no instance types"),
    ("models: [\n", "not readable YAML"),
])
def test_a_bad_manifest_is_one_error_line(tmp_path: Path, text: str, says: str) -> None:
    result = run_cli("fleet", "plan", str(_manifest(tmp_path, text)))
    assert result.exit_code == 2, result.output
    assert result.stderr.count("error:") == 1 and says in result.stderr, result.stderr


def test_a_model_may_have_its_own_instance_types(tmp_path: Path) -> None:
    path = _manifest(tmp_path, "instance_types: [g5, p4d]\nmodels:\n  - tiny-bert\n"
                               "  - {source: model.onnx, instance_types: [g4dn.xlarge]}\n")
    pairs = {(j["model"], j["instance_type"]) for j in _plan(path)["include"]}
    assert pairs == {("tiny-bert", "g5"), ("tiny-bert", "p4d"), ("model", "g4dn")}
