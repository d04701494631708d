"""experiments/hiprag_mechanism.py without a model: the SFT examples with non-search steps (from MuSiQue train), the
deterministic train / held-out split of the known questions, and the held-out table and paired tests."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pandas as pd
import pytest

from prorag.data import Question
from prorag.judges.detection import StepVerdict, StepVerdicts
from prorag.protocol.hiprag import check_format, parse
from prorag.training.sft import completion_pieces

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "hiprag_mechanism.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hiprag_mechanism", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def musique_train() -> list[Question]:
    with (ROOT / "data" / "01_raw" / "qa" / "musique_train.jsonl").open(encoding="utf-8") as handle:
        return [Question.from_dict(json.loads(line)) for line in handle][:40]


def test_sft_examples_mix_search_and_non_search_steps_from_the_train_split(script, musique_train):
    examples = script.mixed_hop_examples(musique_train, seed=0)
    kinds = [kind for _, _, kind in examples]
    assert 0.3 < kinds.count("non_search") / len(kinds) < 0.7  # both kinds, about half each
    assert all(question.split == "train" for question in musique_train)
    for question, completion, kind in examples:
        assert check_format(completion)[0] == 1
        trajectory = parse(completion)
        assert len(trajectory.steps) == 1 and trajectory.steps[0].conclusion == f"So the answer is {trajectory.answer}."
        assert (kind == "search") == hasattr(trajectory.steps[0], "query")
        trained = "".join(text for text, mine in completion_pieces(completion, "hiprag") if mine)
        assert "Doc 1(Title:" not in trained  # the inserted context is not trained on
        assert question.endswith("?")
    assert examples == script.mixed_hop_examples(musique_train, seed=0)  # deterministic
    assert kinds != [kind for _, _, kind in script.mixed_hop_examples(musique_train, seed=1)]


def _records(count: int) -> list[dict[str, object]]:
    return [{"dataset": "popqa", "id": str(index), "question": f"q{index}", "metadata": {"s_pop": index * 100}}
            for index in range(count)]


def test_the_split_is_deterministic_disjoint_and_independent_of_file_order(script):
    records = _records(30)
    known = [index % 3 != 0 for index in range(30)]  # 20 known
    train, held = script.split_known(records, known, n_train=6, n_eval=10, seed=0)
    assert len(train) == 6 and len(held) == 10
    assert not {r["id"] for r in train} & {r["id"] for r in held}
    assert all(int(r["id"]) % 3 for r in train + held)  # only known questions
    reversed_train, reversed_held = script.split_known(records[::-1], known[::-1], n_train=6, n_eval=10, seed=0)
    assert reversed_train == train and reversed_held == held
    assert script.split_known(records, known, n_train=6, n_eval=10, seed=1)[0] != train
    with pytest.raises(ValueError, match="only 20 questions answered right closed-book"):
        script.split_known(records, known, n_train=19, n_eval=10)
    assert [r["id"] for r in script.popular_questions(records, 2500)] == [str(i) for i in range(25, 30)]


def _rollout(key: str, correct: bool, retrievals: int) -> SimpleNamespace:
    return SimpleNamespace(question_key=key, answer="actor" if correct else "poet", golden_answers=("actor",),
                           format_ok=True, retrieval_count=retrievals)


def _verdicts(index: int, kinds: list[tuple[str, bool | None]]) -> StepVerdicts:
    steps = tuple(StepVerdict(index, position, kind, checked=True, **({"over": flag} if kind == "search" else
                                                                     {"under": flag}))
                  for position, (kind, flag) in enumerate(kinds))
    return StepVerdicts(index, steps)


def test_held_out_rows_summary_and_paired_tests(script):
    searched = [_rollout("a", True, 1), _rollout("b", True, 1), _rollout("c", False, 1)]
    direct = [_rollout("a", True, 0), _rollout("b", True, 1), _rollout("c", False, 0)]
    searched_rows = script.question_rows(searched, [_verdicts(0, [("search", True)]), _verdicts(1, [("search", False)]),
                                                    _verdicts(2, [("search", None)])])
    direct_rows = script.question_rows(direct, [_verdicts(0, [("non_search", False)]),
                                                _verdicts(1, [("search", True)]), _verdicts(2, [("non_search", True)])])
    assert searched_rows["no_search_correct"].tolist() == [0.0, 0.0, 0.0]
    assert direct_rows["no_search_correct"].tolist() == [1.0, 0.0, 0.0]  # c answered without search, but wrongly
    summary = script.summary_row("searched", searched_rows, resamples=200)
    assert summary["osr"] == pytest.approx(0.5)  # the unknown verdict is out of the denominator
    assert math.isnan(summary["usr"]) and summary["cem"] == pytest.approx(2 / 3)
    assert script.summary_row("direct", direct_rows, resamples=200)["usr"] == pytest.approx(0.5)
    tests = script.paired_rows(direct_rows, searched_rows, "direct", "searched", resamples=200).set_index("metric")
    assert tests.loc["no_search_correct", "difference"] == pytest.approx(1 / 3)
    assert tests.loc["retrievals", "difference"] == pytest.approx(-2 / 3)
    assert tests.loc["cem", "difference"] == 0.0
    assert tests.loc["osr_per_question", "n"] == 1  # only b searched under both policies with a known verdict
    assert isinstance(tests, pd.DataFrame)
