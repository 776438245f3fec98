"""What a stage's key depends on (``pipeline.keys``): the trtpack modules it runs, the
packages those use, and nothing else of trtpack or of the machine."""

from __future__ import annotations

import pytest

from trtpack.pipeline import keys
from trtpack.pipeline.cache import stage_key


def _closure(stage: str) -> set[str]:
    return set(keys.module_closure(f"trtpack.stages.{stage}", keys.package_sources())[0])


def test_a_stage_runs_its_imports_transitively_and_not_the_others() -> None:
    simplify = _closure("simplify")
    assert {"trtpack.stages.simplify", "trtpack.onnx_tools.simplify_graph",
            "trtpack.stages", "trtpack"} <= simplify  # and the packages' __init__
    assert "trtpack.pytorch.onnx_export" in _closure("export")
    assert not any(m.startswith(("trtpack.pytorch.onnx_export", "trtpack.cli",
                                 "trtpack.precision")) for m in simplify)
    # a module named in a string runs too (the ModelOpt worker, in a process of its own)
    assert "trtpack.precision.modelopt_worker" in _closure("precision")


def test_an_import_inside_a_function_counts() -> None:
    sources = {"trtpack": "", "trtpack.a": "def f():\n    from trtpack.b import x\n",
               "trtpack.b": "import numpy\nfrom trtpack import c\n", "trtpack.c": "",
               "trtpack.d": "import torch\n"}
    modules, third_party = keys.module_closure("trtpack.a", sources)
    assert modules == ["trtpack", "trtpack.a", "trtpack.b", "trtpack.c"]
    assert third_party == {"numpy"}
    edited = {**sources, "trtpack.c": "# changed"}
    assert keys.code_digest(modules, edited) != keys.code_digest(modules, sources)
    assert keys.code_digest(modules, {**sources, "trtpack.d": "import onnx\n"}) == \
        keys.code_digest(modules, sources)


def test_package_versions_hold_what_is_used_and_what_it_requires() -> None:
    versions = keys.package_versions({"onnxsim"})
    assert "onnxsim" in versions and "onnx" in versions  # onnxsim requires onnx
    assert "torch" not in versions and "trtpack" not in versions
    assert "torch" in keys.stage_dependencies("trtpack.stages.export")["packages"]  # type: ignore[operator]
    assert "torch" not in keys.stage_dependencies("trtpack.stages.simplify")["packages"]  # type: ignore[operator]


@pytest.mark.parametrize("field", ["code", "packages", "data", "python"])
def test_each_dependency_is_in_the_key(field: str) -> None:
    deps = dict(keys.stage_dependencies("trtpack.stages.simplify"))
    changed = {**deps, field: "something else"}
    assert stage_key("simplify", {}, "", deps) != stage_key("simplify", {}, "", changed)


def test_the_constraints_pin_every_package_a_key_holds() -> None:
    text = keys.constraints(["trtpack.stages.export", "trtpack.stages.simplify"])
    pinned = dict(line.split("==") for line in text.splitlines())
    export = keys.stage_dependencies("trtpack.stages.export")["packages"]
    assert isinstance(export, dict) and set(export) <= set(pinned)
    assert pinned["onnxsim"] == export.get("onnxsim", pinned["onnxsim"])
