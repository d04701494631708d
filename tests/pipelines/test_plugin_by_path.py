"""A reward and a protocol of the user's own, named by dotted path in conf (``my_package.rewards:MyReward``), load
through the real registries — and under ``kedro run`` — from a package outside ``src/`` with no registration call
and no edit under ``src/`` (issue 45, item 5)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from kedro.io import Version

from prorag.agent.trajectory import Rollout
from prorag.data import Question
from prorag.datasets import JSONLinesDataset, RetrievalIndexDataset
from prorag.pipelines.reward_judging.nodes import judge_trajectories
from prorag.pipelines.reward_judging.params import RewardJudgingParams
from prorag.plugins import PluginError
from prorag.protocol.registry import get_protocol, is_protocol
from prorag.rewards.base import RewardSettings
from prorag.rewards.registry import build_reward, check_reward_protocol
from prorag.specs import MethodSpec, PolicySpec

SRC = Path(__file__).resolve().parents[2] / "src"
REWARD = "my_package.rewards:AnswerBonusReward"
PROTOCOL = "my_package.protocols:plain_hiprag"
PACKAGE = {
    "__init__.py": "",
    "rewards.py": '''
        from typing import ClassVar, Literal
        from pydantic import Field
        from prorag.metrics.qa import cover_exact_match
        from prorag.rewards.base import Reward, RewardScores, RewardSettings


        class AnswerBonusSettings(RewardSettings):
            kind: Literal["answer_bonus"] = "answer_bonus"
            bonus: float = Field(default=0.5, ge=0)


        class AnswerBonusReward(Reward):
            """Cover exact match, plus ``bonus`` for a well-formed trajectory."""

            kind: ClassVar[str] = "answer_bonus"
            Settings: ClassVar[type[RewardSettings]] = AnswerBonusSettings
            components: ClassVar[tuple[str, ...]] = ("outcome", "bonus")

            def score(self, rollouts, context):
                outcome = [float(cover_exact_match(r.answer or "", r.golden_answers)) for r in rollouts]
                bonus = [self.settings.bonus if r.format_ok else 0.0 for r in rollouts]
                return RewardScores({"outcome": outcome, "bonus": bonus},
                                    [a + b for a, b in zip(outcome, bonus)], [None] * len(rollouts))
    ''',
    "protocols.py": '''
        from prorag.protocol.hiprag import HiPRAGAdapter


        def plain_hiprag(few_shot: bool = False, open_next_step: bool = False) -> HiPRAGAdapter:
            """HiPRAG's protocol without the worked examples, whatever the agent asks."""
            return HiPRAGAdapter(few_shot=False, open_next_step=open_next_step)
    ''',
}


@pytest.fixture
def my_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``my_package`` written to a folder outside ``src/`` and put on ``sys.path`` (as ``PYTHONPATH`` would)."""
    root = tmp_path / "user_code"
    (root / "my_package").mkdir(parents=True)
    for name, text in PACKAGE.items():
        (root / "my_package" / name).write_text(textwrap.dedent(text), encoding="utf-8")
    monkeypatch.syspath_prepend(str(root))
    yield root
    for name in [name for name in sys.modules if name == "my_package" or name.startswith("my_package.")]:
        del sys.modules[name]


def _rollout(question: dict[str, Any], *, answer: str, format_ok: bool) -> dict[str, Any]:
    item = Question.from_dict(question)
    return Rollout(question_key=item.key, question_id=item.id, dataset=item.dataset, question=item.question,
                   golden_answers=item.golden_answers, method="my_agent", protocol=PROTOCOL, prompt="",
                   prompt_token_ids=[], completion=f"<answer>{answer}</answer>", segments=[], steps=[],
                   format_ok=format_ok, n_steps=0, answer=answer, stop_reason="answer", retrieval_count=0,
                   queries=[], retrieved_ids=[], generated_tokens=1, context_tokens=0, tag_tokens=1,
                   turns=1).to_dict()


def test_nothing_under_src_names_the_plug_in():
    assert not [path for path in SRC.rglob("*.py")
                if "AnswerBonus" in (text := path.read_text(encoding="utf-8")) or "plain_hiprag" in text]


def test_a_dotted_reward_kind_is_validated_by_its_own_settings_and_builds_its_class(my_package):
    settings = RewardSettings.model_validate({"kind": REWARD, "bonus": 0.25})
    assert type(settings).__name__ == "AnswerBonusSettings" and settings.kind == REWARD and settings.bonus == 0.25
    assert type(build_reward(settings)).__name__ == "AnswerBonusReward"
    assert RewardSettings.model_validate(settings.model_dump()) == settings  # a launched rank re-reads the dump
    check_reward_protocol(settings, PROTOCOL)
    with pytest.raises(ValueError, match=r"bonuss"):
        RewardSettings.model_validate({"kind": REWARD, "bonuss": 0.25})


def test_a_dotted_protocol_builds_its_adapter(my_package):
    method = MethodSpec(name="my_agent", kind="agent", protocol=PROTOCOL, few_shot=True)
    adapter = get_protocol(method.protocol, few_shot=True)
    assert adapter.name == "hiprag" and adapter.few_shot is False and is_protocol(PROTOCOL)


def test_a_dotted_path_that_does_not_load_names_what_is_missing(my_package):
    with pytest.raises(PluginError, match=r"reward kind 'my_package\.rewards:Nope': my_package\.rewards has no "
                                          r"attribute 'Nope'"):
        RewardSettings.model_validate({"kind": "my_package.rewards:Nope"})
    with pytest.raises(PluginError, match=r"cannot import 'not_installed\.rewards'.*PYTHONPATH"):
        build_reward({"kind": "not_installed.rewards:MyReward"})
    with pytest.raises(PluginError, match=r"names <function plain_hiprag.*not a prorag\.rewards\.base\.Reward"):
        build_reward({"kind": PROTOCOL})
    with pytest.raises(ValueError, match=r"unknown protocol 'my_package\.protocols:nope'|has no attribute 'nope'"):
        MethodSpec(name="x", kind="agent", protocol="my_package.protocols:nope")
    assert not is_protocol("my_package.protocols:nope")


def test_reward_judging_scores_the_plug_in_s_trajectories(my_package, questions, index):
    records = [_rollout(questions[0], answer=Question.from_dict(questions[0]).golden_answers[0], format_ok=True),
               _rollout(questions[1], answer="nothing", format_ok=False)]
    settings = RewardSettings.model_validate({"kind": REWARD, "bonus": 0.25})
    _, table, metrics = judge_trajectories(records, index, RewardJudgingParams(), settings,
                                           PolicySpec(model="bundled:tiny-random-llama", batch_size=2), questions)
    assert list(table["bonus"]) == [0.25, 0.0] and list(table["reward"]) == [1.25, 0.0]
    assert metrics["skipped_trajectories"] == 0


@pytest.mark.integration
def test_kedro_run_loads_a_reward_and_a_protocol_named_in_conf(my_package, project_copy, questions, index):
    """A real ``kedro run --pipelines=reward_judging`` whose conf names both by path: before, every command failed
    with ``unknown reward kind`` (only a registration in code could add one)."""
    VERSION = "2026-01-01T00.00.00.000Z"
    records = [_rollout(questions[0], answer=Question.from_dict(questions[0]).golden_answers[0], format_ok=True),
               _rollout(questions[1], answer="nothing", format_ok=False)]
    data = project_copy / "data"
    JSONLinesDataset(filepath=str(data / "07_model_output" / "trajectories.jsonl"),
                     version=Version(None, VERSION)).save(records)
    JSONLinesDataset(filepath=str(data / "04_feature" / "index_questions.jsonl"),
                     version=Version(None, VERSION)).save(questions)
    RetrievalIndexDataset(filepath=str(data / "06_models" / "retrieval_index"), version=Version(None, VERSION)).save(
        index)
    (project_copy / "conf" / "local" / "parameters_my_package.yml").write_text(textwrap.dedent(f"""
        reward:
          kind: {REWARD}
          bonus: 0.25
        agent:
          protocol: {PROTOCOL}
    """), encoding="utf-8")
    completed = subprocess.run(
        [sys.executable, "-m", "kedro", "run", "--pipelines=reward_judging"], cwd=project_copy, capture_output=True,
        text=True, timeout=300,
        env={**os.environ, "KEDRO_DISABLE_TELEMETRY": "1", "COLUMNS": "200",
             "PYTHONPATH": os.pathsep.join([str(my_package), str(SRC), os.environ.get("PYTHONPATH", "")]),
             "MLFLOW_TRACKING_URI": f"sqlite:///{project_copy / 'mlflow.db'}"})
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-3000:]
    (saved,) = (data / "08_reporting" / "trajectory_rewards.csv").glob("*/trajectory_rewards.csv")
    with saved.open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [float(row["bonus"]) for row in rows] == [0.25, 0.0]
