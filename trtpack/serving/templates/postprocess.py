"""Triton Python-backend model written by trtpack: the model's outputs to what a client wants.

Modes (``parameters.mode`` in its ``config.pbtxt``):
  ``mean_pooling``  token embeddings [batch, sequence, hidden] and the attention mask ->
                    the masked mean over the sequence, L2-normalised (sentence embeddings)
  ``normalize``     pooled embeddings [batch, hidden] -> L2-normalised
  ``softmax``       logits [batch, labels] -> probabilities, and the top label's name
                    (from ``labels.json`` beside this file: the model's id2label)
  ``sigmoid``       the same with an independent sigmoid per label (multi-label heads and
                    single-logit heads such as rerankers: transformers' pipeline rule)
  ``identity``      the same with the raw scores (regression heads)
  ``token_argmax``  logits [batch, sequence, classes] -> the name of the top class at every
                    position (``labels.json``: token labels, or the vocabulary for fill-mask)

Needs only ``numpy`` in the Python environment of the Triton server.
"""

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


def _normalize(x):
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norm, 1e-12)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.mode = params["mode"]
        self.values_input = params["values_input"]
        self.mask_input = params.get("mask_input", "")
        self.output = params["output"]
        self.label_output = params.get("label_output", "")
        self.labels = []
        classify = ("softmax", "sigmoid", "identity")
        if "labels_file" in params:  # written for the modes that name labels or tokens
            folder = Path(args["model_repository"]) / args["model_version"]
            self.labels = json.loads((folder / params["labels_file"]).read_text("utf-8"))
        if self.mode not in ("mean_pooling", "normalize", "token_argmax", *classify):
            raise ValueError(f"unknown mode '{self.mode}'")

    def run(self, request):
        values = pb_utils.get_input_tensor_by_name(request, self.values_input).as_numpy()
        values = values.astype(np.float32)
        if self.mode == "mean_pooling":
            mask = pb_utils.get_input_tensor_by_name(request, self.mask_input).as_numpy()
            mask = mask.astype(np.float32)[..., None]
            pooled = (values * mask).sum(axis=-2) / np.maximum(mask.sum(axis=-2), 1e-9)
            return [pb_utils.Tensor(self.output, _normalize(pooled).astype(np.float32))]
        if self.mode == "normalize":
            return [pb_utils.Tensor(self.output, _normalize(values).astype(np.float32))]
        if self.mode == "token_argmax":
            top = values.argmax(axis=-1)
            names = np.array([self.labels[i].encode("utf-8") for i in top.reshape(-1)],
                             dtype=np.object_).reshape(top.shape)
            return [pb_utils.Tensor(self.output, names)]
        if self.mode == "softmax":
            exp = np.exp(values - values.max(axis=-1, keepdims=True))
            probs = (exp / exp.sum(axis=-1, keepdims=True)).astype(np.float32)
        elif self.mode == "sigmoid":
            probs = (1.0 / (1.0 + np.exp(-values))).astype(np.float32)
        else:
            probs = values.astype(np.float32)
        top = probs.argmax(axis=-1)
        names = np.array([self.labels[i].encode("utf-8") for i in top.reshape(-1)],
                         dtype=np.object_).reshape((*top.shape, 1))
        return [pb_utils.Tensor(self.output, probs), pb_utils.Tensor(self.label_output, names)]

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self.run(request)))
            except Exception as e:  # one bad request must not fail the others
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))))
        return responses
