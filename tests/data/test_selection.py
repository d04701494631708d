"""The one question selector: sources, caps, train-split exclusion and train/evaluation disjointness by text."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from prorag.data import Question, QuestionSelection, load_questions, select_questions
from prorag.data.selection import question_parts
from prorag.protocol.hiprag import FEW_SHOT_EXAMPLES

RAW = Path(__file__).resolve().parents[2] / "data" / "01_raw" / "qa"


def _question(key: str, split: str, source: str, text: str | None = None) -> Question:
    return Question(id=key, question=text or f"Question {key}?", golden_answers=("a",), dataset="musique",
                    split=split, source=source)


@pytest.mark.parametrize(("split", "kind"), [("train", "train"), ("dev (distractor)", "dev"),
                                             ("test (all 125)", "test"), ("Validation", "dev"),
                                             ("NQ-open dev (= open-domain 'test')", "unknown"), ("", "unknown")])
def test_split_kind_reads_the_first_word(split, kind):
    assert _question("q", split, "s").split_kind == kind


def test_every_vendored_split_reads_as_intended():
    kinds = {path.stem: {question.split_kind for question in load_questions(path)} for path in RAW.glob("*.jsonl")}
    assert kinds["musique_train"] == {"train"}
    assert kinds["musique"] == {"dev"} and kinds["hotpotqa"] == {"dev"} and kinds["popqa"] == {"test"}
    assert all("train" not in found for stem, found in kinds.items() if stem != "musique_train")


def test_evaluation_leaves_train_splits_out_and_names_a_source_it_empties():
    pool = [_question("t1", "train", "musique_train"), _question("d1", "dev", "musique"),
            _question("d2", "dev", "musique")]
    chosen = select_questions(pool, None, exclude_split_kinds=("train",))
    assert [question.id for question in chosen] == ["d1", "d2"]
    with pytest.raises(ValueError, match=r"rollout.questions.sources names \['musique_train'\].*train"):
        select_questions(pool, ["musique_train"], exclude_split_kinds=("train",), setting="rollout.questions.sources")


def test_training_excludes_evaluated_questions_by_key_and_by_text():
    evaluated = [_question("d1", "dev", "musique", "Who wrote Jaws?")]
    pool = [_question("d1", "dev", "musique", "Who wrote Jaws?"),            # same key
            _question("t9", "train", "musique_train", "who  wrote JAWS?"),   # same text, other file
            _question("t1", "train", "musique_train", "Who directed Jaws?")]
    assert [question.id for question in select_questions(pool, exclude=evaluated)] == ["t1"]


def test_the_hiprag_few_shot_examples_are_no_evaluation_question():
    evaluation_texts = {question.question.casefold() for path in RAW.glob("*.jsonl") if path.stem != "musique_train"
                        for question in load_questions(path)}
    train_texts = {question.question for question in load_questions(RAW / "musique_train.jsonl")}
    assert FEW_SHOT_EXAMPLES[0][0] in train_texts  # the first example is a MuSiQue train question
    assert not any(question.casefold() in evaluation_texts for question, _ in FEW_SHOT_EXAMPLES)
    assert "Slow Down (Lacy J. Dalton Song)" not in FEW_SHOT_EXAMPLES[0][0]  # the 2Wiki test question is gone


def test_each_source_splits_into_a_tuning_first_half_and_a_reporting_second_half():
    pool = [_question(f"a{i}", "dev", "a") for i in range(5)] + [_question(f"b{i}", "dev", "b") for i in range(2)]
    assert question_parts(pool) == {**{f"musique/a{i}": "tuning" for i in range(3)},
                                    "musique/a3": "reporting", "musique/a4": "reporting",
                                    "musique/b0": "tuning", "musique/b1": "reporting"}
    reporting = select_questions(pool, max_per_source=1, part="reporting")
    assert [question.id for question in reporting] == ["a3", "b1"]
    assert [question.id for question in select_questions(pool, ["a"], part="tuning")] == ["a0", "a1", "a2"]
    with pytest.raises(ValueError, match="tuning_fraction"):
        question_parts(pool, 1.0)


def test_the_shipped_evaluation_questions_are_none_a_recipe_was_tuned_on():
    """The embedded default's recipes were chosen watching the first 10 (rollout) and first 5 (compare) questions
    of each file; the reported ones come from each file's second half."""
    questions = [question for path in sorted(RAW.glob("*.jsonl")) for question in load_questions(path)]
    settings = yaml.safe_load((RAW.parents[2] / "conf" / "base" / "parameters_rollout.yml").read_text())["rollout"]
    selection = QuestionSelection(**settings["questions"])
    reported = select_questions(questions, selection.sources, max_per_source=selection.max_per_source,
                                exclude_split_kinds=("train",), part=selection.part)
    watched = {question.key for question in select_questions(questions, max_per_source=50)}
    assert len(reported) == 30 and not watched & {question.key for question in reported}
