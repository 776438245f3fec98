"""The ONNX Runtime CPU backend: the CPU-shaped graph (``fusion``) and its faster kernels
(``kernels``), INT8 on ONNX Runtime's integer kernels (``int8``) with the feed-forward outlier
channels kept in FP32 (``outlier_channels``), and ``--precision auto``'s timed choice
(``auto_choice``). The ``cpu_model`` stage runs it."""
