"""INT8 for convolutions on the CPU: each model built with ``--precision int8 --target cpu``
(ONNX Runtime's static quantization of Conv/MatMul/Gemm, ``trtpack.stages.cpu_conv_int8``),
then its FP32 model and its INT8 candidate (served, or kept in ``artifacts/cpu_model/int8/``
where the build declined it) timed against each other at every profile corner, in rotation,
on the build's own corner inputs; with what the build reported: the Conv layers ONNX
Runtime runs on integer kernels, the candidate's worst sample, what was served and why.

    python benchmarks/cpu_conv_int8.py benchmarks/results/cpu-conv-int8.json \\
        [--models resnet-50,dnsmos-bak] [--seconds 4] [--work DIR]

Models: ``resnet-50`` (``--random-weights``, synthetic calibration, profile 1:2:4: the
newcomer's command of issue 46); ``dnsmos-bak`` (DNSMOS P.835's background/overall quality
model ``bak_ovr.onnx`` from the speechmos wheel: real weights, a regression head, 7 Conv;
calibrated and verified on log power spectrograms of real speech, the recording the
pyannote.audio wheel ships, ``trtpack.testing.speech``; profile 1:2:4); ``ppocr-det`` (the
PP-OCRv4 text detector from the rapidocr-onnxruntime wheel, calibrated on real pictures
scikit-image ships, profile 1x64x64:2x160x160:4x224x224: its candidate fails its gate, FP32
is served). The wheels are read from ``$TRTPACK_THIRD_PARTY_WHEELS``, default
``.cache/third-party-wheels`` (``make third-party-wheels``). Each build uses a fresh cache
in the work folder, so it is a cold build.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WHEELS = Path(os.environ.get("TRTPACK_THIRD_PARTY_WHEELS",
                             str(ROOT / ".cache" / "third-party-wheels")))
DETECTOR_WHEEL = "rapidocr_onnxruntime-1.4.4-py3-none-any.whl"
DETECTOR_MEMBER = "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"
DNSMOS_WHEEL = "speechmos-0.0.1.1-py3-none-any.whl"
DNSMOS_MEMBER = "speechmos/dnsmos_models/bak_ovr.onnx"
SPEECH_WHEEL = "pyannote_audio-4.0.7-py3-none-any.whl"
SPEECH_MEMBER = "pyannote/audio/sample/sample.wav"


def model_args(name: str, work: Path) -> list[str]:
    """The ``trtpack build`` arguments of each benchmarked model."""
    if name == "resnet-50":
        return ["resnet-50", "--random-weights", "--profile", "1:2:4"]
    if name == "ppocr-det":
        from trtpack.testing.pictures import CALIBRATION_PICTURES, ppocr_pictures

        source = work / "ppocr-det.onnx"
        source.write_bytes(zipfile.ZipFile(WHEELS / DETECTOR_WHEEL).read(DETECTOR_MEMBER))
        pictures = work / "pictures.npz"
        np.savez(pictures, x=ppocr_pictures(CALIBRATION_PICTURES, 160, 2))
        return [str(source), "--profile", "1x64x64:2x160x160:4x224x224",
                "--calibration", str(pictures)]
    if name == "dnsmos-bak":
        from trtpack.testing.speech import CALIBRATION_STARTS, dnsmos_features, read_wav

        source = work / "bak_ovr.onnx"
        source.write_bytes(zipfile.ZipFile(WHEELS / DNSMOS_WHEEL).read(DNSMOS_MEMBER))
        audio = read_wav(zipfile.ZipFile(WHEELS / SPEECH_WHEEL).read(SPEECH_MEMBER))
        calibration, samples = work / "speech.npz", work / "speech-samples.npz"
        np.savez(calibration, input_1=dnsmos_features(audio, CALIBRATION_STARTS, (1.0, 0.3)))
        np.savez(samples, input_1=dnsmos_features(audio, CALIBRATION_STARTS[1::4], (0.6,)))
        return [str(source), "--profile", "1:2:4", "--calibration", str(calibration),
                "--sample-inputs", str(samples)]
    raise SystemExit(f"unknown model {name!r}: resnet-50, dnsmos-bak or ppocr-det")


def timed(out: Path, seconds: float) -> dict[str, dict[str, float]]:
    """p50 (ms) of FP32 and of the INT8 candidate at each profile corner, in rotation."""
    from trtpack.cases import load_cases
    from trtpack.runtimes.onnxruntime import cpu_session
    from trtpack.timing import measure_interleaved

    report = json.loads((out / "report.json").read_text())
    fp32 = out / "artifacts" / "cpu_model" / "fp32" / "model.onnx"
    int8 = out / "artifacts" / "cpu_model" / "int8" / "model.onnx"
    if not int8.is_file():  # served: the repository's model
        int8 = next((out / "model_repository").glob("*/1/model.onnx"))
    assert report["stages"], report
    sessions = {"fp32": cpu_session(fp32, spinning=False),
                "int8": cpu_session(int8, spinning=False)}
    found: dict[str, dict[str, float]] = {"fp32": {}, "int8": {}}
    for case in load_cases(out / "artifacts" / "verify" / "fp32_outputs.npz"):
        label = f"p{case.profile}.{case.corner}"
        calls = {name: (lambda s=s, f=dict(case.inputs): s.run(None, f))
                 for name, s in sessions.items()}
        for name, timing in measure_interleaved(calls, seconds).items():
            found[name][label] = round(statistics.median(timing.latencies_s) * 1000, 3)
    return found


def run(name: str, work: Path, seconds: float) -> dict[str, Any]:
    out = work / f"{name}-out"
    command = [sys.executable, "-m", "trtpack.cli", "build", *model_args(name, work),
               "--target", "cpu", "--precision", "int8", "--out", str(out),
               "--cache-dir", str(work / f"{name}-cache"), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"model": name, "exit": done.returncode, "error": done.stderr[-2000:]}
    report = json.loads(done.stdout)
    stage = next(s for s in report["stages"] if s["name"] == "cpu_model")
    metrics = stage["metrics"]
    return {"model": name, "exit": 0, "served": report["precision"],
            "why_fp32": metrics.get("int8_fp32_reason"),
            "candidate": metrics.get("int8_candidate"), "build_seconds": report["total_seconds"],
            "cpu_model_seconds": stage["seconds"], "p50_ms": timed(out, seconds),
            "command": " ".join(["trtpack", *command[3:]])}


def cpu_name() -> str:
    """The CPU's model name (``lscpu``'s), else the platform's word for it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path)
    parser.add_argument("--models", default="resnet-50,dnsmos-bak")
    parser.add_argument("--seconds", type=float, default=4.0, help="timing per corner")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="cpu-conv-int8-"))
    work.mkdir(parents=True, exist_ok=True)
    results = [run(name, work, args.seconds) for name in args.models.split(",")]
    load = os.getloadavg()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=False).stdout.strip()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(),
                    "load_average": [round(v, 2) for v in load]},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit,
        "results": results}, indent=2) + "\n")
    print(f"{cpu_name()}, {os.cpu_count()} cores, commit {commit}, load average "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} (loaded above ~1)")
    print("| model | served | integer Conv | worst sample | corner | FP32 p50 ms | "
          "INT8 p50 ms | INT8/FP32 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        if r["exit"] != 0:
            print(f"| {r['model']} | exit {r['exit']} | | | | | | |")
            continue
        c = r["candidate"] or {}
        worst = c.get("worst")
        for corner, fp32 in r["p50_ms"]["fp32"].items():
            int8 = r["p50_ms"]["int8"][corner]
            print(f"| {r['model']} | {r['served']} | {c.get('integer_convs')}/"
                  f"{c.get('weight_convs')} | "
                  f"{'' if worst is None else f'{worst:.4f}'} | {corner} | {fp32:.1f} | "
                  f"{int8:.1f} | {int8 / fp32:.2f} |")
        if r["why_fp32"]:
            print(f"{r['model']}: FP32 served: {r['why_fp32']}")


if __name__ == "__main__":
    main()
