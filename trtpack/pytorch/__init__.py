"""PyTorch: loading a recipe's model and tokenizer, and torch.onnx's exporter (torch and
transformers imported inside the functions)."""
