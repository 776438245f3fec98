"""trtpack: compile PyTorch / Hugging Face models into verified, ready-to-serve Triton models."""

__version__ = "0.1.0"
