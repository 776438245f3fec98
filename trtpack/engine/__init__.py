"""TensorRT engines, the pure parts: profiles and builder settings, and provenance.

- ``builder``: profiles as TensorRT shapes, builder settings, timing-cache path,
  trtexec command
- ``provenance``: ``model.plan.json`` and whether an engine runs on a machine
- ``triton_release``: which Triton serves an engine (the TensorRT -> NGC release table)

The TensorRT calls are in ``trtpack.runtimes.tensorrt``; the engine's Triton config is in
``trtpack.serving.config``. Importing this package imports none of TensorRT, polygraphy,
torch or onnxruntime.
"""
