"""TeaRAG retrieval benchmark: context tokens per retrieval vs answer and supporting-passage recall, side by side.

Retrievers, all over the same index and knowledge graph (the latest versions written by ``kedro run
--pipelines=index`` and ``--pipelines=kg_extraction``, or the folders given):

* ``dense@k`` — the dense chunk top-k (the paper's Single-S / Search-R1 context);
* ``kag_concat@10`` — TeaRAG-Con: top-5 chunks + top-5 triplets concatenated (§5.4.1; 10 units);
* ``kag@k`` — TeaRAG: KAG + PPR over the retrieved chunks and triplets, top-k nodes (§4.2.4–4.2.5).

One retrieval per question, with the question as the query and its key entities found from the entity index
(single-round, like the paper's Single-S / Single-Con / Single-PPR rows). Per retrieval: the tokens of the
context exactly as the engine inserts it (``Doc i(Title: …) …`` lines, SmolLM2's tokenizer), answer recall
(a normalized gold answer is a substring of the normalized context: cover exact match) and supporting-passage
recall (the share of the question's supporting passages among the chunk hits). Means with 95% percentile
bootstrap intervals (1,000 resamples over questions; the answer-recall difference to dense@5 is paired).
Output: a table, ``data/08_reporting/kag_retrieval.csv`` and ``.md``. The paper's anchor: 618 tokens per
retrieval for TeaRAG vs 879 for TeaRAG-Con (Table 7).

The knowledge graph of the embedded default covers only the chunks ``kg_extraction`` selected (the supporting
passages of these same questions plus a background sample), so triplets exist mainly for gold chunks: an
optimistic setting for the graph side. Dense retrieval searches the whole index.

    .venv/bin/python benchmarks/kag_retrieval.py --per-source 10
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch + faiss OpenMP on 2 cores: see benchmarks/retrieval.py

import numpy as np
from rich.console import Console
from rich.table import Table

from prorag.data.records import Question
from prorag.kg.graph import load_knowledge_graph
from prorag.kg.kag import KagSettings, attach_knowledge_graph
from prorag.llm.registry import BUNDLED_SMOLLM2, load_tokenizer
from prorag.metrics.qa import cover_exact_match
from prorag.protocol.base import format_documents
from prorag.retrieval import load_index_dir, source_passage_id

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("hotpotqa", "musique", "popqa")


def latest_version(folder: Path, marker: str | None = None) -> Path:
    """The newest version of a Kedro versioned dataset at ``folder`` (``<folder>/<version>/<name>``); for a
    directory dataset, only versions holding the file ``marker`` count (a complete save)."""
    def complete(version: Path) -> bool:
        saved = version / folder.name
        return (saved / marker).is_file() if marker else saved.is_file()

    versions = sorted(path for path in folder.iterdir() if complete(path)) if folder.is_dir() else []
    if not versions:
        raise SystemExit(f"{folder}: no complete version; run the kedro pipelines first (see the docstring)")
    return versions[-1] / folder.name


def bootstrap(values: np.ndarray, resamples: int = 1000, seed: int = 0) -> tuple[float, float, float]:
    """Mean and 95% percentile-bootstrap interval (no library here takes a plain array in one line)."""
    rng = np.random.default_rng(seed)
    means = rng.choice(values, size=(resamples, len(values)), replace=True).mean(axis=1)
    return float(values.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--index-dir", type=Path, default=None)
    parser.add_argument("--kg-dir", type=Path, default=None)
    parser.add_argument("--questions", type=Path, default=None, help="index_questions.jsonl (default: latest)")
    parser.add_argument("--per-source", type=int, default=10, help="first N questions of each of " + ", ".join(SOURCES))
    parser.add_argument("--output-dir", type=Path, default=ROOT / "data" / "08_reporting")
    args = parser.parse_args(argv)
    console = Console()
    index_dir = args.index_dir or latest_version(ROOT / "data/06_models/retrieval_index", "index_meta.json")
    kg_dir = args.kg_dir or latest_version(ROOT / "data/06_models/knowledge_graph", "kg_meta.json")
    questions_path = args.questions or latest_version(ROOT / "data/04_feature/index_questions.jsonl")
    index = load_index_dir(index_dir, load_bm25=False, threads=1)
    graph = load_knowledge_graph(kg_dir)
    attach_knowledge_graph(index, graph, KagSettings())
    records = [json.loads(line) for line in Path(questions_path).read_text(encoding="utf-8").splitlines()]
    taken: dict[str, int] = {}
    questions: list[Question] = []
    for record in records:
        source = record.get("source") or record["dataset"]
        if source in SOURCES and taken.get(source, 0) < args.per_source:
            taken[source] = taken.get(source, 0) + 1
            questions.append(Question.from_dict(record))
    tokenizer = load_tokenizer(BUNDLED_SMOLLM2)
    variants = [("dense@5", "dense", 5), ("kag_concat@10 (5+5)", "kag_concat", 10), ("kag@5", "kag", 5),
                ("dense@3", "dense", 3), ("kag@3", "kag", 3)]
    console.print(f"{len(questions)} questions ({taken}); index {index_dir} ({len(index)} chunks); KG {kg_dir} "
                  f"({len(graph.entities)} entities, {len(graph.triplets)} triplets)")
    rows = []
    baseline_tokens = None
    baseline_answer: np.ndarray | None = None
    for name, kind, k in variants:
        retriever = index.retriever(kind)
        started = time.perf_counter()
        results = retriever.search([question.question for question in questions], k)
        seconds = time.perf_counter() - started
        tokens, answer, support, triplet_share = [], [], [], []
        for question, hits in zip(questions, results, strict=True):
            context = format_documents([(hit.title, hit.text) for hit in hits])
            tokens.append(len(tokenizer(context, add_special_tokens=False)["input_ids"]))
            answer.append(cover_exact_match(context, question.golden_answers))
            chunk_ids = {source_passage_id(hit.id) for hit in hits if not hit.id.startswith("triplet:")}
            gold = set(question.supporting_passage_ids)
            support.append(len(gold & chunk_ids) / len(gold) if gold else np.nan)
            triplet_share.append(sum(hit.id.startswith("triplet:") for hit in hits) / max(len(hits), 1))
        token_mean, token_low, token_high = bootstrap(np.asarray(tokens, dtype=float))
        baseline_tokens = baseline_tokens or token_mean
        answer_array = np.asarray(answer, dtype=float)
        baseline_answer = answer_array if baseline_answer is None else baseline_answer
        answer_mean, answer_low, answer_high = bootstrap(answer_array)
        difference, difference_low, difference_high = bootstrap(answer_array - baseline_answer)  # paired
        support_values = np.asarray([value for value in support if not np.isnan(value)], dtype=float)
        support_mean, support_low, support_high = bootstrap(support_values)
        rows.append({
            "retriever": name, "questions": len(questions),
            "tokens_per_retrieval": round(token_mean, 1), "tokens_95ci": f"[{token_low:.0f}, {token_high:.0f}]",
            "tokens_vs_dense@5": round(token_mean / baseline_tokens, 3),
            "answer_recall": round(answer_mean, 3), "answer_recall_95ci": f"[{answer_low:.3f}, {answer_high:.3f}]",
            "answer_recall_vs_dense@5": f"{difference:+.3f} [{difference_low:+.3f}, {difference_high:+.3f}]",
            "support_recall": round(support_mean, 3), "support_recall_95ci": f"[{support_low:.3f}, {support_high:.3f}]",
            "triplet_share": round(float(np.mean(triplet_share)), 3),
            "ms_per_query": round(1000 * seconds / len(questions), 1),
        })
    table = Table(title="Context per retrieval: dense chunks vs TeaRAG-Con vs KAG+PPR (one round, question as query)")
    for column in rows[0]:
        table.add_column(column, justify="left" if column == "retriever" else "right")
    for row in rows:
        table.add_row(*(str(value) for value in row.values()))
    console.print(table)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    csv_path = args.output_dir / "kag_retrieval.csv"
    with csv_path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    header = list(rows[0])
    lines = [f"# KAG retrieval benchmark\n\nindex `{index_dir}`, KG `{kg_dir}`, {len(questions)} questions; "
             f"`{' '.join(['.venv/bin/python', 'benchmarks/kag_retrieval.py', *sys.argv[1:]])}`\n",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(row[column]) for column in header) + " |" for row in rows]
    csv_path.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    console.print(f"wrote {csv_path} and .md")


if __name__ == "__main__":
    main()
