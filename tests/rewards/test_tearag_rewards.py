from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from prorag.protocol.tearag import TeaRAGPath, TeaRAGStep, render
from prorag.rewards.tearag import (
    EmbedderSimilarity,
    ProcessWeights,
    consistency_reward,
    entity_covered,
    format_reward,
    knowledge_matching,
    load_similarity,
    memory_vector,
    outcome_reward,
    sigmoid,
    tearag_reward,
)

EVIDENCE = ["gold one", "gold two"]

# sim(g, x) by hand: a lookup table over the texts of the path below.
TABLE = {
    ("gold one", "q1"): 0.9, ("gold two", "q1"): 0.1,
    ("gold one", "q2"): 0.2, ("gold two", "q2"): 0.7,
    ("gold one", "q3"): 0.3, ("gold two", "q3"): 0.6,
    ("gold one", "c1"): 0.8, ("gold two", "c1"): 0.0,
    ("gold one", "c2"): 0.5, ("gold two", "c2"): 0.4,
    ("gold one", "c3"): 0.1, ("gold two", "c3"): 1.0,
    ("gold one", "s1"): 0.6, ("gold two", "s1"): 0.2,
    ("gold one", "s2"): 0.0, ("gold two", "s2"): 0.5,
    ("gold one", "s3"): 0.4, ("gold two", "s3"): 0.3,
}


def table_similarity(evidence: Sequence[str], texts: Sequence[str]) -> np.ndarray:
    return np.array([[TABLE[(gold, text.split()[-1])] for text in texts] for gold in evidence])


PATH = TeaRAGPath(
    steps=(
        TeaRAGStep(("Jaws",), "who directed Jaws q1", "ctx c1", "sum s1"),  # entity covered
        TeaRAGStep(("Steven Spielberg", "Ohio"), "where was Steven Spielberg born q2", "ctx c2", "sum s2"),  # not
        TeaRAGStep(("The Beatles",), "members of beatles q3", "ctx c3", "sum s3"),  # covered after normalization
    ),
    answer="Cincinnati Ohio",
)


def test_outcome_reward_is_f1() -> None:
    # prediction "cincinnati ohio", gold "cincinnati": P = 1/2, R = 1 → F1 = 2/3
    assert outcome_reward("Cincinnati, Ohio", ["Cincinnati"]) == pytest.approx(2 / 3)
    assert outcome_reward(None, ["x"]) == 0.0


def test_format_reward() -> None:
    assert format_reward(render(PATH)) == 1.0
    assert format_reward(render(PATH)[:-3]) == 0.0


def test_consistency_by_cover_exact_match() -> None:
    assert entity_covered(["Jaws"], "who directed jaws?") == 1.0
    assert entity_covered(["Ohio", "Steven Spielberg"], "where was Steven Spielberg born") == 0.0
    assert entity_covered(["Art"], "the party") == 0.0  # whole words only
    assert entity_covered([], "anything") == 0.0
    assert consistency_reward(PATH) == pytest.approx(2 / 3)


def test_memory_vectors_and_knowledge_matching_by_hand() -> None:
    # M^q = (max(.9,.2,.3), max(.1,.7,.6)) = (.9, .7); M^c = (.8, 1.0); M^s = (.6, .5); T = 3
    assert memory_vector(EVIDENCE, ["a q1", "a q2", "a q3"], table_similarity).tolist() == pytest.approx([0.9, 0.7])
    r_q, r_c, r_s = knowledge_matching(PATH, EVIDENCE, table_similarity)
    assert (r_q, r_c, r_s) == pytest.approx((1.6 / 3, 1.8 / 3, 1.1 / 3))


def test_total_reward_by_hand() -> None:
    reward = tearag_reward(render(PATH), ["Cincinnati"], EVIDENCE, table_similarity)
    expected_process = 0.25 * (2 / 3) + 0.25 * (1.6 / 3) + 0.25 * (1.8 / 3) + 0.25 * (1.1 / 3)  # = 0.5417
    assert reward.process == pytest.approx(expected_process)
    assert reward.outcome == pytest.approx(2 / 3) and reward.format == 1.0 and reward.n_steps == 3
    assert reward.total == pytest.approx(2 / 3 + 1 + expected_process)
    weighted = tearag_reward(render(PATH), ["Cincinnati"], EVIDENCE, table_similarity,
                             weights=ProcessWeights(consistency=1.0, subquery=0.0, context=0.0, summary=0.0))
    assert weighted.process == pytest.approx(2 / 3)


def test_more_steps_lower_the_knowledge_matching() -> None:
    # beyond m = 2 steps every extra step divides the same memory sum by one more
    two = TeaRAGPath(steps=PATH.steps[:2], answer="x")
    four = TeaRAGPath(steps=(*PATH.steps[:2], PATH.steps[0], PATH.steps[1]), answer="x")
    assert knowledge_matching(four, EVIDENCE, table_similarity)[0] == pytest.approx(
        knowledge_matching(two, EVIDENCE, table_similarity)[0] / 2)
    one = TeaRAGPath(steps=PATH.steps[:1], answer="x")
    doubled = TeaRAGPath(steps=(PATH.steps[0], PATH.steps[0]), answer="x")
    assert knowledge_matching(doubled, EVIDENCE, table_similarity, normalization="steps")[0] == pytest.approx(
        knowledge_matching(one, EVIDENCE, table_similarity, normalization="steps")[0] / 2)


def _eq12(memory: Sequence[float], steps: int, evidences: int) -> float:
    """Eq. 12 as rebuilt, written out: Σ_j M_j / max(T, m)."""
    return sum(memory) / max(steps, evidences)


def test_eq12_normalizes_by_steps_and_evidences() -> None:
    one = TeaRAGPath(steps=PATH.steps[:1], answer="x")  # T = 1 < m = 2: M^q = (.9, .1), M^c = (.8, 0), M^s = (.6, .2)
    assert knowledge_matching(one, EVIDENCE, table_similarity) == pytest.approx(
        (_eq12([0.9, 0.1], 1, 2), _eq12([0.8, 0.0], 1, 2), _eq12([0.6, 0.2], 1, 2)))
    assert knowledge_matching(one, EVIDENCE, table_similarity, normalization="steps") == pytest.approx(
        (1.0, 0.8, 0.8))  # the literal Σ_j M_j / T
    # T = 3 > m = 2: both readings divide by T
    assert knowledge_matching(PATH, EVIDENCE, table_similarity) == pytest.approx(
        knowledge_matching(PATH, EVIDENCE, table_similarity, normalization="steps"))
    with pytest.raises(ValueError, match="normalization"):
        knowledge_matching(PATH, EVIDENCE, table_similarity, normalization="bogus")  # type: ignore[arg-type]


# A two-hop question: hop A's texts match evidence g_a fully, hop B's g_b; texts of one hop reach 0.4 on the
# other hop's evidence (related topics); off-topic contexts match nothing.
HOPS = {("g_a", "A"): 1.0, ("g_b", "A"): 0.4, ("g_a", "B"): 0.4, ("g_b", "B"): 1.0,
        ("g_a", "X"): 0.0, ("g_b", "X"): 0.0}


def hop_similarity(evidence: Sequence[str], texts: Sequence[str]) -> np.ndarray:
    return np.array([[HOPS[(gold, text.split()[-1])] for text in texts] for gold in evidence])


STEP_A = TeaRAGStep(("Jaws",), "who directed Jaws A", "ctx A", "sum A")
STEP_B = TeaRAGStep(("Spielberg",), "where was Spielberg born B", "ctx B", "sum B")


def _process(steps: tuple[TeaRAGStep, ...], normalization: str = "steps_and_evidence") -> float:
    return tearag_reward(render(TeaRAGPath(steps, "Cincinnati")), ["Cincinnati"], ["g_a", "g_b"], hop_similarity,
                         normalization=normalization).process  # type: ignore[arg-type]


def test_ideal_two_step_path_beats_a_one_step_path_covering_one_hop() -> None:
    # by hand (w = 1/4 each, consistency 1 on both): ideal r_q = r_c = r_s = (1 + 1) / 2 = 1 -> r_p = 1;
    # one step A: r_x = (1 + 0.4) / max(1, 2) = 0.7 -> r_p = (1 + 3 · 0.7) / 4 = 0.775
    assert _process((STEP_A, STEP_B)) == pytest.approx(1.0)
    assert _process((STEP_A,)) == pytest.approx((1 + 3 * 0.7) / 4)
    assert _process((STEP_A, STEP_B)) > _process((STEP_A,))
    # an extra step costs: (1 + 3 · 2/3) / 4 = 0.75
    assert _process((STEP_A, STEP_B, STEP_B)) == pytest.approx((1 + 3 * 2 / 3) / 4)
    # the literal Σ M / T ranks the one-step path first: (1 + 3 · 1.4) / 4 = 1.3 > 1
    assert _process((STEP_A,), "steps") == pytest.approx((1 + 3 * 1.4) / 4)
    assert _process((STEP_A,), "steps") > _process((STEP_A, STEP_B), "steps")


def test_off_topic_contexts_cost_their_share_of_the_process_reward() -> None:
    off_a = TeaRAGStep(STEP_A.entities, STEP_A.subquery, "unrelated X", STEP_A.summary)
    off_b = TeaRAGStep(STEP_B.entities, STEP_B.subquery, "unrelated X", STEP_B.summary)
    # r_c falls from 1 to 0: the path loses w_c · 1 = 0.25 of its process reward
    assert _process((STEP_A, STEP_B)) - _process((off_a, off_b)) == pytest.approx(0.25)


def test_single_hop_divides_the_outcome_by_the_path_length() -> None:
    reward = tearag_reward(render(PATH), ["Cincinnati Ohio"], [], None)
    assert reward.single_hop and reward.f1 == 1.0
    assert reward.outcome == pytest.approx(1 / 3) and reward.process == 0.0


def test_malformed_path_gets_no_format_and_no_process() -> None:
    reward = tearag_reward("<step>junk</step><answer>Cincinnati</answer>", ["Cincinnati"], EVIDENCE,
                           table_similarity)
    assert reward.format == 0.0 and reward.process == 0.0 and reward.f1 == 1.0 and reward.n_steps == 0


def test_multi_hop_needs_a_similarity() -> None:
    with pytest.raises(ValueError, match="similarity"):
        tearag_reward(render(PATH), ["x"], EVIDENCE, None)


def test_sigmoid_and_embedder_similarity() -> None:
    assert sigmoid(np.array([0.0, 1000.0, -1000.0])).tolist() == pytest.approx([0.5, 1.0, 0.0])

    class Orthonormal:
        def encode(self, texts: list[str]) -> np.ndarray:
            basis = {"a": [1.0, 0.0], "b": [0.0, 1.0], "-a": [-1.0, 0.0]}
            return np.array([basis[text] for text in texts])

    scores = EmbedderSimilarity(Orthonormal())(["a"], ["a", "b", "-a"])  # type: ignore[arg-type]
    assert scores.tolist() == [[1.0, 0.0, 0.0]]  # negative cosine clipped at 0
    with pytest.raises(ValueError, match="reranker"):
        load_similarity("nonsense")
