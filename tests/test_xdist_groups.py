"""``make test`` runs the suite in pytest-xdist workers with ``--dist loadgroup``: a test that
uses a module-scoped fixture (a module's build, a tritonserver) is put in its module's group
(``tests/conftest.py``), so the fixture is made in one worker only. xdist carries the group in
the test's id (``path::test@group``); when it cannot (pytest-dev/pytest-xdist#1386, pytest
9.2), the tests are spread as if ungrouped and every worker builds every module fixture again,
with nothing failing but the time. This test fails then."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def module_fixture() -> str:
    return "made once for the module"


def test_a_test_using_a_module_fixture_runs_in_its_modules_group(
        module_fixture: str, request: pytest.FixtureRequest) -> None:
    nodeid = request.node.nodeid
    grouped = bool(getattr(request.config.option, "loadgroup", False))  # set in the workers
    if os.environ.get("PYTEST_XDIST_WORKER") and grouped:
        assert nodeid.endswith("@tests/test_xdist_groups.py"), nodeid
    else:  # one process, or workers without groups: the id as written
        assert "@" not in nodeid, nodeid


def test_a_test_without_one_is_not_grouped(request: pytest.FixtureRequest) -> None:
    assert "@" not in request.node.nodeid
