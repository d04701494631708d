"""No prompt, few-shot example or SFT example holds a question of a dev or test split (issue 31, item 2).

The question files are every ``*.jsonl`` under ``data/01_raw/qa`` (and, where this checkout has it, the shared
``../shared/data/qa``). A question is *evaluation material* when its ``split`` is not a train split
(:attr:`prorag.data.records.Question.split_kind`). Three places are checked:

* every prompt text the project sends: each registered protocol's messages (with and without its few-shot
  examples), the judges' prompts, the knowledge-graph extraction prompt, ReasonRAG's process-evaluation prompt,
  and the conf files;
* the same texts against the papers' own case-study questions, which are dev/test questions of datasets the
  project does not ship (HiPRAG, ReasonRAG and TeaRAG print them);
* the SFT data: the question files ``sft_synthesis.sources`` and ``tearag.sft_data.sources`` name in conf/base
  and conf/gpu hold train-split questions only (the synthesis nodes refuse any other, see
  ``tests/pipelines/sft``).
"""

from __future__ import annotations

import inspect
import re
from functools import cache
from pathlib import Path

import pytest
import yaml

from prorag.data.records import Question, load_questions
from prorag.judges import prompts as judge_prompts
from prorag.kg import prompt as kg_prompt
from prorag.protocol import reasonrag
from prorag.protocol.registry import get_protocol, protocol_names

ROOT = Path(__file__).resolve().parents[1]
QUESTION_DIRS = [ROOT / "data" / "01_raw" / "qa", ROOT.parent / "shared" / "data" / "qa"]
PLACEHOLDER = "PLACEHOLDER-QUESTION-7f3a"
PAPER_CASE_STUDIES = (
    "When did the director of Il Coraggio die?",  # ReasonRAG Appendix B (2WikiMultihopQA dev)
    "Who died later, the director of Il Coraggio or the director of Shark Monroe?",
    "Where was the place of death of Alexander Carl Otto Westphal's father?",  # TeaRAG Table 11 (2Wiki dev)
    "What is the place of birth of the performer of song Slow Down (Lacy J. Dalton Song)?",  # HiPRAG case study
)

PAPER_CASE_STUDY_NAMES = ("Alexander Carl Otto Westphal", "Kreuzlingen", "Il Coraggio", "Shark Monroe",
                          "Lacy J. Dalton")
"""Entities and answers of those case studies: no source or conf file prints them (a docstring neither)."""


def _normalize(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text.lower()).split())


@cache
def evaluation_questions() -> dict[str, str]:
    """Normalized dev/test question text → ``file: question`` for every shipped question file."""
    found: dict[str, str] = {}
    for directory in QUESTION_DIRS:
        for path in sorted(directory.glob("*.jsonl")) if directory.is_dir() else []:
            for question in load_questions(path):
                text = _normalize(question.question)
                if question.split_kind != "train" and len(text) >= 12:
                    found.setdefault(text, f"{path.name}: {question.question}")
    return found


def _protocol_prompts() -> dict[str, str]:
    texts = {}
    for name in protocol_names():
        for few_shot in (True, False):
            try:
                adapter = get_protocol(name, few_shot=few_shot)
            except (TypeError, ValueError):  # a protocol without few-shot examples
                adapter = get_protocol(name)
            messages = adapter.messages(PLACEHOLDER)
            texts[f"protocol {name} few_shot={few_shot}"] = "\n".join(
                str(message["content"]).replace(PLACEHOLDER, " ") for message in messages)
    return texts


def prompt_texts() -> dict[str, str]:
    texts = _protocol_prompts()
    texts["judges.prompts"] = inspect.getsource(judge_prompts)
    texts["kg.prompt"] = "\n".join(f"{passage}\n{triplets}" for passage, triplets in kg_prompt.FEW_SHOT) + \
        kg_prompt.INSTRUCTION
    texts["reasonrag process evaluation"] = reasonrag.PROCESS_EVALUATION_PROMPT
    for path in sorted((ROOT / "conf").rglob("*.yml")):
        texts[str(path.relative_to(ROOT))] = path.read_text(encoding="utf-8")
    return texts


def _leaks(text: str, questions: dict[str, str]) -> list[str]:
    body = f" {_normalize(text)} "
    return [origin for question, origin in questions.items() if f" {question} " in body]


def test_the_shipped_files_have_evaluation_questions() -> None:
    assert len(evaluation_questions()) > 1000  # the check below is not vacuous


@pytest.mark.parametrize("name", sorted(prompt_texts()))
def test_no_prompt_holds_a_dev_or_test_question(name: str) -> None:
    text = prompt_texts()[name]
    assert not _leaks(text, evaluation_questions()), f"{name} holds evaluation questions"
    cases = {_normalize(case): f"paper case study: {case}" for case in PAPER_CASE_STUDIES}
    assert not _leaks(text, cases), f"{name} holds a paper's case-study (dev/test) question"


def test_no_source_or_conf_file_prints_a_papers_case_study() -> None:
    files = [path for folder in ("src", "conf") for path in (ROOT / folder).rglob("*")
             if path.suffix in {".py", ".yml"}]
    assert len(files) > 100
    found = {str(path.relative_to(ROOT)): names for path in files
             if (names := [name for name in PAPER_CASE_STUDY_NAMES if name in path.read_text(encoding="utf-8")])}
    assert not found, f"these files print a paper's case study: {found}"


def _conf_sources(env: str, *keys: str) -> list[str] | None:
    for path in sorted((ROOT / "conf" / env).glob("parameters*.yml")):
        node = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            return list(node)
    return None


@pytest.mark.parametrize("env", sorted(path.name for path in (ROOT / "conf").iterdir()
                                       if path.is_dir() and path.name != "local"))
@pytest.mark.parametrize("keys", [("sft_synthesis", "sources"), ("tearag", "sft_data", "sources")])
def test_sft_data_come_from_train_splits_only(env: str, keys: tuple[str, ...]) -> None:
    sources = _conf_sources(env, *keys) or _conf_sources("base", *keys)
    assert sources, f"conf/{env} names no {'.'.join(keys)}"
    for source in sources:
        path = ROOT / "data" / "01_raw" / "qa" / f"{source}.jsonl"
        questions: list[Question] = load_questions(path)
        kinds = {question.split_kind for question in questions}
        assert kinds == {"train"}, f"conf/{env} {'.'.join(keys)} names {source} ({sorted(kinds)} questions)"

