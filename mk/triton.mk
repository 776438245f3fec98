# A venv with nvidia-pytriton's bundled tritonserver (Triton 2.51, Python backend only) for the
# tests marked `triton`. Its own venv: nvidia-pytriton needs numpy<2. onnxruntime and
# tokenizers are for the Python-backend models the tests serve (tokenizer, ORT stand-in).
# Include from the Makefile (`include mk/triton.mk`) and make `test` depend on `triton-env`.
TRITON_VENV ?= .venv-triton
TRITON_STAMP := $(TRITON_VENV)/.trtpack-triton-installed

.PHONY: triton-env
triton-env: $(TRITON_STAMP)

$(TRITON_STAMP): mk/triton.mk
	$(PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(TRITON_VENV)/bin/python -m pip install --quiet "nvidia-pytriton==0.7.0" "numpy<2" \
		"onnxruntime>=1.18" "tokenizers>=0.19"
	touch $(TRITON_STAMP)
