"""Resolve ``--model`` to a directory and load it with mlx-lm.

``--model`` is an embedded model's name (fetched into the model cache on first use), a
local GGUF file (converted into the model cache once, its 4/8-bit tensors kept), a local
mlx-lm model directory, or a Hugging Face hub id where a hub is reachable.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import mlx.core as mx

from semantic.adapters.mlx.cpu import (
    PagePlacement,
    install_attention,
    install_host_products,
    install_host_swiglu,
    place_weights_on_huge_pages,
)
from semantic.adapters.mlx.errors import CorruptModelError, ModelDownloadError, UnknownModelError
from semantic.adapters.mlx.lm import load as mlx_lm_load
from semantic.adapters.mlx.models.gguf import WeightFormat
from semantic.adapters.mlx.models.model_cache import (
    EMBEDDED_MODELS,
    ModelCache,
    Progress,
    check_model_dir,
    default_weight_format,
)
from semantic.adapters.mlx.models.runtime import check_mlx_lm_version

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model: Any
    tokenizer: Any
    path: Path
    model_id: str
    config: dict[str, Any]
    host_attention: bool = False
    pages: PagePlacement | None = None
    """The weights' move onto huge pages (ADR 0032), going on or over; None: not placed."""

    @property
    def scored_tokens(self) -> int | None:
        """How many token ids the model embeds and scores (its config's ``vocab_size``):
        a tokenizer may list more (added tokens past the embedding), which no prompt or
        ``logit_bias`` may name. None where the config does not say."""
        size = self.config.get("vocab_size")
        if size is None:
            size = self.config.get("text_config", {}).get("vocab_size")
        return int(size) if isinstance(size, int) else None


def resolve_model(
    name: str, cache: ModelCache, weight_format: WeightFormat | None, progress: Progress
) -> tuple[Path, str]:
    """The model directory for ``name`` and the id the API serves it under; ``weight_format``
    None: the embedded model's default here, a GGUF file's own."""
    if name in EMBEDDED_MODELS:
        return cache.ensure(name, weight_format or default_weight_format(), progress), name
    local = Path(name).expanduser()
    if local.is_file() and local.suffix.lower() == ".gguf":
        chosen = weight_format or WeightFormat.QUANTIZED
        return cache.ensure_gguf(local, chosen, progress), local.stem
    if local.exists():
        if not local.is_dir():
            raise CorruptModelError(
                f"--model {name}: a file, neither a GGUF (.gguf) nor an mlx-lm model directory"
            )
        check_model_dir(local)
        return local.resolve(), local.resolve().name
    if name.count("/") == 1 and not name.startswith((".", "/", "~")):
        return _from_hub(name), name
    raise UnknownModelError(
        f"unknown model {name!r}: not an embedded model ({', '.join(sorted(EMBEDDED_MODELS))}), "
        "not an existing directory, and not a hub id like 'org/name'."
    )


def load_model(path: Path, model_id: str, *, move_weights_later: bool = False) -> LoadedModel:
    """Load weights and tokenizer; a broken directory gives one clear error. The weights
    move onto huge pages now, or with ``move_weights_later`` when the caller starts
    ``LoadedModel.pages`` (a server, once it answers: ADR 0032)."""
    mlx_lm_version = check_mlx_lm_version()
    check_model_dir(path)
    try:
        loaded: Any = mlx_lm_load(str(path), return_config=True)
        model, tokenizer, config = loaded
    except TypeError as error:  # the family's ModelArgs or modules refused the config
        raise CorruptModelError(
            f"could not load the model in {path}: {str(error).rstrip('. ')}: its config.json "
            "lacks a setting its model_type's mlx-lm class needs, or describes another family"
        ) from error
    except (ValueError, KeyError, OSError, RuntimeError) as error:
        said = str(error).rstrip(". ")
        if "not supported" in said and "Model type" in said:  # mlx-lm knows no such class
            raise CorruptModelError(
                f"could not load the model in {path}: {said}: mlx-lm {mlx_lm_version} has "
                "no model class for its config.json's model_type (a newer mlx-lm may; "
                "semantic runs the range it was tested with)."
            ) from error
        raise CorruptModelError(
            f"could not load the model in {path}: {said}. Fix: re-create it (for the "
            "embedded model: `semantic model pull --force`)."
        ) from error
    evaluate_held_arrays(model)
    if not getattr(tokenizer, "chat_template", None):
        log.warning("model %s has no chat template: its chat routes answer 400", model_id)
    else:
        check_chat_template(tokenizer, path)
    fast = install_attention(model)
    products = install_host_products(model)
    install_host_swiglu(model)
    pages = place_weights_on_huge_pages(model, later=move_weights_later)
    log.info(
        "loaded model %s from %s%s%s",
        model_id,
        path,
        " (host softmax attention)" if fast else "",
        f" ({products} quantized products on our kernels)" if products else "",
    )
    return LoadedModel(model, tokenizer, path, model_id, dict(config), fast, pages)


def evaluate_held_arrays(model: Any) -> None:
    """Every array a module holds outside its parameters (a LongRoPE's or YaRN's
    frequencies, ``_freqs``), computed here on the loading thread: mlx-lm's load evaluates
    the parameters only, and the rest, left lazy, was first evaluated on the engine's
    thread, whose streams cannot run a graph made on this one (Phi-3's LongRoPE would not
    start: "There is no Stream(cpu, 0) in current thread")."""
    held = [  # a module is a dict of what it holds, its "_"-named arrays too
        value
        for module in model.modules()
        for value in module.values()
        if isinstance(value, mx.array)
    ]
    if held:
        mx.eval(held)


def check_chat_template(tokenizer: Any, path: Path) -> None:
    """A template that does not compile is refused at start, not with a 500 on every chat
    request; one that refuses this conversation (a template's ``raise_exception``) is the
    requests' to hear about (a 400 naming its words)."""
    try:
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
        )
    except jinja2.TemplateSyntaxError as error:
        raise CorruptModelError(
            f"the chat template of the model in {path} does not compile: {error} (line "
            f"{error.lineno}). Fix: correct chat_template in its tokenizer_config.json or "
            "chat_template.jinja"
        ) from error
    except jinja2.TemplateError:
        pass


def _from_hub(repo: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(
                repo, allow_patterns=["*.json", "model*.safetensors", "*.jinja", "*.txt"]
            )
        )
    except Exception as error:  # the hub client raises many unrelated types
        raise ModelDownloadError(
            f"could not fetch {repo!r} from the Hugging Face hub ({type(error).__name__}: "
            f"{error}). Fix: check network access, or convert it elsewhere and pass the "
            "local directory to --model."
        ) from error
