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
        "README.md", "model_analyzer_p0.yaml", "perf_analyzer.sh", "perf_text_inputs.json"]
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
    text = (_tuning(minilm_text_repo) / "model_analyzer_p0.yaml").read_text()
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
    config = yaml.safe_load((tmp_path / ".tuning.tmp" / "model_analyzer_p0.yaml").read_text())
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
        # repeated fields: a list parses as ONE value of the field's type
        repeated = field in {"profile", "preferred_batch_size", "model_warmup"}
        if isinstance(value, list) and not repeated:
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
        elif isinstance(value, dict):  # one level of sub-fields, each swept
            fields = {k: choices(k, v) for k, v in value.items()}
            per_key[key] = [{**base.get(key, {}), **dict(zip(fields, combo, strict=True))}
                            for combo in itertools.product(*fields.values())]
        else:
            per_key[key] = choices(key, value)
    variants = []
    for combo in itertools.product(*per_key.values()):
        variant = dict(base)
        for key, value in zip(per_key, combo, strict=True):
            variant[key] = value  # _apply_value_to_dict: not a dict -> replaced whole
        variants.append(variant)
    return variants


def _two_profile_model(tmp_path: Path, profile_texts: list[str]) -> tuple:
    from trtpack.model_io import ModelIO, TensorIO
    from trtpack.serving.config import engine_model_config, write_config
    from trtpack.shapes import TensorSpec, parse_profiles
    from trtpack.sources.recipe import TritonSettings

    names = ("input_ids", "attention_mask")
    specs = [TensorSpec(n, "int64", ("batch", "sequence")) for n in names]
    io = ModelIO(tuple(TensorIO(n, "int64", (-1, -1), True) for n in names),
                 (TensorIO("out", "float32", (-1, -1, 8), True),))
    profiles = parse_profiles(profile_texts, specs)
    settings = TritonSettings(instance_count=3, warmup=True)
    config = engine_model_config("m", io, profiles, settings)
    (tmp_path / "m").mkdir()
    write_config(tmp_path / "m" / "config.pbtxt", config)
    return config, profiles, settings


def test_model_analyzer_configs_ask_only_for_shapes_a_profile_holds(tmp_path: Path) -> None:
    """Issue 45, item 3: two disjoint profiles (accepted with a warning). One config per
    profile (Model Analyzer's ``profile_models`` is keyed by model name), and every request
    shape its sweep sends, and every batch the dynamic batcher can merge those requests into
    (any sum of one request batch up to the variant's max_batch_size), is one
    ``select_profile`` (Triton's ``GetMostOptimizedProfile``, tensorrt_backend
    ``src/instance_state.cc`` line 1832 at e2ef6d7) finds a profile for, on the config
    Model Analyzer derives (its ``_apply_value_to_dict`` mirrored). Before: profile 0's
    length 64 at batches 16 and 32, which no profile holds (line 4293, "request specifies
    invalid shape")."""
    from google.protobuf import json_format

    from trtpack.serving.triton_rules import triton_view
    from trtpack.serving.tuning import model_analyzer_configs

    config, profiles, settings = _two_profile_model(
        tmp_path, ["1x16:4x64:8x64", "8x128:16x256:32x512"])
    configs = model_analyzer_configs(ModelRepository(tmp_path, []), "m", profiles, settings,
                                     kind="KIND_GPU", integer_inputs=True, repository_path=".")
    assert sorted(configs) == [0, 1]  # every profile swept
    base = json_format.MessageToDict(config, preserving_proto_field_name=True)
    for index, ma in configs.items():
        ma = yaml.safe_load(yaml.safe_dump(ma))  # as Model Analyzer reads the file
        low, opt, high = profiles[index].axis_range(0)
        assert {opt, high} <= set(ma["batch_sizes"])  # swept at its opt and max batch
        assert all(low <= b <= high for b in ma["batch_sizes"])
        model = ma["profile_models"]["m"]
        lengths = {int(s.split(":")[1]) for s in model["perf_analyzer_flags"]["shape"]}
        assert lengths == {profiles[index].shapes["input_ids"].opt[1]}
        variants = _model_analyzer_variants(base, model["model_config_parameters"])
        assert {v["instance_group"][0]["count"] for v in variants} == {1, 2, 3}
        for variant in variants:
            derived = _as_triton_reads(variant)
            assert derived.max_batch_size == min(high, config.max_batch_size)
            view = triton_view(derived, profiles)
            assert view.loads, view.load_errors
            assert all(1 < b <= derived.max_batch_size
                       for b in derived.dynamic_batching.preferred_batch_size)
            assert [w.name for w in derived.model_warmup] == [f"profile_{index}_opt"]
            for request_batch in ma["batch_sizes"]:
                for batch in range(request_batch, derived.max_batch_size + 1, request_batch):
                    (length,) = lengths
                    shapes = {name: (batch, length) for name in ("input_ids", "attention_mask")}
                    assert view.select_profile(shapes) == index, (index, batch, shapes)


def _as_triton_reads(variant: dict):
    """A Model Analyzer variant parsed with Triton's schema (``model_config.proto``)."""
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2

    return json_format.ParseDict(variant, model_config_pb2.ModelConfig())


def test_model_analyzer_variants_keep_their_profile(tmp_path: Path) -> None:
    """Item D (second reading), per profile since issue 45: every variant Model Analyzer makes
    from a profile's sweep keeps ``profile: ["<index>"]`` (without it, tensorrt_backend's
    ``GetProfileIndices`` defaults to profile 0 alone while profile 1's sweep reaches its
    batch 32)."""
    from google.protobuf import json_format

    from trtpack.serving.tuning import model_analyzer_configs

    config, profiles, settings = _two_profile_model(
        tmp_path, ["1x8:4x32:8x128", "8x8:16x128:32x128"])
    configs = model_analyzer_configs(ModelRepository(tmp_path, []), "m", profiles, settings,
                                     kind="KIND_GPU", integer_inputs=True, repository_path=".")
    base = json_format.MessageToDict(config, preserving_proto_field_name=True)
    for index, ma in configs.items():
        ma = yaml.safe_load(yaml.safe_dump(ma))  # as Model Analyzer reads the file
        variants = _model_analyzer_variants(
            base, ma["profile_models"]["m"]["model_config_parameters"])
        assert {v["instance_group"][0]["count"] for v in variants} == {1, 2, 3}  # swept
        for variant in variants:
            (group,) = variant["instance_group"]
            assert group["profile"] == [str(index)], group
    assert max(configs[1]["batch_sizes"]) == 32
