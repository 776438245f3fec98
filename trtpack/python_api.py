"""``build(model, ...)``, exposed as the package's own ``build``: the build from Python
(notebooks, CI scripts).

``model`` is anything ``trtpack build`` takes (a recipe name, a file, a folder, a factory
``file.py:make_model``), as ``str`` or ``Path``, or a ``torch.nn.Module`` object. The keywords
are the CLI's option names (``--random-weights`` is ``random_weights``, ``--set`` is ``set``,
``--input`` is ``input``); a profile or an input may be one string or a list.

A module object is exported here, in the caller's process, with ``torch.export`` to a ``.pt2``
under the cache folder (its class may live in a notebook or ``__main__``, which the build's
stage processes cannot import); the ``.pt2`` is named by the module's parameters and buffers,
its class and its example inputs, so the same module is exported once and builds from the
stage cache after that. The result is typed (``BuiltModel``); an accuracy failure raises
``AccuracyError`` with the report on it (``error.report``).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, get_type_hints

import numpy as np

from trtpack.api import build as run_build
from trtpack.errors import UserInputError, first_line
from trtpack.machine.paths import default_cache_dir
from trtpack.options import (
    BuildRequest,
    keyword,
    keyword_default,
    option_spec,
    request_from_keywords,
)
from trtpack.out_files import REPOSITORY
from trtpack.pipeline.build_folder import served_model_file
from trtpack.report import BuildReport
from trtpack.shapes import BATCH_AXIS, TensorSpec, parse_profiles
from trtpack.sources.recipe import safe_name
from trtpack.stages.base import ProgressCallback

if TYPE_CHECKING:
    import torch

    TorchModule = torch.nn.Module
    ExampleValue = torch.Tensor | int | float | bool | str  # a constant: a non-tensor argument
    ExampleInputs = ExampleValue | tuple[ExampleValue, ...] | Mapping[str, ExampleValue]

DEFAULT_BATCH_MAX = 8  # a module object's batch without --profile: 1:4:8, as a factory's


@dataclass(frozen=True)
class BuiltModel:
    """A finished build: its report, where it is, and the served model to run."""

    report: BuildReport
    out_dir: Path
    model_repository: Path  # OUT/model_repository: give it to tritonserver --model-repository
    served_model: Path  # model.onnx (or model.plan) inside the repository

    @property
    def ok(self) -> bool:
        return self.report.status == "ok"

    def run(self, inputs: Mapping[str, np.ndarray | torch.Tensor]) -> dict[str, np.ndarray]:
        """The served ONNX model's outputs for ``inputs`` (name -> array or tensor), on ONNX
        Runtime's CPU provider: what Triton's onnxruntime backend runs. A TensorRT engine
        runs only on its GPU: use Triton (or ``trtpack bench``) for that."""
        if self.served_model.suffix != ".onnx":
            raise UserInputError(f"{self.served_model.name} is a TensorRT engine: run it "
                                 "through Triton on its GPU (or build with --target cpu)")
        from trtpack.runtimes.onnxruntime import cpu_session

        session = cpu_session(self.served_model)
        feeds = {name: np.asarray(value.detach().cpu().numpy() if hasattr(value, "detach")
                                  else value) for name, value in inputs.items()}
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, feeds), strict=True))


OptionValue = str | Path | Sequence[str] | bool | float | int | None


def build(model: str | Path | TorchModule, *, example_inputs: ExampleInputs | None = None,
          progress: ProgressCallback | None = None,
          on_warning: Callable[[str], None] | None = None,
          **options: OptionValue) -> BuiltModel:
    """Build ``model`` as ``trtpack build`` does (module docstring): ``options`` are the
    command's (``trtpack.options.BuildRequest``, by their CLI names). ``example_inputs`` (a
    tensor, a tuple or a dict of them) are a module object's inputs for ``torch.export``:
    their first dim is the batch; without them, ``input`` describes each input."""
    known = {keyword(f) for f in fields(BuildRequest) if not option_spec(f).argument}
    for name in options:
        if name not in known:
            raise TypeError(f"build() got an unexpected keyword argument '{name}'")
    cache_dir = options.get("cache_dir")
    cache = Path(cache_dir) if isinstance(cache_dir, str | Path) else default_cache_dir()
    profiles, inputs, overrides = (as_list(options.get(k)) for k in ("profile", "input", "set"))
    if not isinstance(model, str | Path):
        vocab = getattr(getattr(model, "config", None), "vocab_size", None)
        if isinstance(vocab, int) and not any(o.startswith("vocab_size=") for o in overrides):
            overrides.append(f"vocab_size={vocab}")  # token ids drawn inside its vocabulary
        model = export_module(model, example_inputs, inputs, profiles, cache)
        inputs = [text for text in inputs if "[" not in text]  # the .pt2 has them
    elif example_inputs is not None:
        raise UserInputError("example_inputs are for a torch.nn.Module object; a factory "
                             "returns its own (module, example inputs)")
    request = request_from_keywords({**options, "model": str(model), "profile": profiles,
                                     "input": inputs, "set": overrides, "cache_dir": cache})
    built = run_build(request, progress, on_warning)
    repository = built.out_dir / REPOSITORY
    served = served_model_file(built.report, built.out_dir)
    return BuiltModel(built.report, built.out_dir, repository,
                      repository if served is None else served)


def as_list(value: OptionValue) -> list[str]:
    """A keyword that takes one string or several, as a list."""
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value] if isinstance(value, Sequence) else []


def keyword_signature(request_type: type[BuildRequest] = BuildRequest
                      ) -> inspect.Signature:
    """``build``'s signature as ``help()`` and ``inspect`` show it: ``model``, then every
    option of ``trtpack build`` by its CLI name (``BuildRequest``), then the Python-only
    keywords."""
    own = inspect.signature(build).parameters
    hints = get_type_hints(request_type)
    options = [inspect.Parameter(keyword(f), inspect.Parameter.KEYWORD_ONLY,
                                 default=keyword_default(f), annotation=hints[f.name])
               for f in fields(request_type) if not option_spec(f).argument]
    return inspect.Signature([own["model"], *options, own["example_inputs"], own["progress"],
                              own["on_warning"]], return_annotation=BuiltModel)


setattr(build, "__signature__", keyword_signature())  # noqa: B010 -- read by inspect, help()


def _example_dict(module: torch.nn.Module, example: ExampleInputs) -> dict[str, ExampleValue]:
    if isinstance(example, Mapping):
        return dict(example)
    values = example if isinstance(example, tuple | list) else (example,)
    names = [p.name for p in inspect.signature(module.forward).parameters.values()
             if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if len(values) > len(names):
        raise UserInputError(f"example_inputs give {len(values)} values; the module's "
                             f"forward takes {len(names)} ({', '.join(names)})")
    return dict(zip(names, values, strict=False))


def _described_examples(inputs: Sequence[str], profiles: Sequence[str]
                        ) -> dict[str, torch.Tensor]:
    """Example tensors from ``input`` descriptions, at the first profile's opt shapes (or
    batch 2 and 16 for other axes)."""
    import torch

    from trtpack.pytorch.describe import example_feeds
    from trtpack.sources.inputs import parse_input_options

    described = [d for d in parse_input_options(inputs) if d.spec is not None]
    if not described:
        raise UserInputError("a torch.nn.Module object needs its inputs: pass "
                             "example_inputs=(tensor, ...) or input=['x=float32[batch,16]']")
    specs = [d.spec for d in described if d.spec is not None]
    sizes: dict[str, int] = {}
    if profiles:
        for name, r in parse_profiles(list(profiles)[:1], specs)[0].shapes.items():
            spec = next(s for s in specs if s.name == name)
            sizes.update({a: r.opt[k] for k, a in spec.dynamic_axes.items()})
    feeds = example_feeds([{"name": s.name, "dtype": s.dtype, "axes": list(s.axes)}
                           for s in specs], sizes)
    return {n: torch.as_tensor(v) for n, v in feeds.items()}


def module_key(module: torch.nn.Module, examples: Mapping[str, torch.Tensor],
               dims: Mapping[str, list[str | int]]) -> str:
    """What names a module object's export: its class, its parameters' and buffers' names,
    shapes, dtypes and bytes, and its example inputs' dtypes and dynamic dims."""
    import torch

    digest = hashlib.sha256()
    cls = type(module)
    digest.update(f"{cls.__module__}.{cls.__qualname__}".encode())
    with contextlib.suppress(OSError, TypeError):  # a class typed into a REPL: no source
        digest.update(inspect.getsource(cls).encode())
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        data = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{name}:{tuple(tensor.shape)}:{data.dtype}".encode())
        if data.numel():
            digest.update(data.view(torch.uint8).numpy().tobytes())
    for name, value in examples.items():
        digest.update(f"{name}:{getattr(value, 'dtype', type(value))}:"
                      f"{getattr(value, 'ndim', 0)}:{dims.get(name)}".encode())
    return digest.hexdigest()[:32]


def export_module(module: torch.nn.Module, example_inputs: ExampleInputs | None,
                  inputs: Sequence[str],
                  profiles: Sequence[str], cache_dir: Path) -> Path:
    """``module`` saved as a ``.pt2`` ExportedProgram under ``cache_dir/modules/`` (once per
    ``module_key``), with a dynamic batch (the first dim of every input) and the dynamic
    dims ``input`` names, bounded by the profiles' largest sizes."""
    import torch

    if not isinstance(module, torch.nn.Module):
        raise UserInputError(f"trtpack.build takes a torch.nn.Module, a path or a name, not "
                             f"{type(module).__name__}")
    module.eval()
    examples = _example_dict(module, example_inputs) if example_inputs is not None else \
        _described_examples(inputs, profiles)
    tensors = {n: v for n, v in examples.items() if isinstance(v, torch.Tensor)}
    constants = {n: v for n, v in examples.items() if not isinstance(v, torch.Tensor)}
    axes = _axes(tensors, inputs)
    tops = _axis_maxima(tensors, axes, profiles)
    dims = {name: torch.export.Dim(name, min=1, max=tops.get(name, DEFAULT_BATCH_MAX))
            for name in {a for spec in axes.values() for a in spec if isinstance(a, str)}}
    dynamic = {n: {k: dims[a] for k, a in enumerate(axes[n]) if isinstance(a, str)}
               for n in tensors}
    key = module_key(module, tensors, {n: axes[n] for n in tensors})
    path = cache_dir / "modules" / key / f"{safe_name(type(module).__name__)}.pt2"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        program = torch.export.export(module, (), kwargs={**tensors, **constants},
                                      dynamic_shapes={**dynamic, **{n: None for n in constants}})
    except Exception as e:  # torch.export's own failures: the module's to change
        first = first_line(e)
        raise UserInputError(f"torch.export could not export the module: {first}",
                             hint="export it yourself (torch.export.export) and pass the "
                             "saved .pt2, or give a factory file.py:make_model") from None
    tmp = path.with_suffix(".tmp.pt2")
    torch.export.save(program, str(tmp))
    tmp.replace(path)
    return path


def _axes(tensors: Mapping[str, torch.Tensor], inputs: Sequence[str]
          ) -> dict[str, list[str | int]]:
    """Each input's axes: as ``input`` describes it, else the batch first, static after."""
    from trtpack.sources.inputs import parse_input_options

    described: dict[str, TensorSpec] = {d.name: d.spec for d in parse_input_options(inputs)
                                        if d.spec is not None}
    axes: dict[str, list[str | int]] = {}
    for name, tensor in tensors.items():
        if name in described:
            axes[name] = list(described[name].axes)
        else:
            axes[name] = [BATCH_AXIS if k == 0 else int(s) for k, s in enumerate(tensor.shape)]
    return axes


def _axis_maxima(tensors: Mapping[str, torch.Tensor], axes: Mapping[str, list[str | int]],
                 profiles: Sequence[str]) -> dict[str, int]:
    if not profiles:
        return {}
    specs = [TensorSpec(n, str(t.dtype).removeprefix("torch."), tuple(axes[n]))
             for n, t in tensors.items()]
    tops: dict[str, int] = {}
    for parsed in parse_profiles(list(profiles), specs):
        for name, r in parsed.shapes.items():
            for k, a in enumerate(axes[name]):
                if isinstance(a, str):
                    tops[a] = max(tops.get(a, 2), r.max[k])
    return tops
