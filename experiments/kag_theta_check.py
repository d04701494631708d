"""Where does TeaRAG's triplet threshold θ (eq. 2, ``kag.theta``) fall on the embedder's cosines?

For the multi-hop MuSiQue *train* questions of the shipped data, each hop's gold sub-question (``#1`` resolved)
is a subquery. Its chunks are the hop's supporting paragraph and up to ``--distractors`` non-supporting
paragraphs of the same record (same topic, the hard case). Its triplets are those the extractor (conf/base's
SmolLM2-135M, in process, the KG prompt, ungrounded triplets dropped) writes for those chunks, embedded as the
knowledge graph embeds them (``"head relation tail"`` as a passage). The script prints, per kind of pair, the
cosine quantiles and the share at or above each ``--theta``:

* ``chunk, supporting`` / ``chunk, other``: eq. 1's inputs;
* ``triplet, answer-bearing``: a triplet of the supporting chunk that names the sub-answer (the one PPR should
  keep); ``triplet, other``: every other triplet of these chunks.

A θ that filters separates the last two rows. Run (about 4 min on 2 shared CPU cores, almost all of it the
extraction; ``--no-extract`` skips the triplets)::

    python experiments/kag_theta_check.py [--questions 12] [--theta 0.3 0.4 0.5] \
        [--embedder bundled:all-minilm-l6-v2]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from prorag.data.records import Passage, Question
from prorag.kg.extraction import ExtractionSettings, extract_triplets
from prorag.llm.factory import build_generator
from prorag.llm.registry import BUNDLED_SMOLLM2
from prorag.metrics.qa import cover_exact_match
from prorag.retrieval.embedder import BUNDLED_MINILM, load_embedder

ROOT = Path(__file__).resolve().parents[1]


def hops(question: Question, distractors: int) -> list[tuple[str, str, Passage, list[Passage]]]:
    """(subquery, sub-answer, supporting paragraph, other paragraphs) per hop of a MuSiQue record."""
    paragraphs = question.metadata["paragraphs"]
    decomposition = question.metadata["question_decomposition"]
    others = [p for p in paragraphs if not p.get("is_supporting")][:distractors]

    def passage(p: dict) -> Passage:
        return Passage(id=f"{question.id}-{p['idx']}", title=p["title"], text=p["paragraph_text"])

    found = []
    for entry in decomposition:
        subquery = entry["question"]
        for position, earlier in enumerate(decomposition, start=1):
            subquery = subquery.replace(f"#{position}", earlier["answer"])
        found.append((subquery, entry["answer"], passage(paragraphs[entry["paragraph_support_idx"]]),
                      [passage(p) for p in others]))
    return found


def describe(name: str, values: Sequence[float], thetas: Sequence[float]) -> str:
    if not values:
        return f"| {name} | 0 | – | – | – | – | – | " + " | ".join("–" for _ in thetas) + " |"
    q = np.quantile(np.asarray(values), [0.0, 0.1, 0.5, 0.9, 1.0])
    shares = " | ".join(f"{np.mean(np.asarray(values) >= theta):.0%}" for theta in thetas)
    return f"| {name} | {len(values)} | " + " | ".join(f"{v:.2f}" for v in q) + f" | {shares} |"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=12)
    parser.add_argument("--distractors", type=int, default=2)
    parser.add_argument("--theta", type=float, nargs="+", default=[0.3, 0.4, 0.5])
    parser.add_argument("--embedder", default=BUNDLED_MINILM)
    parser.add_argument("--extractor", default=BUNDLED_SMOLLM2)
    parser.add_argument("--no-extract", action="store_true", help="chunks only (no triplet extraction)")
    args = parser.parse_args(argv)
    records = [Question.from_dict(json.loads(line))
               for line in (ROOT / "data/01_raw/qa/musique_train.jsonl").open(encoding="utf-8")]
    multi_hop = [q for q in records if len(q.metadata.get("question_decomposition") or []) >= 2][:args.questions]
    pairs = [hop for question in multi_hop for hop in hops(question, args.distractors)]
    embedder = load_embedder(args.embedder, show_progress=False)
    queries = embedder.encode_queries([subquery for subquery, *_ in pairs])
    rows: dict[str, list[float]] = {"chunk, supporting": [], "chunk, other": [], "triplet, answer-bearing": [],
                                    "triplet, other": []}
    for query, (_, _, gold, others) in zip(queries, pairs, strict=True):
        scores = embedder.encode_passages([gold, *others], show_progress=False) @ query
        rows["chunk, supporting"].append(float(scores[0]))
        rows["chunk, other"].extend(float(score) for score in scores[1:])
    if not args.no_extract:
        chunks = list({p.id: p for _, _, gold, others in pairs for p in (gold, *others)}.values())
        settings = ExtractionSettings(model=args.extractor, show_progress=False)
        result = extract_triplets(build_generator(args.extractor), chunks, settings)
        by_chunk: dict[str, list[str]] = {}
        for triplet in result.triplets:
            by_chunk.setdefault(triplet.chunk_id, []).append(f"{triplet.head} {triplet.relation} {triplet.tail}")
        for query, (_, answer, gold, others) in zip(queries, pairs, strict=True):
            texts = [(text, chunk.id == gold.id) for chunk in (gold, *others) for text in by_chunk.get(chunk.id, [])]
            if not texts:
                continue
            scores = embedder.encode_passages([text for text, _ in texts], show_progress=False) @ query
            for (text, from_gold), score in zip(texts, scores, strict=True):
                bearing = from_gold and cover_exact_match(text, [answer])
                rows["triplet, answer-bearing" if bearing else "triplet, other"].append(float(score))
        print(f"extraction: {result.stats.to_dict()}")
    print(f"{len(multi_hop)} multi-hop MuSiQue-train questions, {len(pairs)} subqueries, embedder {args.embedder}\n")
    print("| pair | n | min | p10 | median | p90 | max | " + " | ".join(f"≥ θ {t}" for t in args.theta) + " |")
    print("|---|---|---|---|---|---|---|" + "---|" * len(args.theta))
    for name, values in rows.items():
        print(describe(name, values, args.theta))


if __name__ == "__main__":
    main()
