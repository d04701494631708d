"""Training-pipeline fixtures: real MuSiQue-train and HotpotQA questions and a small index of their passages."""

from pathlib import Path

import pytest

from prorag.data import load_corpus, load_questions
from prorag.retrieval import build_retrieval_index

RAW = Path(__file__).resolve().parents[2] / "data" / "01_raw"


@pytest.fixture(scope="module")
def questions() -> list[dict]:
    """The first 4 questions of musique_train and of hotpotqa, as records."""
    return [q.to_dict() for name in ("musique_train", "hotpotqa")
            for q in load_questions(RAW / "qa" / f"{name}.jsonl")[:4]]


@pytest.fixture(scope="module")
def index(questions):
    """A hashing-embedder index (plus BM25) over those questions' passages."""
    wanted = {pid for q in questions for pid in q.get("supporting_passage_ids", []) + q.get("context_passage_ids", [])}
    corpus = [p for p in load_corpus([RAW / "corpus" / "musique_train.jsonl", RAW / "corpus" / "hotpotqa.jsonl"])
              if p.id in wanted]
    return build_retrieval_index(corpus, "hashing:64", show_progress=False)
