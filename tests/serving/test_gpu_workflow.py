"""The GPU workflow (.github/workflows/gpu.yml) against ``trtpack merge``'s rule, read from the
file itself: the families whose build folders reach the merge job must have one compute
capability each (what ``engine_builds.check_compatible`` demands), every family must find an
engine in the merged model, and the profiles its builds ask for must be ones Triton's
TensorRT backend serves at every batch for every sequence length they take
(``serving.triton_rules``)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from trtpack.api import check_triton_profiles
from trtpack.serving.engine_builds import (
    one_engine_per_compute_capability,
    target_compute_capability,
)
from trtpack.serving.triton_rules import engine_max_batch_size, served_lengths
from trtpack.shapes import parse_profiles
from trtpack.sources.resolve import resolve_model

WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "gpu.yml"
MERGE_UPLOAD = "The minilm fp16 build folder for the merge"


def _workflow() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def _matrix_entries(job: dict[str, Any]) -> list[dict[str, Any]]:
    matrix = job["strategy"]["matrix"]
    entries = [dict(e) for e in matrix.get("include", [])]
    entries += [{"target": t} for t in matrix.get("target", [])]
    return entries


def _uploads_for_merge(step: dict[str, Any], entry: dict[str, Any]) -> bool:
    """Evaluate the upload step's ``if`` for one matrix entry (the forms this file uses)."""
    condition = str(step.get("if", "true")).strip()
    condition = condition.removeprefix("${{").removesuffix("}}").strip()
    if condition in ("true", "success()", "always()"):
        return True
    if condition.startswith("matrix."):
        return bool(entry.get(condition.removeprefix("matrix.")))
    raise AssertionError(f"unexpected condition on '{MERGE_UPLOAD}': {condition}")


def test_the_families_merged_have_one_engine_per_compute_capability() -> None:
    jobs = _workflow()["jobs"]
    engines = jobs["engines"]
    (upload,) = [s for s in engines["steps"] if s.get("name") == MERGE_UPLOAD]
    assert upload["with"]["name"].startswith("build-minilm-fp16-")
    (download,) = [s for s in jobs["merge"]["steps"] if s.get("uses", "").startswith(
        "actions/download-artifact")]
    assert download["with"]["pattern"] == "build-minilm-fp16-*"
    entries = _matrix_entries(engines)
    built = [e["target"] for e in entries]
    merged = [e["target"] for e in entries if _uploads_for_merge(upload, e)]
    keyed = []
    for target in merged:
        cc = target_compute_capability(target)
        assert cc is not None, target
        keyed.append((f"{cc[0]}.{cc[1]}", target))
    assert one_engine_per_compute_capability(keyed) == [], keyed  # merge's own rule
    # every family built finds its compute capability in the merged cc_model_filenames
    merged_ccs = {cc for cc, _ in keyed}
    for target in built:
        cc = target_compute_capability(target)
        assert cc is not None and f"{cc[0]}.{cc[1]}" in merged_ccs, target
    assert len(merged) >= 2  # merge needs two builds


def test_the_workflow_profiles_are_ones_triton_can_serve() -> None:
    script = next(s["run"] for s in _workflow()["jobs"]["engines"]["steps"]
                  if str(s.get("name", "")).startswith("Build and verify the recipes"))
    builds = [shlex.split(cmd.replace("\\\n", " ")) for cmd in
              script.split("trtpack build ")[1:]]
    assert builds
    for args in builds:
        recipe = resolve_model(args[0])
        profiles = parse_profiles([args[i + 1] for i, a in enumerate(args)
                                   if a == "--profile"], recipe.input_specs())
        check_triton_profiles(profiles, recipe, "tensor")  # trtpack build's refusal
        # every sequence length a profile takes is served at every batch Triton may form
        # from requests of that length (1..max_batch_size): no batch of short texts fails
        ids = recipe.inputs[0].name
        taken = sorted({n for p in profiles for n in range(p.shapes[ids].min[1],
                                                           p.shapes[ids].max[1] + 1)})
        assert served_lengths(profiles, ids, engine_max_batch_size(profiles)) == taken, args
