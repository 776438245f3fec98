"""What one build is asked to do: ``BuildRequest``, the one declaration of every ``trtpack
build`` option (each field's type and default, and in its ``OptionSpec`` the help, metavar,
choices and the recipe key it overrides: the CLI's parameters and the Python keywords are made
from it), and ``BuildPlan``, the request resolved and validated (``api.resolve_options`` makes
it; the pipeline and every stage read it)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import Field, dataclass, field, fields, replace
from pathlib import Path
from typing import Literal, get_args

from trtpack.errors import UserInputError
from trtpack.machine.paths import CACHE_URL_VARIABLE, CacheUrl, default_cache_dir
from trtpack.machine.targets import AUTO, HARDWARE_COMPATIBILITY, Target
from trtpack.shapes import ShapeProfile
from trtpack.sources.heads import task_help
from trtpack.sources.recipe import (
    AUTO_PRECISION,
    CALIBRATION_METHODS,
    PRECISIONS,
    SERVE_MODES,
    CalibrationMethod,
    Precision,
    Recipe,
    Serve,
)

Fallback = Literal["auto", "off"]
NO_COMPILE_CHECK_ENV = "TRTPACK_NO_COMPILE_CHECK"
"""Set to 1: every build skips the compile check, as ``--no-compile-check`` (a test suite or
CI job whose subject is not the check)."""


def compile_check_wanted(requested: bool) -> bool:
    """The compile check runs when asked for (the default) and not switched off for the
    whole environment (``NO_COMPILE_CHECK_ENV``)."""
    return requested and os.environ.get(NO_COMPILE_CHECK_ENV, "0") in ("", "0")


OptionKind = Literal["value", "path", "list"]
"""How a field's value is read: as given; a ``str`` becomes a ``Path``; one ``str`` or several
(a repeatable option: ``--profile``, ``--set``, ``--input``)."""


@dataclass(frozen=True)
class OptionSpec:
    """How one ``BuildRequest`` field is offered. ``flags``: typer's parameter declarations
    (default: ``--`` and the field's name with dashes); ``inverted``: a flag that sets the
    field to False (``--no-engine`` is ``build_engine``); ``recipe_key``: the recipe setting
    the option overrides (dotted; None: the option is the run's, not the model's); ``kind``:
    how its value is read (``OptionKind``); ``choices``: the words it takes (any case),
    checked by ``check_choices``."""

    help: str | Callable[[], str]
    metavar: str | None = None
    flags: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    recipe_key: str | None = None
    inverted: bool = False
    argument: bool = False  # a positional argument (MODEL), not an --option
    kind: OptionKind = "value"

    @property
    def help_text(self) -> str:
        return self.help() if callable(self.help) else self.help


def spec(help: str | Callable[[], str], *, metavar: str | None = None,
         flags: tuple[str, ...] = (), choices: tuple[str, ...] = (),
         recipe_key: str | None = None, inverted: bool = False,
         argument: bool = False, kind: OptionKind = "value") -> Mapping[str, OptionSpec]:
    """A ``BuildRequest`` field's metadata: its ``OptionSpec``."""
    return {"option": OptionSpec(help, metavar, flags, choices, recipe_key, inverted, argument,
                                 kind)}


def option_spec(request_field: Field[object]) -> OptionSpec:
    """The ``OptionSpec`` of a ``BuildRequest`` field (``dataclasses.fields``)."""
    found = request_field.metadata["option"]
    assert isinstance(found, OptionSpec), request_field.name
    return found


@dataclass
class BuildRequest:
    """What the user asked for, before resolution: one field per ``trtpack build`` option, in
    the order ``--help`` lists them; ``trtpack.build``'s keywords are the same (their names
    the CLI's: ``OptionSpec.flags``). A new option is a field here and the code that uses it
    (``tests/cli/test_option_spec.py``)."""

    model: str | Path = field(metadata=spec(
        "A recipe name (trtpack recipes list), a recipe YAML file, an ONNX file, a "
        "local Hugging Face model directory, an org/name id in the local Hugging Face "
        "cache, a PyTorch factory (path/to/file.py:make_model or my_pkg.models:make_model), "
        "a torch.export file (model.pt2) or a TorchScript file (model.pt, model.jit).",
        metavar="MODEL", argument=True))
    profiles: str | Sequence[str] = field(default=(), metadata=spec(  # one string, or several
        "Shape profile MIN:OPT:MAX over the dynamic axes, e.g. 1x128:16x128:128x128 "
        "(batch x sequence), or per input: 'input_ids=1x128:16x128:128x128,...'. Repeat for "
        "several optimization profiles. Default: the recipe's.",
        flags=("--profile", "-p"), metavar="MIN:OPT:MAX", recipe_key="profiles", kind="list"))
    precision: str | None = field(default=None, metadata=spec(
        "fp32, fp16 (ModelOpt AutoCast), int8 (ModelOpt Q/DQ), or auto (CPU: build fp32 "
        "and int8, time both, keep the fastest that passes). Default: the recipe's.",
        choices=(*PRECISIONS, AUTO_PRECISION), recipe_key="precision"))
    target: str = field(default=AUTO, metadata=spec(
        "cpu, an instance family (g4dn, g5, p4d, p5 …; see trtpack targets), or auto "
        "(the local GPU if it has TensorRT, else cpu).", metavar="TARGET"))
    opset: int | None = field(default=None, metadata=spec(
        "ONNX opset. Default: the recipe's.", metavar="N", recipe_key="opset"))
    random_weights: bool = field(default=False, metadata=spec(
        "Build from the recipe's architecture config with random "
        "weights (no weight download).", recipe_key="source.random_weights"))
    out: Path | None = field(default=None, metadata=spec(
        "Output folder (default build/<name>); replaced only when the build succeeds.",
        metavar="DIR", kind="path"))
    build_engine: bool = field(default=True, metadata=spec(
        "Stop before the TensorRT engine (everything else is built).",
        flags=("--no-engine",), inverted=True))
    compile_check: bool = field(default=True, metadata=spec(
        "GPU builds with --no-engine: do not compile the engine's network with TensorRT-RTX "
        "on this CPU (the compile check; on when tensorrt_rtx is installed; also off with "
        f"{NO_COMPILE_CHECK_ENV}=1).",
        flags=("--no-compile-check",), inverted=True))
    calibration: Path | None = field(default=None, metadata=spec(
        "INT8 calibration data: a text file (one sample a line), a "
        ".jsonl (its \"text\" field, one object a line) or a .npz of inputs.",
        metavar="FILE", recipe_key="precision_options.int8.calibration", kind="path"))
    fallback: str = field(default="auto", metadata=spec(  # a Fallback once validated
        "auto: keep sensitive nodes in higher precision until verification passes; off.",
        choices=get_args(Fallback)))
    serve: str | None = field(default=None, metadata=spec(  # None: the recipe's
        "tensor: clients send tensors; text: add a tokenizer and post-processing "
        "ensemble so clients send text. Default: the recipe's (triton.serve).",
        choices=SERVE_MODES, recipe_key="triton.serve"))
    fallback_cpu: bool | None = field(default=None, metadata=spec(  # None: the recipe's
        "Also emit an ONNX Runtime model with CPU "
        "instances beside a TensorRT model. Default: the recipe's.",
        flags=("--fallback-cpu/--no-fallback-cpu",), recipe_key="triton.fallback_cpu"))
    portable: str | None = field(default=None, metadata=spec(
        "Engine hardware compatibility: ampere+ (runs on any GPU of compute capability "
        "8.0+, a little slower) or same_compute_capability. Default: the recipe's.",
        metavar="MODE", choices=HARDWARE_COMPATIBILITY,
        recipe_key="engine.hardware_compatibility"))
    overrides: str | Sequence[str] = field(default=(), metadata=spec(
        "Override a recipe setting; repeatable, VALUE is YAML. E.g. "
        "triton.instance_count=2, triton.max_queue_delay_us=500, triton.response_cache=true; "
        "every key: trtpack recipes show NAME.", flags=("--set",), metavar="KEY=VALUE",
        kind="list"))
    cache_dir: Path | None = field(default=None, metadata=spec(
        "Stage cache folder (default ~/.cache/trtpack, or $TRTPACK_CACHE_DIR).",
        metavar="DIR", kind="path"))
    cache_url: str | None = field(default=None, metadata=spec(
        "A stage cache shared through an S3-compatible object store, behind the local one "
        f"(default ${CACHE_URL_VARIABLE}): entries are downloaded, checked against their "
        "recorded hashes and used; what this build makes is published. Credentials from the "
        "AWS chain (never in the URL), the store's address from AWS_ENDPOINT_URL. A store "
        "that fails costs one warning, never the build.", metavar="s3://BUCKET/PREFIX"))
    task: str | None = field(default=None, metadata=spec(
        task_help, metavar="TASK", recipe_key="task"))
    use_cache: bool = field(default=True, metadata=spec(
        "Rebuild every stage.", flags=("--no-cache",), inverted=True))
    timing_cache: Path | None = field(default=None, metadata=spec(
        "A TensorRT timing-cache folder to share (e.g. across a CI matrix): one file per "
        "GPU (model and compute capability) and TensorRT version, read and updated; sha256 "
        "before/after in the report. Default: under --cache-dir.",
        metavar="DIR", kind="path"))
    calibration_method: str | None = field(default=None, metadata=spec(
        "INT8 activation ranges: max, entropy, percentile (99.99th), mse (least squared "
        "error over a histogram, NVIDIA's histogram calibrator's) or auto (max or mse, "
        "whichever model is better on the build's search split; the held-out split is not "
        "consulted). Default: the recipe's (precision_options.int8.calibration_method).",
        choices=CALIBRATION_METHODS, recipe_key="precision_options.int8.calibration_method"))
    tokenizer: Path | None = field(default=None, metadata=spec(
        "The tokenizer, when it is not beside the model (e.g. an ONNX file from "
        "elsewhere): a folder with tokenizer.json or vocab.txt, or that file. Verification "
        "then draws real token ids, and --serve text works.",
        metavar="PATH", recipe_key="tokenizer_source", kind="path"))
    min_int8_share: float = field(default=0.5, metadata=spec(
        "INT8: ship only when at least this share of the served model's MatMul/Gemm "
        "runs in INT8, counted as it runs (GPU: MatMul/Gemm with Q/DQ inputs; CPU: weight "
        "MatMuls on ONNX Runtime's integer kernels), else exit 1 naming the share.",
        metavar="SHARE"))
    force: bool = field(default=False, metadata=spec(
        "Build into an --out that holds files trtpack did not write: they are "
        "kept (never deleted), the build's files are written beside them.",))
    inputs: str | Sequence[str] = field(default=(), metadata=spec(
        "What an input is and which values it takes; repeatable. NAME=DTYPE[DIM,...] "
        "(input=float32[batch,3,224,224]: a DIM a size or an axis name, [] a scalar), "
        "NAME=VALUE (a constant: sr=16000), NAME=LOW..HIGH (a range: pixels=0..1; whole "
        "numbers for an integer input), or NAME=DTYPE[DIM,...]=VALUE. A constant stays a "
        "served input: it is fed in verification and calibration and to perf_analyzer.",
        flags=("--input",), metavar="NAME=...", recipe_key="inputs", kind="list"))
    sample_inputs: Path | None = field(default=None, metadata=spec(
        "Real inputs for verification (and INT8 calibration unless --calibration is "
        "given): one array per input named by it, the batch on the first axis, a scalar as a "
        "0-d array. Used at each profile corner its sizes fit; checked before any work.",
        metavar="FILE.npz", kind="path"))
    skip_memory_check: bool = field(default=False, metadata=spec(
        "Build even when the memory estimate of a profile corner "
        "(weights plus activations at its shapes, per stage) exceeds the memory available "
        "here (the cgroup's limit, else MemAvailable)."))

    def __post_init__(self) -> None:
        """Paths given as ``str`` (Python callers) become ``Path``s; one profile, input or
        override string is a list of one."""
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, str) and option_spec(f).kind == "path":
                setattr(self, f.name, Path(value))
            elif isinstance(value, str) and is_list(f):
                setattr(self, f.name, [value])
        if isinstance(self.model, Path):
            self.model = str(self.model)


def keyword(request_field: Field[object]) -> str:
    """The CLI's (and ``trtpack.build``'s) name of a request field: ``build_engine`` is
    ``no_engine``, ``overrides`` is ``set``, ``fallback_cpu`` stays."""
    return flag(request_field).removeprefix("--").replace("-", "_")


def is_list(request_field: Field[object]) -> bool:
    """A repeatable option (``--profile``, ``--set``, ``--input``): one string or several."""
    return option_spec(request_field).kind == "list"


def flag(request_field: Field[object]) -> str:
    """The option as a user writes it: ``--calibration-method``, ``--no-engine``, ``--set``."""
    flags = option_spec(request_field).flags
    return flags[0].split("/")[0] if flags else "--" + request_field.name.replace("_", "-")


def one_of(words: Sequence[str]) -> str:
    """``a, b or c``."""
    return f"{', '.join(words[:-1])} or {words[-1]}" if len(words) > 1 else "".join(words)


def check_choices(request: BuildRequest) -> BuildRequest:
    """``request`` with the word of each option that has choices (``OptionSpec.choices``)
    read case-insensitively (--precision FP16, --serve Text) and checked: a word outside
    them is the user's error, one message per option naming its choices."""
    checked = replace(request)
    for f in fields(request):
        choices, value = option_spec(f).choices, getattr(request, f.name)
        if not choices or value is None:
            continue
        word = str(value).strip().lower()
        if word not in choices:
            raise UserInputError(f"{flag(f)} must be {one_of(choices)}, not '{value}'")
        setattr(checked, f.name, word)  # each option with choices is a str field
    return checked


def keyword_default(request_field: Field[object]) -> object:
    """A keyword's default: a list option's is None (no value given), an inverted flag's
    off."""
    if is_list(request_field):
        return None
    if option_spec(request_field).inverted:
        return not request_field.default
    return request_field.default


def request_from_keywords(values: Mapping[str, object],
                          request_type: type[BuildRequest] = BuildRequest) -> BuildRequest:
    """The request for keyword values (the CLI's parameters, ``trtpack.build``'s keywords),
    by ``keyword``; a keyword not given takes its default."""
    given: dict[str, object] = {}  # each field's own type, checked where the values come from
    for f in fields(request_type):
        value = values.get(keyword(f), keyword_default(f))
        if option_spec(f).inverted:
            value = not value
        elif is_list(f) and value is None:
            value = ()
        given[f.name] = value
    # each value is the field's default or the caller's value for that very field, typed by
    # the CLI's parameters and trtpack.build's keywords: mypy cannot follow names in a loop
    return request_type(**given)  # type: ignore[arg-type]


@dataclass(frozen=True)
class FixedPrecision:
    """One precision, built and served: ``--precision fp32|fp16|int8`` (or the recipe's)."""

    name: Precision

    @classmethod
    def named(cls, name: str) -> FixedPrecision:
        """``name`` (fp32, fp16 or int8) as a fixed precision; another word is the user's
        error, naming the choices."""
        for known in PRECISIONS:
            if name == known:
                return cls(known)
        raise UserInputError(f"precision must be {one_of((*PRECISIONS, AUTO_PRECISION))}, "
                             f"not '{name}'")

    @property
    def built(self) -> Precision:
        return self.name


@dataclass(frozen=True)
class AutoPrecision:
    """``--precision auto``: the candidates are built, timed where ``timed_on`` says (ONNX
    Runtime on this CPU, ``trtpack.precision.cpu.auto_choice``) and the fastest that passes is
    served; the precision stages build ``built``, the candidate beside the FP32 model."""

    candidates: tuple[Precision, ...] = ("fp32", "int8")
    timed_on: Literal["cpu"] = "cpu"
    built: Precision = "int8"


PrecisionChoice = FixedPrecision | AutoPrecision


@dataclass(frozen=True)
class BuildPlan:
    """Everything one build needs, resolved and validated (``api.resolve_options`` makes it).
    ``precision`` is what the precision stages build; ``precision_choice`` says whether it
    is the one served or a candidate of ``--precision auto``."""

    recipe: Recipe
    profiles: tuple[ShapeProfile, ...]
    precision_choice: PrecisionChoice
    target: Target
    out_dir: Path
    opset: int
    random_weights: bool = BuildRequest.random_weights
    build_engine: bool = BuildRequest.build_engine
    compile_check: bool = BuildRequest.compile_check
    calibration: Path | None = None
    fallback: Fallback = "auto"
    serve: Serve = "tensor"
    fallback_cpu: bool = False
    cache_dir: Path = field(default_factory=default_cache_dir)
    cache_url: CacheUrl | None = None  # --cache-url: the remote cache behind cache_dir
    use_cache: bool = BuildRequest.use_cache
    seed: int = 0
    timing_cache: Path | None = None  # --timing-cache DIR: a TensorRT timing-cache folder to share
    calibration_method: CalibrationMethod | None = None  # None: the recipe's
    min_int8_share: float = BuildRequest.min_int8_share  # INT8 ships only at this share
    force: bool = BuildRequest.force  # build into an --out that holds files trtpack did not write
    sample_inputs: Path | None = None  # --sample-inputs FILE.npz: real inputs for verification
    # a PyTorch source's identity: its files' contents (``sources.torch_sources.SourceFiles``)
    source_files: str | None = None
    # the export stage's process traces the PyTorch model for the memory pre-check before the
    # export (``pipeline.memory_check.check_in_export``); ``api.build`` sets it
    check_memory_in_export: bool = False

    @property
    def name(self) -> str:
        return self.recipe.name

    @property
    def precision(self) -> Precision:
        """The precision the precision stages build (``int8`` for ``--precision auto``)."""
        return self.precision_choice.built

    @property
    def auto_precision(self) -> bool:
        """``--precision auto`` (CPU): the CPU model stage times the FP32 and INT8 forms and
        serves the fastest that passes (``trtpack.precision.cpu.auto_choice``)."""
        return isinstance(self.precision_choice, AutoPrecision)
