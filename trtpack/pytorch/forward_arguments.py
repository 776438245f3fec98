"""The arguments of a PyTorch module's ``forward``: what kind each is (a tensor, a constant,
anything) and the constants a user gave for them, checked against TorchScript's types."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING

from trtpack.errors import UserInputError

if TYPE_CHECKING:
    import torch

CONSTANT_TYPES = ("int", "float", "bool", "str")
"""The TorchScript types of a ``forward`` argument that is a constant, not a tensor."""


def forward_parameters(module: torch.nn.Module) -> list[tuple[str, str, bool]]:
    """(name, kind, required) of each argument of ``module.forward``: kind is ``tensor``,
    ``constant`` (an int, float, bool or str: TorchScript says which) or ``any``."""
    import torch

    if isinstance(module, torch.jit.ScriptModule):
        params = []
        for arg in module.forward.schema.arguments[1:]:  # type: ignore[attr-defined]
            text = str(arg.type)
            kind = "tensor" if text.startswith(("Tensor", "Optional[Tensor]")) else \
                "constant" if text in CONSTANT_TYPES else "any"
            params.append((arg.name, kind, arg.default_value is None))
        return params
    params = []
    for p in inspect.signature(module.forward).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        params.append((p.name, "any", p.default is p.empty))
    return params


def whole_numbers(module: torch.nn.Module, constants: Mapping[str, object]
                   ) -> dict[str, int]:
    """The constants given as floats for arguments TorchScript types ``int``, as ints
    (``--input step=2.0``); one with a fraction (``step=2.5``) is the user's error, named
    after that argument (not a failure of the forward blamed on the tensors)."""
    import torch

    whole: dict[str, int] = {}
    if not isinstance(module, torch.jit.ScriptModule):
        return whole
    for arg in module.forward.schema.arguments[1:]:  # type: ignore[attr-defined]
        value = constants.get(arg.name)
        if str(arg.type) == "int" and isinstance(value, float) and not value.is_integer():
            raise UserInputError(
                f"--input {arg.name}={value:g}: the model's forward takes '{arg.name}' as an "
                f"int, and {value:g} is not a whole number",
                hint=f"give a whole number, e.g. --input {arg.name}={int(value)}")
        if str(arg.type) == "int" and isinstance(value, float):
            whole[arg.name] = int(value)
    return whole


def refuse_ranges_for_constants(module: torch.nn.Module, ranged: Mapping[str, str]) -> None:
    """A range alone (``--input step=0..10``) for an argument TorchScript types ``int``,
    ``float``, ``bool`` or ``str`` is the user's error, said as such: such an argument is not
    a tensor, so the export folds the one value it is given into the graph as a constant and
    the served model has no input to feed a range of values through."""
    import torch

    if not isinstance(module, torch.jit.ScriptModule):
        return
    for arg in module.forward.schema.arguments[1:]:  # type: ignore[attr-defined]
        if arg.name in ranged and str(arg.type) in CONSTANT_TYPES:
            raise range_for_a_constant(arg.name, ranged[arg.name], str(arg.type))


def range_for_a_constant(name: str, text: str, type_name: str | None) -> UserInputError:
    """The error for a range given to a non-tensor argument (``type_name``: TorchScript's
    type, or None where only the value it takes says it is not a tensor)."""
    kind = f"an {type_name}" if type_name == "int" else f"a {type_name or 'non-tensor'}"
    low = text.partition("..")[0]
    return UserInputError(
        f"--input {name}={text}: the model's forward takes '{name}' as {kind}, not a tensor; "
        "the export folds a non-tensor argument into the graph as one constant, so the "
        "served model has no input to take a range of values through",
        hint=f"give it one value, e.g. --input {name}={low}")
