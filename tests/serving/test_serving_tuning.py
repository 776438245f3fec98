"""The tuning hand-off: perf_analyzer runs with the profiles' shapes and a Model Analyzer
config, written beside the repository."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

from trtpack.serving.layout import ModelRepository


def _tuning(repo: ModelRepository) -> Path:
    return repo.root.parent / "tuning"


def test_tuning_files_are_written_outside_the_repository(minilm_text_repo: ModelRepository
                                                         ) -> None:
    assert sorted(p.name for p in _tuning(minilm_text_repo).iterdir()) == [
        "README.md", "model_analyzer.yaml", "perf_analyzer.sh", "perf_text_inputs.json"]
    assert all(not p.is_relative_to(minilm_text_repo.root)
               for p in minilm_text_repo.tuning_files)


def test_perf_analyzer_script_runs_with_the_profile_shapes(minilm_text_repo: ModelRepository,
                                                          tmp_path: Path) -> None:
    """Run the script with a perf_analyzer stand-in on PATH that records its arguments."""
    fake = tmp_path / "bin" / "perf_analyzer"
    fake.parent.mkdir()
    log = tmp_path / "calls.txt"
    fake.write_text(f'#!/usr/bin/env bash\necho "$*" >> {log}\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}",
           "TRITON_URL": "127.0.0.1:18001"}
    script = _tuning(minilm_text_repo) / "perf_analyzer.sh"
    subprocess.run(["bash", str(script)], env=env, check=True, timeout=30)
    calls = log.read_text().splitlines()
    # profile 1x8:4x32:8x128: opt (batch 4, seq 32) and max (batch 8, seq 128), + the ensemble
    assert calls[0].startswith("-m minilm -i grpc -u 127.0.0.1:18001 -b 4 --shape input_ids:32")
    assert "--input-data zero" in calls[0]
    assert "-b 8 --shape input_ids:128 --shape attention_mask:128" in calls[1]
    assert calls[2].startswith("-m minilm_ensemble") and "-b 4" in calls[2]
    data = calls[2].split("--input-data ")[1].split()[0]
    assert Path(data).is_file()
    assert len(calls) == 3


def test_model_analyzer_config(minilm_text_repo: ModelRepository) -> None:
    text = (_tuning(minilm_text_repo) / "model_analyzer.yaml").read_text()
    config = yaml.safe_load(text)
    assert config["model_repository"] == "../model_repository"  # run from the tuning folder
    model = config["profile_models"]["minilm"]
    assert model["perf_analyzer_flags"]["shape"] == [
        "input_ids:32", "attention_mask:32", "token_type_ids:32"]
    assert model["model_config_parameters"]["max_batch_size"] == [8]
    assert model["model_config_parameters"]["instance_group"][0]["kind"] == "KIND_CPU"
    assert config["batch_sizes"] == [1, 4, 8]


def test_repository_ref_names_the_final_repository(minilm_text_repo: ModelRepository,
                                                   tmp_path: Path) -> None:
    from trtpack.serving.tuning import write_tuning_files
    from trtpack.shapes import parse_profiles
    from trtpack.sources.recipe_files import RECIPES_DIR, load_recipe_file

    recipe = load_recipe_file(RECIPES_DIR / "minilm.yaml")
    profiles = parse_profiles(recipe.profiles, recipe.input_specs())
    write_tuning_files(tmp_path / ".tuning.tmp", minilm_text_repo, profiles, recipe.triton,
                       repository_ref="../model_repository")
    config = yaml.safe_load((tmp_path / ".tuning.tmp" / "model_analyzer.yaml").read_text())
    assert config["model_repository"] == "../model_repository"
    assert "$PWD/../model_repository" in (tmp_path / ".tuning.tmp" / "README.md").read_text()
