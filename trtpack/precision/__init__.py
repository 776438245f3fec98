"""FP16 and INT8 at the ONNX level (ModelOpt), verified per sample, with an accuracy-driven
fallback. Shared here: ``conversion`` (the framework both precisions run in), ``metrics``,
``graph``, ``module_paths``, ``source``, ``smoothquant`` and the ModelOpt worker
(``modelopt_jobs`` + ``modelopt_worker``); the parts: ``fp16/``, ``int8/`` (Q/DQ for TensorRT
and its accuracy search), ``calibration/`` (samples, files, splits) and ``cpu/`` (the ONNX
Runtime CPU backend). The precision stage (``trtpack.stages.precision``) and the ``cpu_model``
stage run it."""
