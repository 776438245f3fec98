"""A cold build and a rebuild of one model, variant by variant in alternating order (issue 47:
minilm fp32 ``--target cpu`` cold <= 8 s, rebuild <= 1 s): wall and CPU seconds of each,
and of the cold build's export process, when it ended and the model.onnx it wrote.

    python benchmarks/minilm_cold.py [--model minilm] [--pairs 3] \
        [--variant NAME:VAR=VALUE,...]... [--work DIR] [--json FILE] [-- EXTRA BUILD ARGS]

Each pair runs every variant once (the order reversed every other pair, so an A/B shares the
machine's load): ``trtpack build MODEL --target cpu --cache-dir CACHE --out OUT`` on a new,
empty CACHE (cold), then the same command again (the rebuild), through
``build_cpu.run_once`` (each process's CPU seconds). A variant is environment variables:
``PYTHONPATH=/path/to/checkout`` runs another commit's code with this interpreter's packages
(``git worktree add --detach DIR COMMIT``; compile its bytecode first, ``python -m compileall
-q DIR/trtpack``, where ``PYTHONDONTWRITEBYTECODE`` is set, or every process compiles it
again). Every cache and OUT is deleted once read.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine
from build_cpu import parse_variant, run_once

EXPORT = "stage export"


def one_build(command: list[str], env: dict[str, str], interval: float) -> dict[str, Any]:
    """One run of ``command``: wall, CPU, and its export process's CPU and end (seconds from
    the build's start; None when the build ran no export: a rebuild)."""
    record = run_once(command, env, interval)
    export = [p for p in record["processes"].values() if p["label"] == EXPORT]
    return {"returncode": record["returncode"], "wall_s": record["wall_s"],
            "cpu_s": record["cpu_s"],
            "export_cpu_s": export[0]["cpu_s"] if export else None,
            "export_end_s": export[0]["last_s"] if export else None,
            "by_label": record["by_label"],
            "output_tail": record["output_tail"] if record["returncode"] else ""}


def cold_and_rebuild(python: str, model: str, extra: list[str], env: dict[str, str],
                     work: Path, interval: float) -> dict[str, Any]:
    """The cold build on an empty cache in ``work``, then the rebuild; ``work`` is removed."""
    cache = work / "cache"
    runs: dict[str, Any] = {}
    try:
        for kind in ("cold", "rebuild"):
            out = work / f"out-{kind}"
            runs[kind] = one_build([python, "-m", "trtpack.cli", "build", model, "--target",
                                    "cpu", "--cache-dir", str(cache), "--out", str(out),
                                    *extra], env, interval)
        onnx = work / "out-cold" / "artifacts" / "export" / "model.onnx"
        runs["model_onnx_sha256"] = hashlib.sha256(onnx.read_bytes()).hexdigest() \
            if onnx.is_file() else None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return runs


def summary(rows: list[dict[str, Any]], name: str) -> str:
    mine = [r for r in rows if r["variant"] == name]

    def column(kind: str, key: str) -> list[float]:
        return [r[kind][key] for r in mine if r[kind][key] is not None]

    cold, rebuild = column("cold", "wall_s"), column("rebuild", "wall_s")
    return (f"{name}: cold wall s {' / '.join(map(str, cold))} (median "
            f"{statistics.median(cold):.1f}), CPU s {' / '.join(map(str, column('cold', 'cpu_s')))}"
            f", export CPU s {' / '.join(map(str, column('cold', 'export_cpu_s')))}, export "
            f"ended at s {' / '.join(map(str, column('cold', 'export_end_s')))}; rebuild wall s "
            f"{' / '.join(map(str, rebuild))} (median {statistics.median(rebuild):.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME:VAR=VALUE,... environment of one variant (default: one, "
                             "the environment as it is)")
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--work", type=Path, help="where the caches and OUTs go (removed)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="-- more build arguments")
    args = parser.parse_args()
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    variants = [parse_variant(v) for v in args.variant] or [("as-is", {})]
    work = args.work or Path(tempfile.mkdtemp(prefix="minilm-cold-"))
    rows: list[dict[str, Any]] = []
    try:
        for pair in range(args.pairs):
            for name, env in (variants if pair % 2 == 0 else variants[::-1]):
                runs = cold_and_rebuild(sys.executable, args.model, extra, env,
                                        work / f"{name}-{pair}", args.interval)
                row = {"variant": name, "pair": pair, "env": env, **runs}
                rows.append(row)
                print(json.dumps({k: row[k] for k in ("variant", "pair")}
                                 | {f"{kind}_{key}": row[kind][key]
                                    for kind in ("cold", "rebuild")
                                    for key in ("returncode", "wall_s", "cpu_s")}), flush=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    for name, _ in variants:
        print(summary(rows, name))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "machine": machine(), "command": " ".join(["python", *sys.argv]),
            "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "model": args.model, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
