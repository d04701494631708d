"""TeaRAG rewards (paper §4.3.2, eqs. 5–13): outcome, format and the knowledge-matching process reward.

The seed text lost the symbols of eqs. 5–13; they are rebuilt here from the prose (the authors' code could not
be read from this machine, so nothing below is checked against it). For a path ``P = {s_1 … s_T}`` with steps
``s_t = (E_t, q_t, c_t, o_t)`` (key entities, subquery, retrieved context, summary) and answer ``a``:

* eq. 5, outcome: ``r_o = F1(a, g) = 2·P·R / (P + R)`` with ``P = |a ∩ g| / |a|``, ``R = |a ∩ g| / |g|`` over
  normalized words (best over the golden answers, :func:`prorag.metrics.qa.f1_score`);
* eq. 6, format: ``r_f = 1`` if the path and the answer follow the TeaRAG format, else ``0``;
* eqs. 7–8, entity–subquery consistency by cover exact match: ``r_e^t = 1`` if every key entity of ``E_t``
  occurs (normalized) in ``q_t``, else ``0``; ``r_e = (1/T) Σ_t r_e^t``;
* eqs. 9–11, memory vectors over the golden evidence ``G = {g_1 … g_m}``:
  ``M^q_j = max_t sim(g_j, q_t)``, ``M^c_j = max_t sim(g_j, c_t)``, ``M^s_j = max_t sim(g_j, o_t)``, where
  ``sim(g, x) = σ(reranker(g, x))`` ∈ [0, 1];
* eq. 12, knowledge matching. The paper's prose normalizes by the number of steps, ``Σ_j M^x_j / T``
  (``normalization="steps"``); the default is prorag's reconstruction, normalized by steps *and* evidences
  (``normalization="steps_and_evidence"``)::

      r_x = Σ_{j=1..m} M^x_j / max(T, m)        for x ∈ {q, c, s}

  The prose: "an ideal path might decompose the problem into approximately m subqueries"; ``T ≈ m`` is concise,
  ``T > m`` is overthinking, so "we normalize the summed memory scores by the number of steps". For ``T ≥ m``
  this *is* ``Σ_j M_j / T`` (information gain per step); for ``T < m`` it is the mean coverage ``Σ_j M_j / m``,
  so ``r_x ∈ [0, 1]``, the ideal path (``T = m``, every ``M_j = 1``) scores 1, a path that skips a hop cannot
  reach it (a one-step path of a two-hop question gets at most ``(1 + M_2) / 2``), and an extra step costs
  ``m / (m + 1)``. ``normalization="steps"`` is the literal ``Σ_j M_j / T``: it ranks a one-step path that
  covers one hop of two (``1 + M_2``, up to 2) *above* the ideal two-step path (1), the opposite of the prose,
  and exceeds 1 — kept to reproduce that reading. The printed eq. 12 was lost from the text here and could not
  be read from this machine; ``max(T, m)`` is the reconstruction that satisfies every sentence around it;
* eq. 13, process reward: ``r_p = w_e·r_e + w_q·r_q + w_c·r_c + w_s·r_s``. The paper's weights were lost with the
  symbols; the default is the plain mean (``w = 1/4`` each), which keeps ``r_p`` in [0, 1], the scale of
  ``r_o`` and ``r_f`` (the pairs are ranked by ``r_o + r_f + r_p``). This is a reconstruction.

Single-hop questions (no golden evidence, §4.3.2 "DPO pair construction"): no process reward; the outcome is
divided by the path length, ``r_o ← r_o / T`` and ``r_p = 0``.

Similarity (one small interface, :data:`Similarity`): :class:`RerankerSimilarity` is the paper's (a cross-encoder
reranker such as BGE-reranker, its logit through a sigmoid; ``conf/gpu``). :class:`EmbedderSimilarity` is the
embedded default's *deviation*: the cosine of the bundled all-MiniLM-L6-v2 embeddings clipped at 0, a
bi-encoder score in [0, 1] that is not calibrated like a reranker's probability.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from pydantic import Field

from prorag.data.records import Question
from prorag.metrics.qa import f1_score, normalize_answer
from prorag.protocol.tearag import TeaRAGParseError, TeaRAGPath, extract_answer, parse
from prorag.rewards.base import Reward, RewardNeeds, RewardScores, RewardSettings, ScoringContext

if TYPE_CHECKING:
    from prorag.retrieval.embedder import Embedder

KnowledgeNormalization = Literal["steps_and_evidence", "steps"]
KNOWLEDGE_NORMALIZATIONS: tuple[KnowledgeNormalization, ...] = ("steps_and_evidence", "steps")

Similarity = Callable[[Sequence[str], Sequence[str]], np.ndarray]
"""``sim(evidence, texts)`` → an array of shape ``(len(evidence), len(texts))`` with values in [0, 1]."""


# --------------------------------------------------------------------------------------- similarity


def sigmoid(values: np.ndarray) -> np.ndarray:
    """The logistic function ``1 / (1 + e^-x)``, without overflow warnings."""
    values = np.clip(np.asarray(values, dtype=np.float64), -500.0, 500.0)
    return 1.0 / (1.0 + np.exp(-values))


class RerankerSimilarity:
    """The paper's ``sim``: a cross-encoder reranker's raw score through a sigmoid (eq. 9)."""

    def __init__(self, model: str, *, device: str | None = None, batch_size: int = 32, max_length: int = 512) -> None:
        from sentence_transformers import CrossEncoder

        self.model_name = model
        self.batch_size = batch_size
        self._model = CrossEncoder(model, device=device, max_length=max_length)

    def __call__(self, evidence: Sequence[str], texts: Sequence[str]) -> np.ndarray:
        import torch

        if not evidence or not texts:
            return np.zeros((len(evidence), len(texts)))
        pairs = [(gold, text) for gold in evidence for text in texts]
        logits = self._model.predict(pairs, batch_size=self.batch_size, activation_fn=torch.nn.Identity(),
                                     show_progress_bar=False)
        return sigmoid(np.asarray(logits, dtype=np.float64).reshape(len(evidence), len(texts)))


class EmbedderSimilarity:
    """Deviation for the CPU default: ``max(0, cos(embed(g), embed(x)))`` with the bundled embedder."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder

    def __call__(self, evidence: Sequence[str], texts: Sequence[str]) -> np.ndarray:
        if not evidence or not texts:
            return np.zeros((len(evidence), len(texts)))
        left = self.embedder.encode(list(evidence))
        right = self.embedder.encode(list(texts))
        return np.clip(np.asarray(left @ right.T, dtype=np.float64), 0.0, 1.0)


def load_similarity(spec: str) -> Similarity:
    """``"reranker:<model>"`` (the paper's) or ``"embedder:<embedder spec>"`` (the CPU deviation)."""
    kind, _, target = spec.partition(":")
    if not target:
        raise ValueError(f"similarity spec {spec!r} must be 'reranker:<model>' or 'embedder:<embedder spec>'")
    if kind == "reranker":
        return RerankerSimilarity(target)
    if kind == "embedder":
        from prorag.retrieval.embedder import load_embedder

        return EmbedderSimilarity(load_embedder(target, show_progress=False))
    raise ValueError(f"unknown similarity kind {kind!r} in {spec!r} (use 'reranker' or 'embedder')")


# ------------------------------------------------------------------------------------------ rewards


def golden_evidence(question: Question) -> list[str]:
    """The golden evidence ``G`` of eqs. 9–11: MuSiQue's supporting paragraphs (title and text), HotpotQA's
    supporting sentences (title: sentence); none for a single-hop question (NQ), which gets no process reward."""
    metadata = question.metadata
    if isinstance(metadata.get("paragraphs"), list):
        return [f"{p.get('title', '')}: {p.get('paragraph_text', '')}".strip()
                for p in metadata["paragraphs"] if isinstance(p, dict) and p.get("is_supporting")]
    facts, context = metadata.get("supporting_facts"), metadata.get("context")
    if isinstance(facts, list) and isinstance(context, list):
        pages = {str(page[0]): page[1] for page in context if isinstance(page, list) and len(page) == 2}
        evidence = []
        for fact in facts:
            if isinstance(fact, list) and len(fact) == 2 and isinstance(fact[1], int):
                sentences = pages.get(str(fact[0])) or []
                if 0 <= fact[1] < len(sentences):
                    evidence.append(f"{fact[0]}: {str(sentences[fact[1]]).strip()}")
        return evidence
    return []



def outcome_reward(answer: str | None, golden_answers: Sequence[str]) -> float:
    """Eq. 5: word-level F1 between the answer and the ground truth (best over the golden answers)."""
    return f1_score(answer, golden_answers)


def format_reward(completion: str) -> float:
    """Eq. 6: 1 if the completion follows the TeaRAG format, else 0."""
    try:
        parse(completion)
    except TeaRAGParseError:
        return 0.0
    return 1.0


def entity_covered(entities: Sequence[str], subquery: str) -> float:
    """Eq. 7: 1 if every key entity occurs in the subquery (cover exact match, normalized), else 0."""
    query = f" {normalize_answer(subquery)} "
    names = [normalize_answer(entity) for entity in entities]
    return float(bool(names) and all(name and f" {name} " in query for name in names))


def consistency_reward(path: TeaRAGPath) -> float:
    """Eq. 8: the share of steps whose subquery covers all their key entities."""
    return sum(entity_covered(step.entities, step.subquery) for step in path.steps) / path.n_steps


def memory_vector(evidence: Sequence[str], texts: Sequence[str], similarity: Similarity) -> np.ndarray:
    """Eqs. 9–11: ``M_j = max_t sim(g_j, x_t)`` for each golden evidence ``g_j``."""
    if not evidence:
        return np.zeros(0)
    if not texts:
        return np.zeros(len(evidence))
    scores = np.asarray(similarity(evidence, texts), dtype=np.float64)
    if scores.shape != (len(evidence), len(texts)):
        raise ValueError(f"similarity returned shape {scores.shape}, expected {(len(evidence), len(texts))}")
    return scores.max(axis=1)


@dataclass(frozen=True)
class ProcessWeights:
    """Eq. 13's weights of ``r_e, r_q, r_c, r_s`` (reconstructed: the plain mean by default)."""

    consistency: float = 0.25
    subquery: float = 0.25
    context: float = 0.25
    summary: float = 0.25

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"process weight {name} must be finite and >= 0, got {value}")


@dataclass(frozen=True)
class TeaRAGReward:
    """Every component of one path's reward; ``total = r_o + r_f + r_p`` ranks the paths of a question."""

    outcome: float
    """``r_o`` as used for the pairs: F1, divided by ``T`` for a single-hop question."""
    f1: float
    """The raw F1 of the answer (eq. 5 before any single-hop scaling)."""
    format: float
    process: float
    consistency: float
    subquery_match: float
    context_match: float
    summary_match: float
    n_steps: int
    single_hop: bool

    @property
    def total(self) -> float:
        return self.outcome + self.format + self.process

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total}


def knowledge_matching(path: TeaRAGPath, evidence: Sequence[str], similarity: Similarity, *,
                       normalization: KnowledgeNormalization = "steps_and_evidence") -> tuple[float, float, float]:
    """Eq. 12: ``(r_q, r_c, r_s)``, each memory vector summed and divided by ``max(T, m)`` (``steps_and_evidence``)
    or by ``T`` (``steps``); ``T`` steps, ``m`` golden evidences."""
    if normalization not in KNOWLEDGE_NORMALIZATIONS:
        raise ValueError(f"unknown normalization {normalization!r} (use one of {KNOWLEDGE_NORMALIZATIONS})")
    steps = path.steps
    memories = (
        memory_vector(evidence, [step.subquery for step in steps], similarity),
        memory_vector(evidence, [step.context for step in steps], similarity),
        memory_vector(evidence, [step.summary for step in steps], similarity),
    )
    denominator = path.n_steps if normalization == "steps" else max(path.n_steps, len(evidence))
    r_q, r_c, r_s = (float(memory.sum()) / denominator for memory in memories)
    return r_q, r_c, r_s


def tearag_reward(completion: str, golden_answers: Sequence[str], evidence: Sequence[str],
                  similarity: Similarity | None, *, weights: ProcessWeights | None = None,
                  normalization: KnowledgeNormalization = "steps_and_evidence") -> TeaRAGReward:
    """The reward of one completion (eqs. 5–13).

    ``evidence`` empty ⇒ single-hop (``r_o / T``, no process reward). A path that fails the format gets
    ``r_f = 0``, ``r_p = 0`` and the F1 of its leniently extracted answer. ``similarity`` may be None only for
    single-hop questions.
    """
    weights = weights or ProcessWeights()
    try:
        path = parse(completion)
    except TeaRAGParseError:
        f1 = outcome_reward(extract_answer(completion), golden_answers)
        return TeaRAGReward(outcome=f1, f1=f1, format=0.0, process=0.0, consistency=0.0, subquery_match=0.0,
                            context_match=0.0, summary_match=0.0, n_steps=0, single_hop=not evidence)
    f1 = outcome_reward(path.answer, golden_answers)
    consistency = consistency_reward(path)
    if not evidence:
        return TeaRAGReward(outcome=f1 / path.n_steps, f1=f1, format=1.0, process=0.0, consistency=consistency,
                            subquery_match=0.0, context_match=0.0, summary_match=0.0, n_steps=path.n_steps,
                            single_hop=True)
    if similarity is None:
        raise ValueError("a multi-hop question (with golden evidence) needs a similarity for the process reward")
    r_q, r_c, r_s = knowledge_matching(path, evidence, similarity, normalization=normalization)
    process = (weights.consistency * consistency + weights.subquery * r_q + weights.context * r_c
               + weights.summary * r_s)
    return TeaRAGReward(outcome=f1, f1=f1, format=1.0, process=process, consistency=consistency, subquery_match=r_q,
                        context_match=r_c, summary_match=r_s, n_steps=path.n_steps, single_hop=False)


# ------------------------------------------------------------------------------------------ the plug-in


class KnowledgeMatchingSettings(RewardSettings):
    """TeaRAG's reward: outcome (F1), format and the knowledge-matching process reward (eqs. 5–13)."""

    kind: Literal["knowledge_matching"] = "knowledge_matching"
    similarity: str = "embedder:bundled:all-minilm-l6-v2"
    """``reranker:<model>`` (the paper's: a cross-encoder logit through a sigmoid) or ``embedder:<spec>`` (the CPU
    deviation: clipped cosine of the bundled embedder)."""
    normalization: KnowledgeNormalization = "steps_and_evidence"
    """Eq. 12's normalizer: ``steps_and_evidence`` (``max(T, m)``, the reconstruction) or ``steps`` (``T`` alone,
    the literal reading; see the module docstring)."""
    weight_consistency: float = Field(default=0.25, ge=0)
    weight_subquery: float = Field(default=0.25, ge=0)
    weight_context: float = Field(default=0.25, ge=0)
    weight_summary: float = Field(default=0.25, ge=0)

    def weights(self) -> ProcessWeights:
        return ProcessWeights(consistency=self.weight_consistency, subquery=self.weight_subquery,
                              context=self.weight_context, summary=self.weight_summary)


class KnowledgeMatchingReward(Reward):
    """:func:`tearag_reward` per rollout, against its question's golden evidence (:func:`golden_evidence`); the
    per-path components (F1, consistency, the three matches, single-hop) are in ``details``. ``similarity`` may be
    given (a test's stand-in); otherwise the settings' spec is loaded on first use."""

    kind: ClassVar[str] = "knowledge_matching"
    Settings: ClassVar[type[RewardSettings]] = KnowledgeMatchingSettings
    components: ClassVar[tuple[str, ...]] = ("outcome", "format", "process")
    protocols: ClassVar[tuple[str, ...] | None] = ("tearag",)
    claims_protocols: ClassVar[bool] = True

    def __init__(self, settings: RewardSettings, similarity: Similarity | None = None) -> None:
        super().__init__(settings)
        self._similarity = similarity

    @property
    def needs(self) -> RewardNeeds:
        return RewardNeeds(evidence=True)

    def similarity(self) -> Similarity:
        if self._similarity is None:
            self._similarity = load_similarity(self.settings.similarity)  # type: ignore[attr-defined]
        return self._similarity

    def score(self, rollouts: Sequence[Any], context: ScoringContext) -> RewardScores:
        weights = self.settings.weights()  # type: ignore[attr-defined]
        components: dict[str, list[float]] = {name: [] for name in self.components}
        totals: list[float] = []
        details: list[dict[str, Any]] = []
        for rollout in rollouts:
            evidence = golden_evidence(context.questions[rollout.question_key])
            reward = tearag_reward(rollout.completion, rollout.golden_answers, evidence,
                                   self.similarity() if evidence else None, weights=weights,
                                   normalization=self.settings.normalization)  # type: ignore[attr-defined]
            for name, value in (("outcome", reward.outcome), ("format", reward.format), ("process", reward.process)):
                components[name].append(float(value))
            totals.append(float(reward.total))
            details.append(reward.to_dict())
        return RewardScores(components, totals, [None] * len(rollouts), details=details)
