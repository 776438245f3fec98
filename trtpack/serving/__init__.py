"""Triton model repositories: configs from Triton's own protobuf schema, and their layout.

- ``config``: ``config.pbtxt`` for every platform (ONNX Runtime, TensorRT, Python, the one
  warm-up writer), read / write / check against a model's real I/O
- ``layout``: the repository's folders and files; ``repository``: writes one for a build
- ``tokenizer_model``, ``postprocess``, ``ensemble``: the ``--serve text`` models
- ``merge`` (with ``engine_builds``): one model for a fleet of GPU families
- ``tuning``: perf_analyzer / Model Analyzer files
- ``package_formats``: what ``trtpack package --format`` writes, one module per format
  (``sagemaker``: SageMaker archives)

serving imports ``engine`` (provenance), never the reverse. (Not named ``triton``: a package
or folder of that name shadows the ``triton`` package that torch imports.)
"""
