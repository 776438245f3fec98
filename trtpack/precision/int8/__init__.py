"""INT8 as Q/DQ (ModelOpt PTQ) for TensorRT: the conversion (``conversion``, with its
``summary``), the optional percentile ``activation_ranges``, and the accuracy-driven fallback
(``fallback``, its measured ``search`` over ``surrogates``)."""
