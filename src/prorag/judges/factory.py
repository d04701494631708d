"""Build a judge from a plain description (what parameters hold)."""

from __future__ import annotations

from typing import Literal

from prorag.judges.base import Judge
from prorag.judges.cache import JudgeCache
from prorag.judges.limits import default_state_dir
from prorag.judges.llm_judge import LLMJudge
from prorag.judges.reference import ReferenceJudge
from prorag.llm.openai_backend import api_key_from_env
from prorag.retrieval.base import Retriever


def build_judge(kind: Literal["reference", "llm"], *, retriever: Retriever | None = None,
                base_url: str | None = None, model: str | None = None, api_key_env: str | None = "OPENAI_API_KEY",
                cache_path: str | None = None, max_concurrency: int = 32, timeout: float = 30.0,
                max_retries: int = 2, temperature: float | None = 0.0, f1_threshold: float = 0.8,
                grounding_threshold: float = 0.6, top_k: int = 5, requests_per_minute: float | None = None,
                max_unknown_rate: float | None = None, budget_usd: float | None = None,
                price_per_million_tokens: dict[str, float] | None = None,
                equivalence: Literal["f1", "content"] = "f1") -> Judge:
    """A deterministic reference judge, or an OpenAI-compatible LLM judge whose key is read from the
    environment variable named ``api_key_env`` (never from parameters, never from another variable: unset is an
    error before any request, ``None`` a keyless server) and whose replies are cached in ``cache_path`` (SQLite)
    so a re-run never repeats a call. ``requests_per_minute``, ``max_unknown_rate``, ``budget_usd`` and
    ``price_per_million_tokens`` (``{input, output}``) are the limits of :mod:`prorag.judges.limits`."""
    if kind == "reference":
        return ReferenceJudge(retriever, f1_threshold=f1_threshold, top_k=top_k,
                              grounding_threshold=grounding_threshold, equivalence=equivalence)
    if kind != "llm":
        raise ValueError(f"unknown judge kind {kind!r} (reference or llm)")
    if not base_url or not model:
        raise ValueError("an llm judge needs base_url and model")
    cache = JudgeCache(cache_path) if cache_path else None
    api_key = api_key_from_env(api_key_env, endpoint=f"the judge at {base_url}", base_url=base_url)
    price = ((price_per_million_tokens["input"], price_per_million_tokens["output"])
             if price_per_million_tokens is not None else None)
    return LLMJudge(base_url, model, api_key, max_concurrency=max_concurrency, timeout=timeout,
                    max_retries=max_retries, temperature=temperature, cache=cache,
                    requests_per_minute=requests_per_minute, rate_limit_dir=default_state_dir(),
                    max_unknown_rate=max_unknown_rate, budget_usd=budget_usd, price_per_million_tokens=price)
