"""Does TeaRAG's knowledge-matching process reward order hand-built paths as the paper intends?

For the two-hop MuSiQue *train* questions of the shipped data, four paths are built from the question's own
decomposition and supporting paragraphs (no model involved):

* ``ideal``: one step per hop, the gold sub-question as subquery, the hop's supporting paragraph (and one
  non-supporting paragraph of the record) as context, a summary stating the sub-answer;
* ``one_step``: only the first hop's step, then the final answer (the path that skips a hop);
* ``redundant``: the ideal path with its last step repeated (``T = K + 1``);
* ``off_topic``: the ideal subqueries, but every context is off-topic (background passages) and every summary
  says nothing was found.

Every step's key entity is its subquery, so the entity consistency (eq. 8) is 1 everywhere and the comparison
isolates the knowledge matching (eqs. 9–12).

Each path is scored with :func:`prorag.rewards.tearag.tearag_reward` under each ``normalization`` and the
chosen similarity, and the mean process reward per path kind is printed with how often the ideal path beats
the others. ``--floor`` also scores with a rescaled similarity ``clip((sim − b) / (1 − b), 0, 1)`` (a probe of
calibrating the bi-encoder's cosine; a floor of 0.3 did not widen the gaps, so the reward has no such option).
Run (about 20 s on 2 shared CPU cores)::

    python experiments/tearag_reward_check.py [--questions 12] [--floor 0 0.3] \
        [--similarity embedder:bundled:all-minilm-l6-v2]
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path
from statistics import mean

import numpy as np

from prorag.data.records import Question
from prorag.protocol.escaping import unescape_retrieved
from prorag.protocol.tearag import TeaRAGPath, TeaRAGStep, format_documents, render
from prorag.rewards.tearag import KNOWLEDGE_NORMALIZATIONS, golden_evidence, load_similarity, tearag_reward

ROOT = Path(__file__).resolve().parents[1]


def _context(passages: list[tuple[str, str]]) -> str:
    return unescape_retrieved(format_documents(passages))


def build_paths(question: Question, background: list[dict[str, str]], rng: random.Random) -> dict[str, str]:
    """The four rendered paths of one two-hop MuSiQue record."""
    paragraphs = question.metadata["paragraphs"]
    decomposition = question.metadata["question_decomposition"]
    others = [p for p in paragraphs if not p.get("is_supporting")]
    steps = []
    for entry in decomposition:
        gold = paragraphs[entry["paragraph_support_idx"]]
        distractor = rng.choice(others)
        context = _context([(gold["title"], gold["paragraph_text"]),
                            (distractor["title"], distractor["paragraph_text"])])
        subquery = entry["question"].replace("#1", decomposition[0]["answer"])
        # the key entity is the subquery itself, so eq. 8's consistency is 1 on every path and the comparison
        # isolates eqs. 9-12 (the knowledge matching)
        steps.append(TeaRAGStep((subquery,), subquery, context, f"So the answer is {entry['answer']}."))
    answer = question.golden_answers[0]
    off_topic = tuple(TeaRAGStep(step.entities, step.subquery,
                                 _context([(b["title"], b["text"]) for b in rng.sample(background, 2)]),
                                 "The reference does not say.") for step in steps)
    return {
        "ideal": render(TeaRAGPath(tuple(steps), answer)),
        "one_step": render(TeaRAGPath(tuple(steps[:1]), answer)),
        "redundant": render(TeaRAGPath((*steps, steps[-1]), answer)),
        "off_topic": render(TeaRAGPath(off_topic, answer)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=12)
    parser.add_argument("--similarity", default="embedder:bundled:all-minilm-l6-v2")
    parser.add_argument("--floor", type=float, nargs="+", default=[0.0],
                        help="also score with sim' = clip((sim - floor) / (1 - floor), 0, 1), a calibration probe")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    records = [Question.from_dict(json.loads(line))
               for line in (ROOT / "data/01_raw/qa/musique_train.jsonl").open(encoding="utf-8")]
    two_hop = [q for q in records if len(q.metadata.get("question_decomposition") or []) == 2][:args.questions]
    background = [json.loads(line) for line in
                  (ROOT / "data/01_raw/corpus/wikipedia_vital_leads.jsonl").open(encoding="utf-8")][:2000]
    base = load_similarity(args.similarity)
    paths = [(q, build_paths(q, background, rng)) for q in two_hop]
    cache: dict[tuple[str, str], float] = {}

    def cached(evidence: Sequence[str], texts: Sequence[str]) -> np.ndarray:
        missing = sorted({(g, t) for g in evidence for t in texts} - cache.keys())
        if missing:
            golds, bodies = sorted({g for g, _ in missing}), sorted({t for _, t in missing})
            scores = base(golds, bodies)
            for i, g in enumerate(golds):
                for j, t in enumerate(bodies):
                    cache[(g, t)] = float(scores[i, j])
        return np.array([[cache[(g, t)] for t in texts] for g in evidence])

    print(f"{len(two_hop)} two-hop MuSiQue-train questions, similarity {args.similarity}")
    for floor, normalization in ((f, n) for f in args.floor for n in KNOWLEDGE_NORMALIZATIONS):
        def similarity(evidence: Sequence[str], texts: Sequence[str], floor: float = floor) -> np.ndarray:
            return np.clip((cached(evidence, texts) - floor) / (1.0 - floor), 0.0, 1.0)

        scores: dict[str, list[float]] = {}
        for question, rendered in paths:
            evidence = golden_evidence(question)
            for kind, completion in rendered.items():
                reward = tearag_reward(completion, question.golden_answers, evidence, similarity,
                                       normalization=normalization)
                scores.setdefault(kind, []).append(reward.process)
        wins = {kind: mean(float(i > o) for i, o in zip(scores["ideal"], scores[kind], strict=True))
                for kind in scores if kind != "ideal"}
        print(f"floor={floor} normalization={normalization}: r_p mean [min, max] " +
              ", ".join(f"{kind} {mean(values):.3f} [{min(values):.2f}, {max(values):.2f}]"
                        for kind, values in scores.items()) +
              "; ideal beats " + ", ".join(f"{kind} {share:.0%}" for kind, share in wins.items()))


if __name__ == "__main__":
    main()
