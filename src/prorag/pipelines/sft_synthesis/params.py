"""Parameter schema of the SFT-synthesis pipeline (``sft_synthesis``; see conf/base/parameters_sft_synthesis.yml)."""

from __future__ import annotations

from pydantic import Field

from prorag.config import StrictModel
from prorag.specs import PositiveInt, RetrieverSpec, Seed


class SftSynthesisParams(StrictModel):
    """Which indexed questions become gold trajectories, and how their contexts are retrieved."""

    sources: list[str] = Field(default=["musique_train"], min_length=1)
    max_per_source: PositiveInt | None = None
    single_search: bool = True
    """Questions of datasets with no decomposition synthesizer get a one-search trajectory grounded in the retrieved
    passage that states the answer (skipped when none does); false: they are skipped."""
    first_hops: bool = False
    """Also ask the first sub-question of every decomposed (MuSiQue) question on its own, as a one-search example
    grounded the same way: single-hop examples from the same train split (the evaluation mixes single-hop PopQA
    with multi-hop questions)."""
    later_hops: bool = False
    """Also ask each later sub-question on its own, the earlier sub-answers filled in for its ``#k`` ("Who was the
    first president of #1?" → "... of American Psychological Association?")."""
    retriever: RetrieverSpec = RetrieverSpec()
    seed: Seed = 0
