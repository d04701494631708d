"""QA records and passages: typed records and JSONL I/O with line-numbered errors."""

from prorag.data.corpus import DuplicatePassageError, deduplicate_passages, load_corpus, read_corpus_files
from prorag.data.jsonl import DataFileError, iter_jsonl, read_jsonl, write_jsonl
from prorag.data.raw_files import RawFiles
from prorag.data.records import (
    Passage,
    Question,
    load_passages,
    load_questions,
    normalize_text,
)
from prorag.data.selection import (
    QuestionSelection,
    pick_questions,
    question_text_key,
    require_train_split,
    select_questions,
    warn_non_train_splits,
)

__all__ = [
    "DataFileError",
    "DuplicatePassageError",
    "Passage",
    "Question",
    "QuestionSelection",
    "RawFiles",
    "deduplicate_passages",
    "iter_jsonl",
    "load_corpus",
    "load_passages",
    "load_questions",
    "normalize_text",
    "pick_questions",
    "question_text_key",
    "read_corpus_files",
    "read_jsonl",
    "require_train_split",
    "select_questions",
    "warn_non_train_splits",
    "write_jsonl",
]
