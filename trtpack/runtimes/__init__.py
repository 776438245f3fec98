"""The runtimes trtpack runs models with: ONNX Runtime (CPU) here; TensorRT in ``engine``."""
