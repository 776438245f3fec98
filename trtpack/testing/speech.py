"""Real speech for the audio models' INT8 checks: the 30-second two-speaker recording that
pyannote.audio ships in its wheel (``pyannote/audio/sample/sample.wav``, 16 kHz mono, read
out of the wheel, never installed), cut into 9-second windows and turned into the log power
spectrogram DNSMOS's P.835 models take: [901 frames, 161 bins] from a 320-point STFT, hop
160, periodic Hann window, centred (zero padding), log10 of the power floored at 1e-12, as
DNSMOS's own script computes it with librosa.

Calibration windows start in the recording's first 6 seconds (they cover 0-15 s); the
windows a build never sees start at 15 s or later (they cover 15-30 s): no sample of one
is in the other."""

from __future__ import annotations

import io
import wave

import numpy as np

SAMPLE_RATE = 16000
WINDOW_SAMPLES = 9 * SAMPLE_RATE  # 901 frames at hop 160
FFT_SIZE = 320
HOP = 160
CALIBRATION_STARTS = tuple(0.75 * k for k in range(9))  # seconds: 0 .. 6
UNSEEN_STARTS = tuple(15.0 + 1.0 * k for k in range(7))  # seconds: 15 .. 21


def read_wav(data: bytes) -> np.ndarray:
    """A 16-bit mono WAV file's samples in [-1, 1)."""
    with wave.open(io.BytesIO(data)) as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1:
            raise ValueError("expected 16-bit mono PCM")
        frames = w.readframes(w.getnframes())
    return np.frombuffer(frames, np.int16).astype(np.float32) / 32768.0


def log_power_spectrogram(audio: np.ndarray) -> np.ndarray:
    """[frames, FFT_SIZE // 2 + 1] log10 power spectrogram of ``audio`` (float32)."""
    padded = np.pad(audio.astype(np.float64), FFT_SIZE // 2)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(FFT_SIZE) / FFT_SIZE)
    frames = np.lib.stride_tricks.sliding_window_view(padded, FFT_SIZE)[::HOP] * window
    power = np.abs(np.fft.rfft(frames, axis=-1)) ** 2
    return np.log10(np.maximum(power, 1e-12)).astype(np.float32)


def dnsmos_features(audio: np.ndarray, starts: tuple[float, ...],
                    gains: tuple[float, ...] = (1.0,)) -> np.ndarray:
    """[len(starts) * len(gains), 901, 161]: the spectrogram of each 9-second window
    starting at ``starts`` (seconds), at each level in ``gains`` (a quieter speaker)."""
    windows = []
    for start in starts:
        first = round(start * SAMPLE_RATE)
        chunk = audio[first:first + WINDOW_SAMPLES]
        if len(chunk) < WINDOW_SAMPLES:
            raise ValueError(f"a window at {start} s runs past the recording's end")
        windows += [log_power_spectrogram(chunk * gain) for gain in gains]
    return np.ascontiguousarray(np.stack(windows))
