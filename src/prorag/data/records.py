"""Typed question and passage records of the documented JSONL schema (see data/01_raw/README.md)."""

from __future__ import annotations

import os
import re
import unicodedata
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from prorag.data.jsonl import DataFileError, iter_jsonl


def normalize_text(text: str) -> str:
    """Unicode NFC, no control characters, single spaces: the form every stored string takes."""
    text = unicodedata.normalize("NFC", text)
    text = "".join(" " if unicodedata.category(ch) in ("Cc", "Zl", "Zp") else ch for ch in text)
    return " ".join(text.split())


@dataclass(frozen=True)
class Passage:
    """A retrievable unit of the corpus."""

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """Title and text in the "title\\ntext" layout of FlashRAG / Search-R1 corpora."""
        return f"{self.title}\n{self.text}" if self.title else self.text

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Passage:
        """Validate and normalize one raw record; raises ``ValueError`` naming the bad field."""
        identifier = _required_str(raw, "id")
        text = normalize_text(_required_str(raw, "text"))
        if not text:
            raise ValueError("field 'text' is empty")
        title = raw.get("title", "")
        if not isinstance(title, str):
            raise ValueError(f"field 'title' must be a string, got {type(title).__name__}")
        return cls(id=identifier.strip(), title=normalize_text(title), text=text)


SPLIT_KINDS: Final = {"train": "train", "training": "train", "dev": "dev", "validation": "dev", "val": "dev",
                      "test": "test"}
"""First word of a question's ``split`` → its kind (:attr:`Question.split_kind`)."""


@dataclass(frozen=True)
class Question:
    """A benchmark question with its gold answers and, where the dataset has them, passage ids."""

    id: str
    question: str
    golden_answers: tuple[str, ...]
    dataset: str
    split: str = ""
    context_passage_ids: tuple[str, ...] = ()
    supporting_passage_ids: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    provenance: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    source: str = ""
    """Name of the file the question came from (its stem), e.g. ``musique_train``; set by the loader. Where it is
    not given it is the dataset, so ``source`` always names the group a question is selected and reported by."""

    def __post_init__(self) -> None:
        if not self.source:
            object.__setattr__(self, "source", self.dataset)

    @property
    def split_kind(self) -> str:
        """``train``, ``dev``, ``test`` or ``unknown``, from the free-text ``split`` ("dev (distractor)",
        "test (all 125)", "train"): its first word, with training/validation/val read as train/dev."""
        words = re.findall(r"[a-z]+", self.split.lower())
        return SPLIT_KINDS.get(words[0], "unknown") if words else "unknown"

    @property
    def key(self) -> str:
        """Globally unique key: ids are only unique within a dataset (PopQA's are row numbers)."""
        return f"{self.dataset}/{self.id}"

    def to_dict(self) -> dict[str, Any]:
        record = asdict(self)
        record["golden_answers"] = list(self.golden_answers)
        record["context_passage_ids"] = list(self.context_passage_ids)
        record["supporting_passage_ids"] = list(self.supporting_passage_ids)
        return record

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Question:
        """Validate and normalize one raw record; raises ``ValueError`` naming the bad field."""
        identifier = raw.get("id")
        if isinstance(identifier, int) and not isinstance(identifier, bool):
            identifier = str(identifier)
        if not isinstance(identifier, str) or not identifier.strip():
            raise ValueError("field 'id' must be a non-empty string")
        question = normalize_text(_required_str(raw, "question"))
        if not question:
            raise ValueError("field 'question' is empty")
        answers = raw.get("golden_answers")
        if not isinstance(answers, list) or not all(isinstance(answer, str) for answer in answers):
            raise ValueError("field 'golden_answers' must be a list of strings")
        golden = tuple(dict.fromkeys(a for a in (normalize_text(answer) for answer in answers) if a))
        if not golden:
            raise ValueError("field 'golden_answers' has no non-empty answer")
        dataset = normalize_text(_required_str(raw, "dataset"))
        if not dataset:
            raise ValueError("field 'dataset' is empty")
        return cls(
            id=identifier.strip(),
            question=question,
            golden_answers=golden,
            dataset=dataset,
            split=str(raw.get("split") or ""),
            context_passage_ids=_id_list(raw, "context_passage_ids"),
            supporting_passage_ids=_id_list(raw, "supporting_passage_ids"),
            metadata=_optional_dict(raw, "metadata"),
            provenance=_optional_dict(raw, "provenance"),
            source=str(raw.get("source") or ""),
        )


def load_questions(path: str | os.PathLike[str]) -> list[Question]:
    """Read and validate a question file; the first bad record fails with its file and line."""
    questions: list[Question] = []
    seen: dict[str, int] = {}
    source = Path(path).stem
    for line_number, raw in iter_jsonl(path):
        try:
            question = Question.from_dict({"source": source, **raw})
        except ValueError as error:
            raise DataFileError(path, f"invalid question record: {error}", line_number) from error
        if question.key in seen:
            raise DataFileError(path, f"duplicate question id {question.id!r} of dataset {question.dataset!r} "
                                      f"(first on line {seen[question.key]})", line_number)
        seen[question.key] = line_number
        questions.append(question)
    if not questions:
        raise DataFileError(path, "no question records: the question file is empty")
    return questions


def load_passages(path: str | os.PathLike[str]) -> list[Passage]:
    """Read and validate a corpus file; the first bad record fails with its file and line."""
    passages: list[Passage] = []
    for line_number, raw in iter_jsonl(path):
        try:
            passages.append(Passage.from_dict(raw))
        except ValueError as error:
            raise DataFileError(path, f"invalid passage record: {error}", line_number) from error
    return passages


def _required_str(raw: dict[str, Any], name: str) -> str:
    if name not in raw:
        raise ValueError(f"missing field {name!r}")
    value = raw[name]
    if not isinstance(value, str):
        raise ValueError(f"field {name!r} must be a string, got {type(value).__name__}")
    return value


def _id_list(raw: dict[str, Any], name: str) -> tuple[str, ...]:
    value = raw.get(name)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise ValueError(f"field {name!r} must be a list of non-empty strings")
    return tuple(value)


def _optional_dict(raw: dict[str, Any], name: str) -> dict[str, Any]:
    value = raw.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"field {name!r} must be an object, got {type(value).__name__}")
    return value

