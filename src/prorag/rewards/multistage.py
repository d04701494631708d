"""The multi-stage reward of "Learning When to Search" (§3.3, eqs. 6–12): ``r_sum = r_a + r_s + r_f``.

* Format reward (eq. 6): ``r_f = +1`` when the completion fully matches the protocol's structure
  (:func:`prorag.protocol.multistage.is_valid_format`), else ``−1``.
* Search reward (eq. 9), with RC the retrieval count::

      r_s = 0          if the query is concise and RC ≤ 1
            −1         if it is not concise and RC ≤ 1
            −avg_sim   if RC > 1

  where ``avg_sim`` is the average pairwise cosine similarity of the queries' embeddings (eqs. 7–8).
* Answer reward, Stage 1 (eq. 10): ``1`` if correct else ``−1 + β·RC``; Stage 2 (eq. 11): ``1 − β·RC`` if correct
  else ``−1``; β = 0.3. No clipping: the paper gives none, so with β = 0.3 a wrong Stage-1 answer after four or
  more searches earns a positive ``r_a`` — as written. "Correct" is the paper's LLM-as-a-judge verdict (the
  same judge model in training and evaluation); pass whatever correctness signal you use.

Checks against the paper and DESIGN.md. Eqs. 9, 10, 11 and 12 agree with DESIGN.md. Eq. 8 as printed,
``avg_sim = Σ_i Σ_{j>i} cos(m_i, m_j) / (N(N−1))``, is *half* the mean over the ``N(N−1)/2`` unordered pairs,
while the paper's prose ("the mean of pairwise cosine similarities") and DESIGN.md say the mean; the printed
form is most likely the ordered-pair mean ``Σ_{i≠j} / (N(N−1))`` with the ``j ≠ i`` lost, which *is* the mean.
We use the mean by default and keep the literal printed formula behind ``literal_eq8=True``.

Conciseness: the paper says only that a rule-based check keeps queries free of "redundant question words,
prepositions, and irrelevant modifiers", and its prompt asks for "a brief keyword-based search query … instead
of a natural language question". :func:`is_concise` is our rule set for that (the paper gives no thresholds).
For RC ≤ 1 the conciseness of the (at most one) query decides; with RC = 0 there is no query and it counts as
concise (``r_s = 0``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal

import numpy as np
from pydantic import Field

from prorag.metrics.qa import cover_exact_match
from prorag.protocol.multistage import extract_queries, is_valid_format
from prorag.rewards.base import Reward, RewardNeeds, RewardScores, RewardSettings, ScoringContext
from prorag.specs import JudgeSpec

if TYPE_CHECKING:
    from prorag.judges.base import Judge

logger = logging.getLogger(__name__)

Embed = Callable[[list[str]], np.ndarray]
Stage = Literal[1, 2]

QUESTION_WORDS: Final = frozenset({"what", "who", "whom", "whose", "which", "when", "where", "why", "how"})
AUXILIARY_OPENERS: Final = frozenset({"is", "are", "was", "were", "do", "does", "did", "can", "could", "will",
                                      "would", "should", "shall", "has", "have", "had", "may", "might"})
PREPOSITIONS: Final = frozenset({
    "of", "in", "on", "at", "by", "for", "with", "about", "from", "to", "into", "during", "after", "before",
    "between", "through", "over", "under", "against", "among", "within", "without", "upon", "across", "behind",
    "beyond", "near", "since", "until", "toward", "towards", "onto", "via",
})
FILLER_MODIFIERS: Final = frozenset({
    "please", "kindly", "exactly", "really", "very", "actually", "basically", "specifically", "precisely",
    "just", "quite", "tell", "me",
})
_WORD = re.compile(r"[\w'’-]+", re.UNICODE)


def is_concise(query: str, *, max_words: int = 10, max_prepositions: int = 1) -> bool:
    """Our rule for a concise keyword query (the paper gives the intent, not the rules).

    Not concise when the query is empty, ends with or contains ``?``, contains a question word
    (what/who/whom/whose/which/when/where/why/how), opens with an auxiliary verb (is/does/did/…), contains a
    filler or request word (please, exactly, very, just, "tell me"…), has more than ``max_prepositions``
    prepositions, or more than ``max_words`` words. E.g. ``"Edward Dickinson death date"`` and
    ``"director of the film Jaws"`` are concise; ``"when did Lavinia Norcross Dickinson's father die"`` (the
    paper's own example of a natural-language query) is not.
    """
    if "?" in query:
        return False
    words = [word.lower() for word in _WORD.findall(query)]
    if not words or len(words) > max_words:
        return False
    if words[0] in AUXILIARY_OPENERS:
        return False
    if any(word in QUESTION_WORDS or word in FILLER_MODIFIERS for word in words):
        return False
    return sum(word in PREPOSITIONS for word in words) <= max_prepositions


def answer_reward(correct: bool, retrieval_count: int, stage: Stage, beta: float = 0.3) -> float:
    """Eq. 10 (stage 1: ``1`` / ``−1 + β·RC``) or eq. 11 (stage 2: ``1 − β·RC`` / ``−1``)."""
    _check_count(retrieval_count)
    if stage not in (1, 2):
        raise ValueError(f"stage must be 1 or 2, got {stage!r}")
    if not beta >= 0.0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if stage == 1:
        return 1.0 if correct else -1.0 + beta * retrieval_count
    return 1.0 - beta * retrieval_count if correct else -1.0


def format_reward(text: str) -> float:
    """Eq. 6: ``+1`` if the completion fully matches the structure, else ``−1``."""
    return 1.0 if is_valid_format(text) else -1.0


def avg_pairwise_similarity(embeddings: np.ndarray, *, literal_eq8: bool = False) -> float:
    """Mean cosine similarity over the unordered pairs of rows (eq. 7–8; see the module docstring).

    ``literal_eq8=True`` returns eq. 8 as printed: the sum over ``i < j`` divided by ``N(N−1)`` (half the mean).
    Rows are normalized here (eq. 7), so embeddings need not be unit-length; a zero row has similarity 0.
    """
    matrix = np.asarray(embeddings, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError(f"embeddings must be a 2-D array, got shape {matrix.shape}")
    n = matrix.shape[0]
    if n < 2:
        raise ValueError(f"need at least two embeddings, got {n}")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    unit = matrix / np.where(norms > 0, norms, 1.0)
    upper = np.triu(unit @ unit.T, k=1).sum()
    return float(upper / (n * (n - 1)) if literal_eq8 else upper / (n * (n - 1) / 2))


def search_reward(queries: Sequence[str], retrieval_count: int, concise: bool | None = None,
                  embed: Embed | None = None, *, literal_eq8: bool = False) -> float:
    """Eq. 9. ``concise`` defaults to :func:`is_concise` of every query (True when there is none); ``embed``
    (``list[str] -> array``, e.g. ``load_embedder(spec).encode_queries``) is needed when RC > 1."""
    return _search_reward(list(queries), retrieval_count, concise, embed, literal_eq8)[0]


def _search_reward(queries: list[str], retrieval_count: int, concise: bool | None, embed: Embed | None,
                   literal_eq8: bool) -> tuple[float, bool | None, float | None]:
    _check_count(retrieval_count)
    if retrieval_count <= 1:
        if concise is None:
            concise = all(is_concise(query) for query in queries)
        return (0.0 if concise else -1.0), concise, None
    if len(queries) < 2:
        raise ValueError(f"retrieval_count={retrieval_count} needs at least two queries, got {len(queries)}")
    if embed is None:
        raise ValueError("search_reward needs embed when retrieval_count > 1")
    embeddings = np.asarray(embed(list(queries)))
    if embeddings.shape[0] != len(queries):
        raise ValueError(f"embed returned {embeddings.shape[0]} rows for {len(queries)} queries")
    similarity = avg_pairwise_similarity(embeddings, literal_eq8=literal_eq8)
    return -similarity, concise, similarity


@dataclass(frozen=True)
class MultistageBreakdown:
    """``total = answer + search + format`` (eq. 12) and what they came from."""

    total: float
    answer: float
    search: float
    format: float
    stage: int
    correct: bool
    retrieval_count: int
    queries: tuple[str, ...]
    concise: bool | None
    avg_similarity: float | None


def multistage_reward(text: str, correct: bool, stage: Stage, *, beta: float = 0.3, embed: Embed | None = None,
                      queries: Sequence[str] | None = None, retrieval_count: int | None = None,
                      concise: bool | None = None, literal_eq8: bool = False) -> MultistageBreakdown:
    """Eq. 12 for one completion: ``r_a + r_s + r_f``.

    ``queries`` default to the ``<search>`` contents of ``text`` and ``retrieval_count`` to their number (pass
    the engine's own counts when you have them).
    """
    query_list = list(queries) if queries is not None else extract_queries(text)
    count = len(query_list) if retrieval_count is None else retrieval_count
    r_a = answer_reward(correct, count, stage, beta)
    r_s, concise_used, similarity = _search_reward(query_list, count, concise, embed, literal_eq8)
    r_f = format_reward(text)
    return MultistageBreakdown(total=r_a + r_s + r_f, answer=r_a, search=r_s, format=r_f, stage=stage,
                            correct=bool(correct), retrieval_count=count, queries=tuple(query_list),
                            concise=concise_used, avg_similarity=similarity)


def _check_count(retrieval_count: int) -> None:
    if isinstance(retrieval_count, bool) or not isinstance(retrieval_count, int) or retrieval_count < 0:
        raise ValueError(f"retrieval_count must be a non-negative int, got {retrieval_count!r}")


# ------------------------------------------------------------------------------------------ the plug-in


class MultistageSettings(RewardSettings):
    """The multi-stage reward (eq. 12) with its two answer stages."""

    kind: Literal["multistage"] = "multistage"
    beta: float = Field(default=0.3, ge=0)
    """The retrieval penalty β of the answer reward (eqs. 10–11)."""
    stage_switch_step: int = Field(default=1, ge=0)
    """The first training step of stage 2 (eq. 11); steps before it use stage 1 (eq. 10). The paper gives no switch
    point, so it is an explicit setting; 0 is stage 2 from the start — the paper's "w/o stage one" ablation — and
    is logged as such. Evaluation judges with stage 2."""
    answer_judge: JudgeSpec = JudgeSpec()
    """Answer correctness. ``llm`` is the paper's LLM-as-a-judge (LasJ, its answer prompt); ``reference`` is cover
    exact match, the embedded default's fallback. An unknown verdict counts as incorrect (never rewarded) and shows
    as ``answer_unknown_rate``."""


class MultistageReward(Reward):
    """Eq. 12 per rollout, over the multistage protocol's completions (its format reward checks that protocol)."""

    kind: ClassVar[str] = "multistage"
    Settings: ClassVar[type[RewardSettings]] = MultistageSettings
    components: ClassVar[tuple[str, ...]] = ("answer", "search", "format")
    protocols: ClassVar[tuple[str, ...] | None] = ("multistage",)
    claims_protocols: ClassVar[bool] = True

    def __init__(self, settings: RewardSettings) -> None:
        super().__init__(settings)
        self.beta = float(settings.beta)  # type: ignore[attr-defined]
        self.stage_switch_step = int(settings.stage_switch_step)  # type: ignore[attr-defined]
        if self.stage_switch_step == 0:
            logger.warning("reward.stage_switch_step is 0: stage 2 from the first step (the paper's 'w/o stage one' "
                           "ablation)")

    @property
    def needs(self) -> RewardNeeds:
        return RewardNeeds(embedder=True, answer_judge=self.settings.answer_judge.kind == "llm")  # type: ignore[attr-defined]

    def stage(self, step: int | None) -> int:
        """1 before ``stage_switch_step``, 2 from it on and in evaluation (``step`` None)."""
        return 2 if step is None or step >= self.stage_switch_step else 1

    def score(self, rollouts: Sequence[Any], context: ScoringContext) -> RewardScores:
        if context.embed is None:
            raise ValueError("the multistage reward needs embed (its search reward compares query embeddings)")
        stage = self.stage(context.step)
        correctness = answers_correct(rollouts, context.answer_judge)
        components: dict[str, list[float]] = {name: [] for name in self.components}
        totals: list[float] = []
        for rollout, verdict in zip(rollouts, correctness, strict=True):
            result = multistage_reward(rollout.completion, verdict is True, stage, beta=self.beta,  # unknown: wrong
                                       embed=context.embed, queries=rollout.queries,
                                       retrieval_count=rollout.retrieval_count)
            for name, value in (("answer", result.answer), ("search", result.search), ("format", result.format)):
                components[name].append(float(value))
            totals.append(float(result.total))
        return RewardScores(components, totals, [None] * len(rollouts), answer_correct=correctness, stage=stage)


def answers_correct(rollouts: Sequence[Any], judge: Judge | None) -> list[bool | None]:
    """Each rollout's answer judged against its golden answers: the answer judge's verdict (None: unknown, and a
    rollout without an answer is incorrect without asking), or cover exact match without a judge."""
    if judge is None:
        return [bool(cover_exact_match(rollout.answer, rollout.golden_answers)) for rollout in rollouts]
    asked = [index for index, rollout in enumerate(rollouts) if rollout.answer and rollout.answer.strip()]
    verdicts = judge.answer_correct(
        [(rollouts[index].question, tuple(rollouts[index].golden_answers), str(rollouts[index].answer))
         for index in asked]) if asked else []
    correct: list[bool | None] = [False] * len(rollouts)
    for index, verdict in zip(asked, verdicts, strict=True):
        correct[index] = verdict.value
    return correct
