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


def _model_analyzer_variants(base: dict, params: dict) -> list[dict]:
    """Model Analyzer's manual sweep of ``model_config_parameters``, mirrored for the fields
    trtpack writes (model_analyzer at 63a0fecc, 2026-04-28): every field is a
    ``ConfigSweep`` (``config/input/config_sweep.py``) that first tries the value as ONE
    value of the protobuf field's type and only then as a list of choices, so ``count:
    [1, 2, 3]`` (an int field) is swept while ``profile: ["0", "1"]`` (a repeated string
    field) is one value; ``GeneratorUtils.generate_combinations`` takes the product; and
    ``BaseModelConfigGenerator._apply_value_to_dict`` replaces a field whose new value is
    not a dict whole ("If the key already exists in the dict and both ... are dicts, only
    overwrite the subkeys"): a list such as ``instance_group`` replaces the base's list."""
    import itertools

    def choices(field: str, value: object) -> list[object]:
        repeated_scalar = field in {"profile", "preferred_batch_size"}
        if isinstance(value, list) and not repeated_scalar:
            return list(value)
        return [value]

    per_key: dict[str, list[object]] = {}
    for key, value in params.items():
        if key == "instance_group":
            groups = []
            for group in value:
                fields = {k: choices(k, v) for k, v in group.items()}
                groups.append([dict(zip(fields, combo, strict=True))
                               for combo in itertools.product(*fields.values())])
            per_key[key] = [list(c) for c in itertools.product(*groups)]
        elif isinstance(value, dict):
            per_key[key] = [value]
        else:
            per_key[key] = choices(key, value)
    variants = []
    for combo in itertools.product(*per_key.values()):
        variant = dict(base)
        for key, value in zip(per_key, combo, strict=True):
            variant[key] = value  # _apply_value_to_dict: not a dict -> replaced whole
        variants.append(variant)
    return variants


def test_model_analyzer_variants_keep_every_profile(tmp_path: Path) -> None:
    """Item D: an engine served with two profiles; every variant Model Analyzer makes from
    trtpack's sweep keeps ``profile: ["0", "1"]`` (without it, tensorrt_backend's
    ``GetProfileIndices`` defaults to profile 0 alone while the sweep's batch sizes reach
    the larger profile's 32)."""
    from google.protobuf import json_format

    from trtpack.model_io import ModelIO, TensorIO
    from trtpack.serving.config import engine_model_config, write_config
    from trtpack.serving.tuning import model_analyzer_config
    from trtpack.shapes import TensorSpec, parse_profiles
    from trtpack.sources.recipe import TritonSettings

    names = ("input_ids", "attention_mask")
    specs = [TensorSpec(n, "int64", ("batch", "sequence")) for n in names]
    io = ModelIO(tuple(TensorIO(n, "int64", (-1, -1), True) for n in names),
                 (TensorIO("out", "float32", (-1, -1, 8), True),))
    profiles = parse_profiles(["1x8:4x32:8x128", "8x8:16x128:32x128"], specs)
    settings = TritonSettings(instance_count=3)
    config = engine_model_config("m", io, profiles, settings)
    (tmp_path / "m").mkdir()
    write_config(tmp_path / "m" / "config.pbtxt", config)
    ma = model_analyzer_config(ModelRepository(tmp_path, []), "m", profiles, settings,
                               kind="KIND_GPU", integer_inputs=True, repository_path=".")
    ma = yaml.safe_load(yaml.safe_dump(ma))  # as Model Analyzer reads the file
    base = json_format.MessageToDict(config, preserving_proto_field_name=True)
    variants = _model_analyzer_variants(
        base, ma["profile_models"]["m"]["model_config_parameters"])
    assert {v["instance_group"][0]["count"] for v in variants} == {1, 2, 3}  # swept
    for variant in variants:
        (group,) = variant["instance_group"]
        assert group["profile"] == ["0", "1"], group
    assert max(ma["batch_sizes"]) == 32
