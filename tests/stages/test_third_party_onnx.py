"""Real ONNX files other projects ship inside PyPI wheels, built as a new user would: a
PP-OCRv4 text detector (a probability map; weights in Constant nodes that onnxsim cannot
simplify), the PP-OCRv4 recognizer (an OCR model: convolutions, attention MatMuls, a
softmax over characters) and silero-vad (a stateful voice-activity model: an LSTM state
carried between calls, a sample-rate input choosing an ``If`` branch).

FP32 must stay exact; FP16 (checked in ONNX Runtime on the CPU: no GPU here) must pass the
per-sample gate of generic outputs (``scaled_error``) at every profile corner with the share
of Conv/MatMul/Gemm in FP16 asserted per model. The wheels are fetched by ``make test``'s
set-up (``make third-party-wheels``) into ``$TRTPACK_THIRD_PARTY_WHEELS`` (default
``.cache/third-party-wheels``); without them these tests skip, saying so. Licences:
rapidocr-onnxruntime Apache-2.0 (its PaddleOCR models: Apache-2.0), silero-vad MIT.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]
WHEELS = Path(os.environ.get("TRTPACK_THIRD_PARTY_WHEELS",
                             str(ROOT / ".cache" / "third-party-wheels")))


@dataclass(frozen=True)
class WheelModel:
    package: str  # package==version
    member: str  # the ONNX file inside the wheel
    sha256: str

    @property
    def wheel(self) -> Path:
        name, version = self.package.split("==")
        return WHEELS / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"

    def extract(self, folder: Path) -> Path:
        if not self.wheel.is_file():
            pytest.skip(f"{self.wheel.name} is not in {WHEELS}: make test's set-up fetches "
                        "it (make third-party-wheels)")
        data = zipfile.ZipFile(self.wheel).read(self.member)
        assert hashlib.sha256(data).hexdigest() == self.sha256, f"{self.member} changed"
        path = folder / Path(self.member).name
        path.write_bytes(data)
        return path


DETECTOR = WheelModel("rapidocr-onnxruntime==1.4.4",
                      "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                      "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9")
RECOGNIZER = WheelModel("rapidocr-onnxruntime==1.4.4",
                        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b")
VAD = WheelModel("silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx",
                 "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3")

# what a user tells trtpack about each model (its README's shapes): nothing for the
# detector; the recognizer's fixed height of 48; silero's batch axis (second in its state),
# 576 samples a call (512 new + 64 of context) and its sample rate
FLAGS: dict[WheelModel, tuple[str, ...]] = {
    DETECTOR: ("--profile", "1x64x64:2x160x160:4x224x224"),
    RECOGNIZER: ("--input", "x=float32[batch,3,48,width]", "--profile", "1x80:2x160:4x320"),
    VAD: ("--input", "sr=16000", "--input", "input=float32[batch,576]=-1..1",
          "--input", "state=float32[2,batch,128]=-1..1", "--profile", "1:2:4"),
}
# the least share of Conv/MatMul/Gemm in FP16, per model (measured: detector 59/62, the
# recognizer 51/51; silero 6/12: its If bodies converted each as a graph of its own, the
# 16 kHz branch's 6 Conv in FP16; the 8 kHz branch stays FP32, as no sample at 16 kHz runs it)
MIN_FP16_SHARE = {DETECTOR: 0.9, RECOGNIZER: 0.9, VAD: 0.5}


def _build(model: WheelModel, tmp_path: Path, cache_dir: Path, precision: str
           ) -> dict[str, Any]:
    source = model.extract(tmp_path)
    target = ("--target", "g5", "--no-engine") if precision == "fp16" else ("--target", "cpu")
    result = run_cli("build", str(source), *target, "--precision", precision, "--out",
                     str(tmp_path / "out"), "--cache-dir", str(cache_dir), "--json",
                     *FLAGS[model])
    assert result.exit_code == 0, result.output
    report: dict[str, Any] = json.loads(result.stdout)
    assert report["verification"] and all(r["passed"] for r in report["verification"])
    return report


@pytest.mark.parametrize("model", [DETECTOR, RECOGNIZER, VAD],
                         ids=["ppocr-det", "ppocr-rec", "silero-vad"])
def test_fp32_of_a_third_party_onnx_is_exact(model: WheelModel, tmp_path: Path,
                                             cache_dir: Path) -> None:
    report = _build(model, tmp_path, cache_dir, "fp32")
    assert all(r["max_abs_diff"] == 0.0 for r in report["verification"])


@pytest.mark.parametrize("model", [
    DETECTOR, pytest.param(RECOGNIZER, marks=pytest.mark.slow), VAD],
    ids=["ppocr-det", "ppocr-rec", "silero-vad"])
def test_fp16_of_a_third_party_onnx_passes_per_sample(model: WheelModel, tmp_path: Path,
                                                      cache_dir: Path) -> None:
    report = _build(model, tmp_path, cache_dir, "fp16")
    precision = next(s for s in report["stages"] if s["name"] == "precision")
    stats = precision["metrics"]["low_precision"]
    assert stats["share"] >= MIN_FP16_SHARE[model], precision["message"]
    rows = [r for r in report["verification"] if r["check"] == "fp16-vs-fp32"]
    assert {r["metric"] for r in rows} == {"scaled_error"}
    assert min(r["metric_value"] for r in rows) >= 0.97  # 1 - max_scaled_error (0.03)
    if stats["share"] < 0.5:
        assert any("Conv/MatMul/Gemm nodes run in FP16" in w for w in report["warnings"])


def _stream(model: Path, tmp_path: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """20 chunks of 512 new samples (with 64 of context, as silero's own wrapper sends),
    the state carried from each call to the next, through the original and ``model``: per
    chunk, (speech probability, state) of each."""
    from trtpack.runtimes.onnxruntime import cpu_session

    sessions = [cpu_session(VAD.extract(tmp_path)), cpu_session(model)]
    t = np.arange(20 * 512 + 64) / 16000
    voice = np.sin(2 * np.pi * 220 * t) * (np.sin(2 * np.pi * 1.5 * t) > 0)
    audio = (0.5 * voice + 0.02 * np.random.default_rng(0).standard_normal(t.size)
             ).astype(np.float32)
    states = [np.zeros((2, 1, 128), np.float32) for _ in sessions]
    chunks: list[tuple[np.ndarray, np.ndarray]] = []
    for chunk in range(20):
        frame = audio[None, chunk * 512: chunk * 512 + 576]
        outs = []
        for k, session in enumerate(sessions):
            out, states[k] = session.run(None, {"input": frame, "state": states[k],
                                                "sr": np.array(16000, np.int64)})
            outs.append(out)
        chunks += [(outs[0], states[0]), (outs[1], states[1])]
    return chunks


def test_silero_vad_served_matches_the_original_over_a_stream(tmp_path: Path,
                                                              cache_dir: Path) -> None:
    """The FP32 served model gives the same speech probabilities and state, bit for bit."""
    _build(VAD, tmp_path, cache_dir, "fp32")
    chunks = _stream(tmp_path / "out" / "model_repository" / "silero_vad" / "1" / "model.onnx",
                     tmp_path)
    for (p0, s0), (p1, s1) in zip(chunks[::2], chunks[1::2], strict=True):
        np.testing.assert_array_equal(p0, p1)
        np.testing.assert_array_equal(s0, s1)
    probabilities = [float(p[0, 0]) for p, _ in chunks[::2]]
    assert max(probabilities) - min(probabilities) > 0.01  # it responds to the audio


def test_silero_vad_served_fp16_stays_within_the_gate_over_a_stream(tmp_path: Path,
                                                                    cache_dir: Path) -> None:
    """The FP16 model (its If bodies converted on their own) against the original over the
    same stream, the state carried (so errors could accumulate): every chunk's probability
    and state within the FP16 gate of generic outputs (scaled_error >= 0.97)."""
    from trtpack.verify.sample_metrics import scaled_error_per_sample

    _build(VAD, tmp_path, cache_dir, "fp16")
    chunks = _stream(tmp_path / "out" / "model_repository" / "silero_vad" / "1" / "model.onnx",
                     tmp_path)
    worst = min(float(scaled_error_per_sample(ref, out, {}, None).min())
                for (p0, s0), (p1, s1) in zip(chunks[::2], chunks[1::2], strict=True)
                for ref, out in ((p0, p1), (s0, s1)))
    assert 0.97 <= worst < 1.0  # FP16 indeed (not bit-exact), within the gate
