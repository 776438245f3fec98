"""perf_analyzer's "no stable measurement" is retried with a longer window, as Model Analyzer
does; any other failure is one error line at once.

STAND-IN, labelled: the perf_analyzer here is a script that answers as the real one does
(its messages, exit 2, its CSV columns) depending on ``--measurement-interval``. An unstable
measurement cannot be caused on purpose with the real binary; the real one runs against a real
tritonserver in tests/serving/test_bench_served.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from trtpack.bench.served import STABILITY_RETRIES, WINDOW_STEP_MS, run_perf_analyzer
from trtpack.errors import MissingEnvironmentError

STANDIN = '''#!{python}
import json, sys
args = sys.argv[1:]
window = int(args[args.index("--measurement-interval") + 1])
calls = {calls!r}
with open(calls, "a") as f:
    f.write(json.dumps(window) + "\\n")
if window < {stable_from}:
    print("Request concurrency: 1")
    print({message!r})
    sys.exit(2)
with open(args[args.index("-f") + 1], "w") as f:
    f.write("Concurrency,Inferences/Second,p50 latency,p90 latency,p99 latency,"
            "Server Queue,Server Compute Infer\\n1,250.5,3900,4100,4800,120,3500\\n")
'''


def standin(tmp_path: Path, stable_from: int,
            message: str = "Failed to obtain stable measurement within 5 measurement windows "
                           "for concurrency 1. Please try to increase the "
                           "--measurement-interval.") -> tuple[str, Path]:
    calls = tmp_path / "calls.jsonl"
    script = tmp_path / "perf_analyzer"
    script.write_text(STANDIN.format(python=sys.executable, calls=str(calls),
                                     stable_from=stable_from, message=message))
    script.chmod(0o755)
    return str(script), calls


def windows(calls: Path) -> list[int]:
    return [json.loads(line) for line in calls.read_text().splitlines()]


def measure(binary: str, tmp_path: Path, said: list[str]) -> tuple[dict[str, float], int]:
    data = tmp_path / "inputs.json"
    data.write_text("{}")
    return run_perf_analyzer(binary, "127.0.0.1:1", "m", 2, data, 1, 500, tmp_path,
                             said.append)


def test_an_unstable_measurement_runs_again_with_a_longer_window(tmp_path: Path) -> None:
    binary, calls = standin(tmp_path, stable_from=500 + 2 * WINDOW_STEP_MS)
    said: list[str] = []
    row, window = measure(binary, tmp_path, said)
    assert windows(calls) == [500, 500 + WINDOW_STEP_MS, 500 + 2 * WINDOW_STEP_MS]
    assert window == 500 + 2 * WINDOW_STEP_MS
    assert row["throughput"] == 250.5 and row["p50_ms"] == pytest.approx(3.9)
    assert len(said) == 2 and "no stable measurement" in said[0]


def test_an_empty_window_is_retried_too(tmp_path: Path) -> None:
    binary, calls = standin(tmp_path, stable_from=501, message="No valid requests recorded "
                            "within time interval. Please use a larger time window.")
    _, window = measure(binary, tmp_path, [])
    assert windows(calls) == [500, 500 + WINDOW_STEP_MS] and window == 500 + WINDOW_STEP_MS


def test_it_gives_up_after_its_retries_with_perf_analyzers_words(tmp_path: Path) -> None:
    binary, calls = standin(tmp_path, stable_from=10**9)
    with pytest.raises(MissingEnvironmentError, match="Failed to obtain stable measurement"):
        measure(binary, tmp_path, [])
    assert len(windows(calls)) == STABILITY_RETRIES + 1


def test_another_failure_is_not_retried(tmp_path: Path) -> None:
    binary, calls = standin(tmp_path, stable_from=10**9,
                            message="error: failed to get model metadata: model not found")
    with pytest.raises(MissingEnvironmentError, match="model not found"):
        measure(binary, tmp_path, [])
    assert windows(calls) == [500]
