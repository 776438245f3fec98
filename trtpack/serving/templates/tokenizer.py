"""Triton Python-backend model written by trtpack: raw text in, the model's token tensors out.

Reads its settings from the ``parameters`` of its ``config.pbtxt`` and its tokenizer from the
``tokenizer/`` folder beside this file (``tokenizer.json``, loaded with the ``tokenizers``
package: local files only, no network at load time). Each request is padded to the shortest
of ``sequence_buckets`` that holds its longest text, and truncated to the longest bucket: the
buckets are lengths the engine's optimization profiles serve at every batch Triton's dynamic
batcher can form, and few of them let requests of different text lengths be batched together;
a request with more texts than ``max_texts`` (the model's max batch) is an error. With
``padding_side`` left, the buckets are every served length (extra left padding would move the
text's positions).

Needs ``numpy`` in the Python environment of the Triton server. ``tokenizers`` comes from
the ``vendor/`` folder beside this file when trtpack could ship it there (an abi3 Linux
build: one binary for Python 3.10+), else from the server's Python.
"""

import json
import os
import sys
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

FIELDS = ("ids", "attention_mask", "type_ids")


class TritonPythonModel:
    def initialize(self, args):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        folder = Path(args["model_repository"]) / args["model_version"]
        vendor = folder / "vendor"  # the tokenizers package trtpack ships with this model
        if vendor.is_dir() and str(vendor) not in sys.path:
            sys.path.insert(0, str(vendor))
        from tokenizers import Tokenizer

        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.tokenizer = Tokenizer.from_file(str(folder / params["tokenizer_file"]))
        self.min_len = int(params["min_sequence"])
        self.max_len = int(params["max_sequence"])
        self.pad_id = int(params["pad_id"])
        self.max_texts = int(params["max_texts"])
        self.buckets = sorted(json.loads(params.get("sequence_buckets") or "[]")
                              or {self.min_len, self.max_len})
        self.text_input = params["text_input"]
        self.fields = json.loads(params["outputs"])  # output name -> one of FIELDS
        self.pad_left = params.get("padding_side", "right") == "left"
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=self.max_len,
                                         direction=params.get("truncation_side", "right"))
        self.dtypes = {
            o["name"]: pb_utils.triton_string_to_numpy(o["data_type"]) for o in config["output"]
        }
        self.batched = int(config.get("max_batch_size", 0)) > 0
        for name, field in self.fields.items():
            if field not in FIELDS or name not in self.dtypes:
                raise ValueError(f"output '{name}': unknown field '{field}'")

    def encode(self, texts):
        flat = [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in texts.reshape(-1)]
        if len(flat) > self.max_texts:
            raise ValueError(f"{len(flat)} texts in one request; the model's profiles take at "
                             f"most {self.max_texts}")
        encodings = self.tokenizer.encode_batch(flat)
        longest = max((len(e.ids) for e in encodings), default=0)
        length = next((b for b in self.buckets if b >= longest), self.buckets[-1])
        arrays = {
            "ids": np.full((len(flat), length), self.pad_id, dtype=np.int64),
            "attention_mask": np.zeros((len(flat), length), dtype=np.int64),
            "type_ids": np.zeros((len(flat), length), dtype=np.int64),
        }
        for row, enc in enumerate(encodings):
            n = len(enc.ids)
            cols = slice(length - n, length) if self.pad_left else slice(0, n)
            arrays["ids"][row, cols] = enc.ids
            arrays["attention_mask"][row, cols] = enc.attention_mask
            arrays["type_ids"][row, cols] = enc.type_ids
        return arrays

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                texts = pb_utils.get_input_tensor_by_name(request, self.text_input).as_numpy()
                arrays = self.encode(texts)
                tensors = [
                    pb_utils.Tensor(name, arrays[field].astype(self.dtypes[name]))
                    for name, field in self.fields.items()
                ]
                responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            except Exception as e:  # one bad request must not fail the others
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))))
        return responses
