"""--timing-cache warns when it will not do what its value suggests: ignored by builds that
make no engine, and a folder (not a file) when named like a file."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtpack.api import BuildRequest, resolve_options
from trtpack.api.plan import timing_cache_warnings


@pytest.mark.parametrize("target, build_engine, option", [
    ("cpu", True, "--target cpu"), ("a100", False, "--no-engine")])
def test_timing_cache_without_an_engine_is_a_warning(target: str, build_engine: bool,
                                                      option: str, tmp_path: Path) -> None:
    cache = tmp_path / "timing"
    plan, warnings = resolve_options(BuildRequest(
        model="tiny-bert", target=target, build_engine=build_engine, timing_cache=cache,
        out=tmp_path / "out"))
    assert warnings == [f"--timing-cache is ignored: {option} builds no TensorRT engine"]
    assert plan.timing_cache == cache.resolve()
    assert not cache.exists()
    assert resolve_options(BuildRequest(model="tiny-bert", target=target,
                                        build_engine=build_engine))[1] == []


def test_timing_cache_named_like_a_file_is_a_warning(tmp_path: Path) -> None:
    """With an engine build (which needs a GPU and TensorRT, so the rule is tested on its
    own here): a missing path with a suffix will become a folder."""
    (warning,) = timing_cache_warnings(tmp_path / "timing.cache", None)
    assert "'" + str(tmp_path / "timing.cache") + "' will be created as a folder" in warning
    assert timing_cache_warnings(tmp_path / "timing", None) == []
    (tmp_path / "shared.d").mkdir()  # an existing folder with a dot in its name is fine
    assert timing_cache_warnings(tmp_path / "shared.d", None) == []
