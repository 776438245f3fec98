"""Pipeline stages (run by ``trtpack.pipeline``, which they never import). Each stage's module
(``pipeline.stage.STAGES`` names them; ``base``, ``artifacts``, ``torch_export`` and
``cpu_int8_serving`` are helpers) defines two functions and imports heavy packages inside them:

    def fingerprint(plan: BuildPlan) -> JsonObject
        The options this stage's output depends on (JSON-able). Together with the keys of
        the stages before it and the tool versions it forms the stage's cache key.

    def run(ctx: StageContext) -> StageOutcome
        Reads upstream artifacts from the record ``ctx.artifacts`` (``artifacts.Artifacts``:
        one field per file a stage hands on, ``ctx.needs(...)`` for one it cannot do
        without), returns the ones it made in ``StageOutcome.artifacts``, writes only inside
        ``ctx.stage_dir``, reports progress with ``ctx.progress(msg)`` and logs details to
        ``ctx.log``; its ``StageOutcome.metrics`` is the stage's own ``StageMetrics``
        dataclass (``base.py``). Raises ``TrtpackError`` subclasses for the user's errors;
        any other exception becomes a ``StageError`` (exit 4) with the traceback in the log.

Which stage sets each artifact, and which model is served (``Artifacts.served_model``), is
written in ``artifacts.py``.
"""
