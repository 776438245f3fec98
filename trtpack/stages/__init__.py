"""Pipeline stages (run by ``trtpack.pipeline``, which they never import). Each stage's module
(``pipeline.stage.STAGES`` names them; ``base``, ``torch_export`` and ``cpu_int8_serving``
are helpers) defines two functions and imports heavy packages inside them:

    def fingerprint(options: BuildOptions) -> dict[str, Any]
        The options this stage's output depends on (JSON-able). Together with the keys of
        the stages before it and the tool versions it forms the stage's cache key.

    def run(ctx: StageContext) -> StageOutcome
        Reads upstream artifacts with ``ctx.artifact(name)``, writes only inside
        ``ctx.stage_dir``, reports progress with ``ctx.progress(msg)`` and logs details to
        ``ctx.log``; its ``StageOutcome.metrics`` is the stage's own ``StageMetrics``
        dataclass (``base.py``). Raises ``TrtpackError`` subclasses for the user's errors;
        any other exception becomes a ``StageError`` (exit 4) with the traceback in the log.

Artifacts by name (what each stage adds to ``ctx.artifacts``):

    export     onnx          model.onnx + model.onnx.data (the weights; the stage runs in a
                             process of its own, see ``Stage.isolated``)
               reference     reference.npz: inputs at every profile corner + PyTorch outputs
               tokenizer     tokenizer/ (tokenizer files), when the recipe has one
               model_config  config.json of the model (labels, geometry)
    import     (instead of export, for ``source: {onnx: ...}``) the same names: onnx (the
               user's ONNX, weights in model.onnx.data), reference (inputs + the outputs of
               that FP32 ONNX in ONNX Runtime), tokenizer and model_config when beside it
    simplify   onnx          the simplified model, weight matrices in model.onnx.data (or
                             export's, when onnxsim failed; a process of its own too)
    verify     fp32_outputs  fp32_outputs.npz: the same cases with ONNX Runtime FP32 outputs
    precision  precision_onnx  the FP16 / INT8 ONNX (skipped for fp32, and for INT8 with
                             --target cpu: see cpu_model)
               recipe_overlay  recipe overlay with the nodes kept in high precision
    cpu_model  cpu_fp32_onnx  fp32/model.onnx: the FP32 graph fused for ONNX Runtime (--target
                             cpu and --fallback-cpu only)
               cpu_onnx      what ONNX Runtime serves on the CPU: that, int8/model.onnx (the
                             integer-kernel INT8 form) or, when that fails its gates, the
                             precision_onnx
               precision_onnx, recipe_overlay  (INT8, --target cpu) in search/, only when
                             the first CPU INT8 form failed and the Q/DQ search ran here
                             (``cpu_int8_serving``)
    engine     engine        model.plan;  engine_provenance  model.plan.json;
               engine_trtexec  the equivalent trtexec command
    package    model_repository  model_repository/ (Triton), written last
"""
