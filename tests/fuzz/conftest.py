"""Prints how many inputs the parser fuzz suites generated (``tests/fuzz/mutations.py``: at
least 100 per property in ``make test``, the full search in ``make test-slow``)."""

from __future__ import annotations

from typing import Any

from tests.fuzz.mutations import GENERATED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if GENERATED:
        per_parser = ", ".join(f"{name} {count}" for name, count in GENERATED.items())
        terminalreporter.write_line(f"fuzzed parsers: {sum(GENERATED.values())} generated "
                                    f"inputs ({per_parser})")
