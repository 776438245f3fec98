"""TensorRT engines, the pure parts: profiles and builder settings, and provenance.

- ``builder_settings``: profiles as TensorRT shapes, builder settings, timing-cache path,
  trtexec command
- ``provenance``: ``model.plan.json`` and whether an engine runs on a machine

The TensorRT calls are in ``trtpack.runtimes.tensorrt``; the engine's Triton config is in
``trtpack.serving.config``. Importing this package imports none of TensorRT, polygraphy,
torch or onnxruntime.
"""
