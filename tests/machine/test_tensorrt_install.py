"""How to install TensorRT: one text (``packages.TENSORRT_INSTALL``) in the exit-3 hint, in
``trtpack doctor`` and in the README; extras pinning the supported range; and no file of the
project claiming TensorRT is not on PyPI (it is, for machines that can reach NVIDIA's index)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli (the dev extras)
    import tomli as tomllib

import pytest

from trtpack.errors import MissingEnvironmentError
from trtpack.machine import gpus, local_targets, packages
from trtpack.machine.targets import resolve_target

ROOT = Path(__file__).resolve().parents[2]


def test_exit_3_hint_and_doctor_give_the_same_install_routes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    no_trt = packages.TensorRTProbe(False, None, "the Python package 'tensorrt' is not installed")
    a10g = gpus.LocalGpu("NVIDIA A10G", (8, 6), "550.54", 24000)
    with pytest.raises(MissingEnvironmentError) as info:
        local_targets.check_engine_environment(resolve_target("g5"), gpus=[a10g], tensorrt=no_trt,
                                     polygraphy=True)
    assert info.value.hint is not None and packages.TENSORRT_INSTALL in info.value.hint
    assert "tensorrt-cu12" in packages.TENSORRT_INSTALL and "NGC" in packages.TENSORRT_INSTALL

    from trtpack.diagnostics import doctor

    monkeypatch.setattr(packages, "tensorrt_version", lambda: None)
    report = doctor.environment_report()
    assert f"TensorRT: {packages.TENSORRT_INSTALL}" in report["summary"]
    monkeypatch.setattr(packages, "tensorrt_version", lambda: "10.13.0.35")  # e.g. tensorrt-cu12
    report = doctor.environment_report()
    row = next(c for c in report["components"] if c["name"] == "tensorrt")
    assert row["version"] == "10.13.0.35"
    assert not any(line.startswith("TensorRT: pip install") for line in report["summary"])


def test_a_gpu_mismatch_alone_does_not_tell_to_install_tensorrt() -> None:
    l4 = gpus.LocalGpu("NVIDIA L4", (8, 9), "550.54", 24000)
    with pytest.raises(MissingEnvironmentError) as info:
        local_targets.check_engine_environment(resolve_target("g5"), gpus=[l4],
                                     tensorrt=packages.TensorRTProbe(True, "10.13.0.35"),
                                     polygraphy=True)
    assert info.value.hint is not None and "pip install" not in info.value.hint


def test_extras_pin_the_supported_tensorrt_and_stay_out_of_all() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for cuda in ("cu12", "cu13"):
        (requirement,) = extras[f"tensorrt-{cuda}"]
        match = re.fullmatch(rf"tensorrt-{cuda}>=([\d.]+),<(\d+)", requirement)
        assert match, requirement
        assert packages.parse_version(match[1])[:2] >= packages.MIN_TENSORRT
        assert int(match[2]) == 12  # 10.x and 11.x: the majors trtpack's engine code handles
    # TensorRT's extras (NVIDIA's index at install time) stay out of `all`; TensorRT-RTX (the
    # compile check's builder, whole on PyPI) is in it, pinned
    (everything,) = extras["all"]
    assert not re.search(r"tensorrt-cu1\d", everything), everything
    assert "tensorrt-rtx" in everything
    assert extras["tensorrt-rtx"] == ["tensorrt-rtx-cu12==1.7.1.116"]


def test_the_docs_say_how_to_install_tensorrt() -> None:
    page = (ROOT / "docs" / "gpu-and-tensorrt.md").read_text()
    assert "\n## Installing TensorRT\n" in page
    for text in ("pip install 'trtpack[onnx,tensorrt-cu12]'", "tensorrt-cu13", "Dockerfile.ngc",
                 "trtpack doctor"):
        assert text in page
    assert "(docs/gpu-and-tensorrt.md#installing-tensorrt)" in (ROOT / "README.md").read_text()


def test_nothing_in_the_project_claims_tensorrt_is_not_on_pypi() -> None:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    claims = re.compile(r"(not\s+on\s+PyPI|PyPI\s+cannot\s+provide|never\s+a\s+pip)",
                        re.IGNORECASE)
    found = []
    for name in files:
        path = ROOT / name
        if path.suffix in {".npz", ".onnx", ".png"} or not path.is_file() or \
                name == "tests/machine/test_tensorrt_install.py":
            continue
        text = path.read_text(errors="ignore")
        found += [f"{name}: {m[0]}" for m in claims.finditer(text)]
    assert not found, found
