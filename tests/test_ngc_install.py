"""Item B of issue 32: trtpack installs in an NGC image under the image's pip constraints.

NGC PyTorch images since 25.03 set ``PIP_CONSTRAINT=/etc/pip/constraint.txt``, pinning every
preinstalled package (NVIDIA's PyTorch release notes, "Starting from the 25.03 release, the
PyTorch container has implemented a pip constraints file at /etc/pip/constraint.txt"), and
pip applies constraints inside build isolation too. ``Dockerfile.ngc`` installs under them
(and names the conflict when it cannot); these tests check trtpack's requirements against
the pins recorded in ``tests/ngc/*-constraint.txt`` (each file cites where its pins come
from) with pip's own resolver, and the build backend's floor against setuptools' rule.

What they check is only what is recorded: of 25.10's constraint file one pin (torch) could
be read from a public source (NVIDIA's release notes list packages, not the file's pins; no
copy of the file was found), so the image's other pins (setuptools, numpy, ...) meet trtpack
only when Dockerfile.ngc builds; Dockerfile.ngc says so, checked below (issue 45, item 7).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli (the dev extras)
    import tomli as tomllib

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
CONSTRAINTS = sorted((ROOT / "tests" / "ngc").glob("*-constraint.txt"))
IMAGE_EXTRAS = ("onnx", "minilm", "modelopt", "dev")  # the GPU workflow's EXTRAS
KEPT_FROM_IMAGE = {"torch"}  # the Dockerfile pins the image's own build (keep.txt)
SPDX_LICENSE_SETUPTOOLS = (77, 0)
"""setuptools 77.0.0 (its NEWS, v77.0.0: PEP 639, ``project.license`` as an SPDX expression
string); older setuptools validate ``project.license`` as a table and refuse a string."""


def _requirements() -> list[str]:
    project = PYPROJECT["project"]
    reqs = list(project["dependencies"])
    for extra in IMAGE_EXTRAS:
        reqs += project["optional-dependencies"][extra]
    return reqs


def _name(requirement: str) -> str:
    from packaging.requirements import Requirement

    return Requirement(requirement).name.lower()


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def test_the_build_backend_floor_reads_the_license_string() -> None:
    """A constraint that pins setuptools applies to pip's isolated build of trtpack too, so
    ``setuptools>=68`` let an image resolve a setuptools that refuses ``license = "..."``."""
    license_field = PYPROJECT["project"]["license"]
    (backend,) = [r for r in PYPROJECT["build-system"]["requires"] if _name(r) == "setuptools"]
    match = re.search(r">=\s*([0-9.]+)", backend)
    assert match is not None, backend
    floor = (*(int(p) for p in match.group(1).split(".")), 0)
    if isinstance(license_field, str):
        assert floor[:2] >= SPDX_LICENSE_SETUPTOOLS, backend


@pytest.mark.parametrize("constraint", CONSTRAINTS, ids=lambda p: p.name)
def test_the_images_own_packages_satisfy_trtpack(constraint: Path) -> None:
    """What the image keeps (its torch: ``keep.txt`` and ``--system-site-packages``) must
    meet trtpack's range; pip accepts an installed pre-release that its specifier holds."""
    from packaging.requirements import Requirement

    pins = _pins(constraint)
    for requirement in _requirements():
        req = Requirement(requirement)
        if req.name.lower() in KEPT_FROM_IMAGE and req.name.lower() in pins:
            assert req.specifier.contains(pins[req.name.lower()], prereleases=True), \
                (requirement, pins[req.name.lower()])


@pytest.mark.parametrize("constraint", CONSTRAINTS, ids=lambda p: p.name)
def test_trtpack_resolves_under_the_recorded_constraints(constraint: Path,
                                                         tmp_path: Path) -> None:
    """``pip install --dry-run`` of trtpack's direct requirements (the image's extras, on
    this Python) under the recorded pins: every requirement has a release that its range
    and the image's pin both allow. (``--no-deps``: the transitive set is the image's pip's
    to resolve; this keeps the check to seconds.)"""
    reqs = [r for r in _requirements() if _name(r) not in KEPT_FROM_IMAGE]
    (tmp_path / "requirements.txt").write_text("\n".join(reqs) + "\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
         "--quiet", "--disable-pip-version-check", "--prefer-binary",
         "-r", str(tmp_path / "requirements.txt"), "-c", str(constraint)],
        capture_output=True, text=True, timeout=300)
    if done.returncode != 0 and ("NewConnectionError" in done.stderr
                                 or "Network is unreachable" in done.stderr):
        pytest.skip("PyPI is not reachable from here")
    assert done.returncode == 0, done.stderr[-3000:]


def _image_env() -> dict[str, str]:
    """The ``ENV`` of Dockerfile.ngc (``KEY=VALUE`` pairs, continuations joined)."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile.ngc").read_text(encoding="utf-8"))
    env = {}
    for line in text.splitlines():
        instruction, _, rest = line.strip().partition(" ")
        if instruction == "ENV":
            env.update(dict(pair.split("=", 1) for pair in rest.split() if "=" in pair))
    return env


def test_the_image_lets_the_default_make_target_fetch_its_weights(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Item G. trtpack's own rule (``trtpack/pytorch/models.py``, ``require_hub_weights``):
    weights not in the local cache and ``HF_HUB_OFFLINE`` set stop the build with exit 3
    before any request. The Makefile's family targets default to ``MODEL=bert-large`` (hub
    weights, never in a fresh image's cache), so an image-wide ``HF_HUB_OFFLINE=1`` made
    ``make g5`` fail in the container. With the image's environment (the hub pointed at a
    closed local port, so nothing leaves this machine) the check must try the hub."""
    from trtpack.errors import MissingEnvironmentError
    from trtpack.pytorch.models import require_hub_weights
    from trtpack.sources.resolve import cached_snapshot, resolve_model

    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    default = re.search(r"^MODEL \?= (\S+)", makefile, re.M)
    assert default is not None
    hf_id = resolve_model(default.group(1)).source.hf_id
    assert hf_id, default.group(1)
    if cached_snapshot(hf_id) is not None:
        pytest.skip(f"{hf_id} is in this machine's Hugging Face cache")
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in _image_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(MissingEnvironmentError) as raised:
        require_hub_weights(hf_id)
    assert "cannot be reached" in str(raised.value)  # it asked the hub
    assert "HF_HUB_OFFLINE is set" not in str(raised.value)


def test_the_dockerfile_claims_no_more_than_the_recorded_pins() -> None:
    """Dockerfile.ngc names the pins the resolver test checks, and no others are implied:
    before, it said 'checked against recorded pins' while one pin was recorded."""
    recorded = sorted({name for c in CONSTRAINTS for name in _pins(c)})
    text = " ".join(line.lstrip("# ") for line in
                    (ROOT / "Dockerfile.ngc").read_text(encoding="utf-8").splitlines())
    words = {1: "the one pin", 2: "the two pins", 3: "the three pins"}
    assert f"against {words.get(len(recorded), f'the {len(recorded)} pins')} of the image " \
        f"recorded from a public source, {', '.join(recorded)};" in text, recorded
