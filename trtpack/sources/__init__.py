"""What a model is and where it comes from: recipes (schema and files), resolving MODEL, recipes
inferred from Hugging Face directories and ONNX files, the task heads, tokenizer files."""
