"""FP16: ModelOpt AutoCast verified per sample (``conversion``), run without AutoCast copying
the weights (``autocast_weights``), and onnxconverter-common's FP16 when AutoCast cannot
convert a graph (``onnxconverter_fallback``)."""
