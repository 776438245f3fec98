"""Calibration data: the samples (``data``: the default text, synthetic inputs, feeds saved
for the worker), the files a user gives (``files``), their split into calibration / search /
check / held-out (``splits``), and text tokenized into model inputs (``text_batches``)."""
