"""TEST STAND-IN for Triton's onnxruntime backend (not shipped by trtpack).

The tritonserver bundled with nvidia-pytriton has only the Python backend, so the tests serve
the ``model.onnx`` that trtpack put in an ``onnxruntime_onnx`` model directory through this
Python-backend model instead: same file, same config I/O, ONNX Runtime on the CPU. It lets a
real server run the whole ensemble (tokenizer -> model -> postprocess) end to end.
"""

import json
from pathlib import Path

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import onnxruntime as ort

        config = json.loads(args["model_config"])
        folder = Path(args["model_repository"]) / args["model_version"]
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(str(folder / "model.onnx"), options,
                                            providers=["CPUExecutionProvider"])
        self.inputs = [i["name"] for i in config["input"]]
        self.outputs = [o["name"] for o in config["output"]]

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                feeds = {n: pb_utils.get_input_tensor_by_name(request, n).as_numpy()
                         for n in self.inputs}
                values = self.session.run(self.outputs, feeds)
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(n, v)
                                    for n, v in zip(self.outputs, values, strict=True)]))
            except Exception as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))))
        return responses
