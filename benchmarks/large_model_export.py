"""Exporting and simplifying a model past protobuf's 2 GB limit (recipe big-embedding: a
600,000 x 1,024 float32 embedding table, 2.46 GB): time, peak memory and the files written.

Each case runs in a fresh process, measured from outside (peak summed RSS of the process tree
sampled every 50 ms, and the kernel's max RSS of the largest single process):

- ``build only``: the factory alone (the floor every case pays);
- ``export dynamo``: ``torch.onnx.export(..., dynamo=True, external_data=True)``;
- ``export legacy``: ``torch.onnx.export(..., dynamo=False)``;
- ``onnxsim CLI`` and ``onnxsim.simplify(path, output_path=...)`` on the dynamo export.

The child reports the in-call seconds of its main call. Then each result is loaded from a
copy of its folder with ONNX Runtime and compared with PyTorch.

    python benchmarks/large_model_export.py --workdir /tmp/large --json large.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from manual_chain import REPO, StepResult, child_env, machine_info, run_step, tool_path

CHILD = '''\
import json, sys, time
import torch
from trtpack.testing.models import big_embedding_model

case, out, result = sys.argv[1], sys.argv[2], sys.argv[3]
started = time.perf_counter()
model = big_embedding_model()
built = time.perf_counter()
ids = torch.randint(0, model.vocab_size, (2, 16))
mask = torch.ones(2, 16, dtype=torch.int64)
names = dict(input_names=["input_ids", "attention_mask"], output_names=["sentence_embedding"],
             opset_version=18)
if case == "dynamo":
    batch, sequence = torch.export.Dim("batch", max=64), torch.export.Dim("sequence", max=512)
    torch.onnx.export(model, (ids, mask), out, dynamo=True, external_data=True,
                      dynamic_shapes=({0: batch, 1: sequence}, {0: batch, 1: sequence}), **names)
elif case == "legacy":
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
            "sentence_embedding": {0: "batch"}}
    torch.onnx.export(model, (ids, mask), out, dynamo=False, dynamic_axes=axes, **names)
done = time.perf_counter()
json.dump({"build_seconds": built - started, "call_seconds": done - built}, open(result, "w"))
'''

SIMPLIFY_API = '''\
import json, sys, time
import onnxsim

src, out, result = sys.argv[1], sys.argv[2], sys.argv[3]
started = time.perf_counter()
_, ok = onnxsim.simplify(src, output_path=out)
json.dump({"call_seconds": time.perf_counter() - started, "check": bool(ok)}, open(result, "w"))
'''


def _files(folder: Path) -> list[dict[str, Any]]:
    return [{"name": p.name, "bytes": p.stat().st_size, "mode": oct(p.stat().st_mode & 0o777)}
            for p in sorted(folder.iterdir()) if p.is_file()]


def _external_locations(model_path: Path) -> list[str]:
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    return sorted({e.value for t in model.graph.initializer for e in t.external_data
                   if e.key == "location"})


def _check_against_torch(model_path: Path, scratch: Path, torch_model: Any) -> dict[str, Any]:
    """Copy the model's folder elsewhere, run it in ONNX Runtime, compare with PyTorch."""
    import numpy as np
    import onnxruntime as ort
    import torch

    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(model_path.parent, scratch)
    session = ort.InferenceSession(str(scratch / model_path.name),
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    ids = rng.integers(0, torch_model.vocab_size, size=(8, 128), dtype=np.int64)
    mask = (np.arange(128)[None, :] < rng.integers(1, 129, size=8)[:, None]).astype(np.int64)
    (got,) = session.run(None, {"input_ids": ids, "attention_mask": mask})
    with torch.inference_mode():
        want = torch_model(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    del session
    shutil.rmtree(scratch)
    cosine = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    return {"max_abs_diff": float(np.abs(got - want).max()), "min_cosine": float(cosine.min())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="export/simplify a >2 GB model, measured")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--skip-onnxsim", action="store_true")
    args = parser.parse_args(argv)
    work = args.workdir.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "child.py").write_text(CHILD)
    (work / "simplify_api.py").write_text(SIMPLIFY_API)
    env = child_env()
    py = sys.executable
    cases: list[tuple[str, list[str], Path | None]] = [
        ("build only", [py, "child.py", "none", "-", "build.json"], None),
        ("export dynamo", [py, "child.py", "dynamo", "dynamo/model.onnx", "dynamo.json"],
         work / "dynamo" / "model.onnx"),
        ("export legacy", [py, "child.py", "legacy", "legacy/model.onnx", "legacy.json"],
         work / "legacy" / "model.onnx"),
    ]
    if not args.skip_onnxsim:
        cases += [
            ("onnxsim CLI", [tool_path("onnxsim"), "dynamo/model.onnx", "sim_cli/model.onnx"],
             work / "sim_cli" / "model.onnx"),
            ("onnxsim.simplify(path, output_path)",
             [py, "simplify_api.py", "dynamo/model.onnx", "sim_api/model.onnx",
              "sim_api.json"], work / "sim_api" / "model.onnx"),
        ]
    for folder in ("dynamo", "legacy", "sim_cli", "sim_api"):
        (work / folder).mkdir()
    rows: list[dict[str, Any]] = []
    for name, command, model_path in cases:
        print(f"{name} ...", flush=True)
        step: StepResult = run_step(name, command, work / "logs" / f"{len(rows)}.log",
                                    cwd=work, env=env)
        row: dict[str, Any] = {"case": name, "seconds": step.seconds,
                               "peak_rss_mb": step.peak_rss_mb,
                               "max_single_rss_mb": step.max_single_rss_mb,
                               "returncode": step.returncode}
        inner = work / (command[-1] if command[-1].endswith(".json") else "-")
        if inner.is_file():
            row.update(json.loads(inner.read_text()))
        if model_path is not None and step.ok:
            row["files"] = _files(model_path.parent)
            row["external_locations"] = _external_locations(model_path)
        rows.append(row)
        print(f"  {json.dumps(row)}", flush=True)

    from trtpack.testing.models import big_embedding_model

    torch_model = big_embedding_model()
    for row, (_, _, model_path) in zip(rows, cases, strict=True):
        if model_path is not None and row["returncode"] == 0:
            row["onnxruntime_vs_torch"] = _check_against_torch(model_path, work / "copy",
                                                               torch_model)

    print("\n| case | wall time (s) | in-call (s) | peak RSS, tree (MB) | data files | "
          "ORT vs torch max abs |")
    print("|---|---:|---:|---:|---|---:|")
    for row in rows:
        data = ", ".join(f"{f['name']} ({f['bytes'] / 1e9:.2f} GB, {f['mode']})"
                         for f in row.get("files", []) if f["name"] != "model.onnx")
        check = row.get("onnxruntime_vs_torch", {}).get("max_abs_diff")
        print(f"| {row['case']} | {row['seconds']:.1f} | {row.get('call_seconds', 0):.1f} "
              f"| {row['peak_rss_mb']:,.0f} | {data or '—'} "
              f"| {'—' if check is None else f'{check:.1e}'} |")
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": machine_info(), "repo": str(REPO),
                                         "cases": rows}, indent=2))
    return 0 if all(r["returncode"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
