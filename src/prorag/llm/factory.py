"""Build a policy :class:`~prorag.llm.generation.Generator` from a plain description (what parameters hold)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from prorag.llm.generation import Generator
from prorag.llm.registry import load_causal_lm, merge_adapter
from prorag.llm.served import TrainedServerSpec

if TYPE_CHECKING:
    from prorag.config import MixedPrecision

Backend = Literal["transformers", "openai"]


def build_generator(model: str, *, backend: Backend = "transformers", adapter: str | None = None,
                    dtype: str = "float32", batch_size: int = 8, base_url: str | None = None,
                    api_key_env: str | None = "OPENAI_API_KEY", mode: Literal["completions", "chat"] = "completions",
                    max_concurrency: int = 16, timeout: float = 120.0,
                    trained_server: TrainedServerSpec | None = None, device: str = "cpu",
                    prefix_cache_idle_calls: int | None = None, draft_tokens: int = 3,
                    mixed_precision: MixedPrecision = "no") -> Generator:
    """A generator for ``model`` (a registry spec), optionally with a PEFT LoRA ``adapter`` merged in.

    ``backend="openai"`` talks to an OpenAI-compatible server (vLLM, ``prorag serve``) at ``base_url``; the
    key is read from the environment variable named by ``api_key_env`` (never from parameters, never from another
    variable; unset is an error before any request, ``None`` a keyless server — see
    :func:`~prorag.llm.openai_backend.api_key_from_env`). The tokenizer of ``model`` is loaded locally so token
    ids can be accounted. A trained policy goes through the server too (:mod:`prorag.llm.served`): an ``adapter``
    is loaded into the server at ``base_url`` and requested by its name; a full model ``model`` folder is
    requested by name from ``trained_server`` (launched there when it says so). ``device`` places the in-process
    (transformers) model; ``draft_tokens`` its greedy decoding's prompt-lookup drafts; ``mixed_precision="bf16"``
    stores its linear weights in bf16 and generates under bf16 autocast (:mod:`prorag.llm.precision`; a server's
    precision is the server's own).
    """
    if backend == "openai":
        from prorag.llm.openai_backend import OpenAICompatibleGenerator, api_key_from_env
        from prorag.llm.served import is_local_folder, served_adapter_name, served_model_name

        if not base_url:
            raise ValueError("backend 'openai' needs base_url (e.g. http://127.0.0.1:8000/v1)")
        api_key = api_key_from_env(api_key_env, endpoint=f"the policy at {base_url}", base_url=base_url)
        served, url = model, base_url
        if adapter:
            served = served_adapter_name(base_url, adapter, api_key=api_key)
        elif is_local_folder(model) and not _serves(base_url, model, api_key):
            url = trained_server.base_url if trained_server is not None else base_url
            if url != base_url:  # the policy's key variable, paired again with the server it now goes to
                api_key = api_key_from_env(api_key_env, endpoint=f"the trained policy at {url}", base_url=url)
            served = served_model_name(trained_server, model, api_key=api_key)
        return OpenAICompatibleGenerator(url, served, api_key, mode=mode,
                                         max_concurrency=max_concurrency, timeout=timeout, tokenizer=model)
    if backend != "transformers":
        raise ValueError(f"unknown generation backend {backend!r} (transformers or openai)")
    from prorag.llm.transformers_backend import TransformersGenerator

    loaded, tokenizer = load_causal_lm(model, dtype=dtype, device=device)
    if adapter:
        loaded = merge_adapter(loaded, adapter)
        loaded.eval()
    if mixed_precision == "bf16":
        from prorag.llm.precision import inference_weights_in_bf16

        inference_weights_in_bf16(loaded)
    return TransformersGenerator((loaded, tokenizer), dtype=dtype, batch_size=batch_size,
                                 prefix_cache_idle_calls=prefix_cache_idle_calls, draft_tokens=draft_tokens,
                                 mixed_precision=mixed_precision)


def _serves(base_url: str, model: str, api_key: str | None) -> bool:
    from prorag.llm.served import served_models

    return model in served_models(base_url, api_key=api_key)
