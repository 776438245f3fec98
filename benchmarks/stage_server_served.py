"""What the test suite's stage server served and refused, per test file: the stage processes
forked from its templates, and the requests it refused (the build's environment differed in
a variable its imports may have read) with that variable.

    .venv/bin/python benchmarks/stage_server_served.py tests/pipeline/test_remote_cache.py
    .venv/bin/python benchmarks/stage_server_served.py tests/pipeline -n 2
    .venv/bin/python benchmarks/stage_server_served.py --log FILE   (a kept log, counted)

Runs ``pytest -q -p no:cacheprovider [-n N --dist loadgroup] PATHS`` with the server on
(``TRTPACK_TEST_STAGE_SERVER=1``) and its log kept (``TRTPACK_TEST_STAGE_SERVER_LOG``, see
tests/conftest.py), then counts the log's lines. Builds a test starts without the server
(``without_stage_server``: the tests that find stage processes among the build's children)
ask nothing and are not counted here."""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

STAGE_SERVER_ENV = "TRTPACK_STAGE_SERVER"  # trtpack.processes'
TEST_STAGE_SERVER_ENV = "TRTPACK_TEST_STAGE_SERVER"  # tests/conftest.py's switch
STAGE_SERVER_LOG_ENV = "TRTPACK_TEST_STAGE_SERVER_LOG"  # tests/conftest.py's
LINE = re.compile(r"stage server: (\w+) (served|refused)(?:: the build's (\S+) differs)?"
                  r"(?:, pid \d+)?(?: for (\S+))?")


def count(log: str) -> dict[str, collections.Counter[str]]:
    """test file -> Counter of "served STAGE" / "refused STAGE (VARIABLE)"."""
    found: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for stage, what, variable, test in LINE.findall(log):
        key = f"{what} {stage}" + (f" ({variable})" if variable else "")
        found[(test or "?").split("::")[0]][key] += 1
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*")
    parser.add_argument("-n", "--workers", type=int, default=0,
                        help="pytest-xdist workers (0: one process)")
    parser.add_argument("--log", type=Path, help="count this kept log; run nothing")
    args = parser.parse_args()
    if args.log is not None:
        log = args.log.read_text(errors="replace")
    else:
        kept = Path(tempfile.mkdtemp(prefix="stage-server-served-")) / "server.log"
        env = {k: v for k, v in os.environ.items() if k != STAGE_SERVER_ENV}
        env.update({TEST_STAGE_SERVER_ENV: "1", STAGE_SERVER_LOG_ENV: str(kept)})
        extra = ["-n", str(args.workers), "--dist", "loadgroup"] if args.workers else []
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               *extra, *args.paths], capture_output=True, text=True,
                              check=False, env=env)
        lines = done.stdout.strip().splitlines()
        print("\n".join([ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
                        + lines[-1:]) if lines else done.stderr)
        log = kept.read_text(errors="replace") if kept.is_file() else ""
        print(f"(the server's log: {kept})")
    totals: collections.Counter[str] = collections.Counter()
    for path, counts in sorted(count(log).items()):
        served = sum(n for k, n in counts.items() if k.startswith("served"))
        refused = sum(n for k, n in counts.items() if k.startswith("refused"))
        totals.update(served=served, refused=refused)
        detail = ", ".join(f"{k} x{n}" for k, n in sorted(counts.items())
                           if k.startswith("refused"))
        print(f"{path:60s} served {served:4d} refused {refused:4d}  {detail}")
    print(f"all: served {totals['served']}, refused {totals['refused']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
