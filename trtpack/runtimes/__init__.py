"""The runtimes trtpack runs models with, the only places sessions are made: ONNX Runtime on
the CPU (``onnxruntime``), TensorRT (``tensorrt``, its only importer), behind one runner
interface (``runner``), and Polygraphy set up around them without TensorRT
(``polygraphy_setup``)."""
