"""ONNX files: the one weight layout (``model.onnx`` + ``model.onnx.data``) and onnxsim without
the weights (onnx imported inside the functions)."""
