"""What a PyTorch source is, read by loading it once: its inputs (names, dtypes, axes and the
ranges of its dynamic dims), the non-tensor arguments given as constants, its outputs (named
from what the module returns: a tensor, a tuple or a dict) and the files it came from (a
factory's source, the user's modules it imported, the files it read: weights).

It runs in a process of its own (``python -m trtpack.pytorch.describe REQUEST RESULT``, started
by ``pytorch.describe_process``): importing torch and the user's code never touches the build's
process, and the result is kept beside the stage cache (``sources.torch_sources``) until one of
those files changes.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, SupportsInt

from trtpack.errors import TrtpackError, UserInputError, first_line
from trtpack.pytorch.forward_arguments import (
    forward_parameters,
    range_for_a_constant,
    refuse_ranges_for_constants,
    whole_numbers,
)
from trtpack.pytorch.input_hints import first_layer_input
from trtpack.shapes import BATCH_AXIS, TensorSpec
from trtpack.sources.torch_sources import (
    DescribeRequest,
    Description,
    FolderDescription,
    InputDescription,
    OutputDescription,
)

if TYPE_CHECKING:
    import torch

DEFAULT_SIZES = {BATCH_AXIS: 2}  # an example size per axis when none is described
DEFAULT_SIZE = 16
TORCH_DTYPES = {"float32": "float32", "float16": "float16", "int64": "int64", "int32": "int32",
                "uint8": "uint8", "bool": "bool", "bfloat16": "float32", "float64": "float32"}


def _dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in TORCH_DTYPES:
        raise UserInputError(f"input dtype {name} is not one trtpack feeds (float32, float16, "
                             "int64, int32, uint8, bool)")
    return TORCH_DTYPES[name]


def observed_files(opened: set[str], before: set[str]) -> list[str]:
    """The user's own files among those opened, and the user's modules imported since
    ``before``: not the Python installation's (stdlib, site-packages) nor trtpack's."""
    skip = {str(Path(p).resolve()) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}}
    skip.add(str(Path(__file__).resolve().parents[1]))  # trtpack itself
    found = set(opened)
    for name, module in list(sys.modules.items()):
        if name not in before:
            found.add(getattr(module, "__file__", None) or "")
    keep = []
    for name in found:
        if not name or name.endswith(".pyc") or name.startswith(("/proc", "/dev", "/sys")):
            continue
        path = Path(name).resolve()
        if not path.is_file() or any(str(path).startswith(s + os.sep) for s in skip):
            continue
        if "site-packages" in path.parts or "dist-packages" in path.parts:
            continue
        # a package's metadata (an editable install's trtpack.egg-info, read by torch's import
        # for its entry points in a fresh process, not where torch was imported already) is
        # the installation's, not the user's
        if any(part.endswith((".egg-info", ".dist-info")) for part in path.parts):
            continue
        keep.append(str(path))
    return sorted(set(keep))


class FileWatch:
    """Every file opened while it is active (``sys.addaudithook``: imports and reads)."""

    def __init__(self) -> None:
        self.opened: set[str] = set()
        self.active = False
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple[object, ...]) -> None:
        if self.active and event == "open" and args and isinstance(args[0], str | Path):
            self.opened.add(str(args[0]))


def describe(request: DescribeRequest) -> Description | FolderDescription:
    """The description of ``request["source"]`` (a recipe ``source:``), with the user's input
    descriptions ``request["inputs"]`` (name -> {dtype, axes}) and constants
    ``request["arguments"]`` (name -> value); ``request["sizes"]`` gives example sizes per
    axis (the first profile's opt)."""
    from trtpack.pytorch.user_modules import (
        call_factory,
        load_exported_program,
        load_torchscript,
        split_factory_result,
    )

    watch = FileWatch()
    source = request["source"]
    before = set(sys.modules)
    example: object = None
    files: list[str] = []
    if source.get("exported_program"):
        files = [source["exported_program"]]
        return {**describe_program(load_exported_program(source["exported_program"]),
                                   request), "files": files}
    module: torch.nn.Module
    if source.get("torchscript"):
        files = [source["torchscript"]]
        module = load_torchscript(source["torchscript"])
    else:
        watch.active = True
        made = call_factory(source["factory"])
        watch.active = False
        files = observed_files(watch.opened, before)
        if isinstance(made, str | Path):
            if not Path(made).is_dir():
                raise UserInputError(f"factory '{source['factory']}' returned '{made}', which "
                                     "is not a model directory")
            return {"kind": "folder", "folder": str(Path(made).resolve()), "files": files}
        module, example = split_factory_result(made, source["factory"])
    return {**describe_module(module, example, request), "files": files}


def _example_dict(module: torch.nn.Module, example: object) -> dict[str, object]:
    names = [n for n, _, _ in forward_parameters(module)]
    if isinstance(example, dict):
        return dict(example)
    if not isinstance(example, tuple | list):
        example = (example,)
    if len(example) > len(names):
        raise UserInputError(f"the example inputs give {len(example)} values; forward takes "
                             f"{len(names)} ({', '.join(names)})")
    return dict(zip(names, example, strict=False))


def describe_module(module: torch.nn.Module, example: object, request: DescribeRequest
                    ) -> Description:
    """Inputs from ``forward``'s arguments: the user's descriptions first, then the factory's
    example inputs; every required argument needs one of them (or a constant)."""
    import torch

    described = request.get("inputs", {})
    constants = dict(request.get("arguments", {}))
    examples = _example_dict(module, example) if example is not None else {}
    ranged = request.get("ranged", {})
    unknown = sorted((set(described) | set(constants) | set(ranged))
                     - {n for n, _, _ in forward_parameters(module)})
    if unknown:
        raise UserInputError(
            f"--input {unknown[0]}: the model's forward has no argument '{unknown[0]}'; its "
            f"arguments are {', '.join(n for n, _, _ in forward_parameters(module)) or 'none'}")
    constants.update(whole_numbers(module, constants))
    refuse_ranges_for_constants(module, ranged)
    inputs: list[InputDescription] = []
    for name, kind, required in forward_parameters(module):
        value = examples.get(name)
        if name in constants:
            continue
        if name in described:
            inputs.append({"name": name, "dtype": described[name]["dtype"],
                           "axes": described[name]["axes"]})
        elif isinstance(value, torch.Tensor):
            axes: list[str | int] = [BATCH_AXIS if d == 0 else int(s)
                                     for d, s in enumerate(value.shape)]
            inputs.append({"name": name, "dtype": _dtype_name(value.dtype), "axes": axes})
        elif name in examples:
            if name in ranged:
                raise range_for_a_constant(name, ranged[name], type(examples[name]).__name__)
            constants[name] = examples[name]
        elif required:
            hint = (f"--input {name}=VALUE" if kind == "constant" else
                    f"--input {name}={first_layer_input(module)} (its dtype and dims, as "
                    "its first layer suggests; a name is a dynamic dim)")
            given = f" (--input {name}={ranged[name]} gives its values, not them)" \
                if name in ranged else ""
            raise UserInputError(
                f"input '{name}' of the model's forward is not described: trtpack cannot "
                f"read its dtype and shape from the module{given}", hint=f"give it: {hint}")
    if not inputs:
        raise UserInputError("the model's forward takes no tensor input to feed")
    outputs = output_axes(module, inputs, constants, request.get("sizes", {}))
    vocab = getattr(getattr(module, "config", None), "vocab_size", None)
    if not isinstance(vocab, int):  # token ids inside every embedding table's rows
        rows = [m.num_embeddings for m in module.modules() if isinstance(m, torch.nn.Embedding)]
        vocab = min(rows) if rows else None
    return {"kind": "module", "inputs": inputs, "arguments": constants, "outputs": outputs,
            "ranges": {}, "vocab_size": vocab if isinstance(vocab, int) else None}


def example_feeds(inputs: Sequence[InputDescription], sizes: Mapping[str, int], seed: int = 0,
                  grow: str | None = None) -> dict[str, torch.Tensor]:
    """Realistic tensors for ``inputs`` at ``sizes`` per axis (``grow``: one axis +1)."""
    import torch

    from trtpack.verify.samples import make_inputs

    specs = [TensorSpec(i["name"], i["dtype"], tuple(i["axes"]), i.get("kind", "generic"))
             for i in inputs]

    def size(axis: str) -> int:
        base = sizes.get(axis, DEFAULT_SIZES.get(axis, DEFAULT_SIZE))
        return base + 1 if axis == grow else base

    shapes = {s.name: tuple(a if isinstance(a, int) else size(a) for a in s.axes)
              for s in specs}
    feeds = make_inputs(specs, shapes, vocab_size=100, seed=seed)
    return {n: torch.from_numpy(v) for n, v in feeds.items()}


def returned_tensors(out: Any) -> dict[str, torch.Tensor]:
    """The tensors a forward returned, named: ``output`` for one tensor, ``output_K`` for a
    tuple's, the keys of a dict (or a Hugging Face ``ModelOutput``)."""
    import torch

    if isinstance(out, torch.Tensor):
        return {"output": out}
    if isinstance(out, dict) or hasattr(out, "keys"):
        return {str(k): v for k, v in out.items() if isinstance(v, torch.Tensor)}
    if isinstance(out, tuple | list):
        return {f"output_{k}": v for k, v in enumerate(out) if isinstance(v, torch.Tensor)}
    raise UserInputError(f"the model returns {type(out).__name__}; trtpack serves a tensor, "
                         "a tuple of tensors or a dict of tensors")


def output_axes(module: torch.nn.Module, inputs: Sequence[InputDescription],
                constants: Mapping[str, object], sizes: Mapping[str, int]
                ) -> list[OutputDescription]:
    """Each output's name and axes: a dim that follows an input axis when that axis grows by
    one is named after it; the others are static."""
    import torch

    axes_names = sorted({a for i in inputs for a in i["axes"] if isinstance(a, str)})
    with torch.inference_mode():
        try:
            base = returned_tensors(module(**example_feeds(inputs, sizes), **constants))
            grown = {a: returned_tensors(module(**example_feeds(inputs, sizes, grow=a),
                                                **constants)) for a in axes_names}
        except UserInputError:
            raise
        except Exception as e:  # the user's model, whatever it raises
            first = first_line(e)
            shapes = ", ".join([*(f"{i['name']}={i['dtype']}[{','.join(map(str, i['axes']))}]"
                                  for i in inputs),
                                *(f"{k}={v}" for k, v in constants.items())])
            raise UserInputError(f"the model's forward fails on inputs described as {shapes}: "
                                 f"{type(e).__name__}: {first}",
                                 hint="describe the inputs it takes with --input "
                                 "NAME=DTYPE[DIM,...] and size their dims with --profile"
                                 ) from None
    outputs: list[OutputDescription] = []
    for name, tensor in base.items():
        axes: list[str | int] = []
        for d, size in enumerate(tensor.shape):
            follows = [a for a in axes_names if name in grown[a]
                       and grown[a][name].dim() == tensor.dim()
                       and grown[a][name].shape[d] != size]
            axes.append(follows[0] if follows else int(size))
        outputs.append({"name": name, "axes": axes})
    return outputs


def describe_program(program: torch.export.ExportedProgram, request: DescribeRequest
                     ) -> Description:
    """An ExportedProgram's user inputs (their dtypes and symbolic dims), the ranges
    torch.export recorded for those dims, and its outputs named from its return."""
    import torch

    signature = program.graph_signature
    user_inputs = list(signature.user_inputs)
    symbols: dict[str, str] = {}
    nodes = {n.name: n for n in program.graph.nodes}
    inputs: list[InputDescription] = []
    first_dims: set[str] = set()
    for name in user_inputs:
        value = nodes[name].meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        if value.dim() and not isinstance(value.shape[0], int):
            first_dims.add(str(value.shape[0]))
    batch = next(iter(first_dims)) if len(first_dims) == 1 and len(user_inputs) == len(
        [n for n in user_inputs if isinstance(nodes[n].meta.get("val"), torch.Tensor)]) \
        else None

    def axis(dim: int | torch.SymInt) -> str | int:
        if isinstance(dim, int):
            return dim
        text = str(dim)
        if text == batch:
            return BATCH_AXIS
        return symbols.setdefault(text, f"dim_{len(symbols)}")

    constants: dict[str, object] = {}
    for name in user_inputs:
        value = nodes[name].meta.get("val")
        if isinstance(value, torch.Tensor):
            inputs.append({"name": name, "dtype": _dtype_name(value.dtype),
                           "axes": [axis(d) for d in value.shape]})
        elif name in request.get("ranged", {}):
            raise range_for_a_constant(name, request["ranged"][name], type(value).__name__)
        else:
            constants[name] = value
    ranges: dict[str, list[int | None]] = {}
    for symbol, rng in program.range_constraints.items():
        name = BATCH_AXIS if str(symbol) == batch else symbols.get(str(symbol))
        if name is None:
            continue
        ranges[name] = [max(1, _bound(rng.lower) or 1), _bound(rng.upper)]
    out_node = next(n for n in program.graph.nodes if n.op == "output")
    out_vals = [a.meta.get("val") for a in out_node.args[0]]
    spec = program.module_call_graph[0].signature.out_spec if program.module_call_graph \
        else None
    context = getattr(spec, "context", None)
    if isinstance(context, list | tuple) and len(context) == len(out_vals) and \
            all(isinstance(k, str) for k in context):  # a dict, a Hugging Face ModelOutput
        names = [str(k) for k in context]
    elif len(out_vals) == 1 and (spec is None or spec.type is None):
        names = ["output"]
    else:
        names = [f"output_{k}" for k in range(len(out_vals))]
    if len(names) != len(out_vals):
        names = [f"output_{k}" for k in range(len(out_vals))]
    outputs: list[OutputDescription] = [{"name": n, "axes": [axis(d) for d in v.shape]}
               for n, v in zip(names, out_vals, strict=True) if isinstance(v, torch.Tensor)]
    ranges = _lowest_that_runs(program, inputs, ranges, request.get("sizes", {}))
    return {"kind": "module", "inputs": inputs, "arguments": constants, "outputs": outputs,
            "ranges": ranges}


def _bound(value: SupportsInt) -> int | None:
    """A sympy bound as an int; None for infinity (torch's ``int_oo``: unbounded)."""
    if str(value) in ("oo", "int_oo", "-oo", "-int_oo"):
        return None
    try:
        return int(value)
    except (TypeError, ValueError, AttributeError, OverflowError):
        return None


def _lowest_that_runs(program: torch.export.ExportedProgram,
                      inputs: Sequence[InputDescription],
                      ranges: dict[str, list[int | None]], sizes: Mapping[str, int]
                      ) -> dict[str, list[int | None]]:
    """torch.export reports dynamic dims from 0 or 2 (it specializes sizes 0 and 1): a dim
    whose program runs at size 1 has min 1, otherwise 2."""
    import torch

    from trtpack.pytorch.user_modules import call_program_module

    module = program.module()
    for name, (low, high) in ranges.items():
        trial = dict(sizes)
        for other, (other_low, _) in ranges.items():
            if other != name:
                trial.setdefault(other, max(2, other_low or 2))
        trial[name] = 1
        try:
            with torch.inference_mode():
                call_program_module(module, example_feeds(inputs, trial))
            ranges[name] = [1, high]
        except Exception:  # the program refuses size 1 (a guard or the model's own code)
            ranges[name] = [max(2, low or 2), high]
    return ranges


def main() -> None:
    request_path, result_path = sys.argv[1], sys.argv[2]
    request = json.loads(Path(request_path).read_text(encoding="utf-8"))
    try:
        result: dict[str, object] = {"ok": describe(request)}
    except TrtpackError as e:  # the user's to fix: the same error in the build's process
        result = {"error": str(e), "hint": e.hint, "exit_code": e.exit_code}
    Path(result_path).write_text(json.dumps(result, default=_constant), encoding="utf-8")


def _constant(value: object) -> object:
    """A value ``json`` cannot write: a tensor's or numpy scalar's number, else its text."""
    if hasattr(value, "item"):
        return value.item()
    return str(value)


if __name__ == "__main__":
    main()
