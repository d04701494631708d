"""One rule for evaluated questions: ``evaluated_questions`` (the rollout questions ∪ the compare questions) is made by
one node, and every trainer's question selection (RL, SFT synthesis, ReasonRAG, TeaRAG's SFT data and IP-DPO mix)
leaves it out, by key and by question text.

The ``questions`` and ``index`` fixtures are in tests/pipelines/conftest.py (musique_train and HotpotQA)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from prorag.config_loader import CONFIG_LOADER_ARGS
from prorag.config_loader import ProjectConfigLoader as OmegaConfigLoader
from prorag.data import Question, load_questions, question_text_key
from prorag.pipeline_registry import configured_methods, register_pipelines
from prorag.pipelines.compare.nodes import select_compare_questions
from prorag.pipelines.compare.params import CompareParams
from prorag.pipelines.parameter_schemas import all_parameter_schemas
from prorag.pipelines.reasonrag_data.nodes import select_reasonrag_questions
from prorag.pipelines.reasonrag_data.params import ReasonRAGDataParams
from prorag.pipelines.rl.nodes import select_rl_questions
from prorag.pipelines.rl.params import RLParams
from prorag.pipelines.rollout.nodes import select_evaluated_questions, select_rollout_questions
from prorag.pipelines.rollout.params import RolloutParams
from prorag.pipelines.sft_synthesis.nodes import synthesize_sft_data
from prorag.pipelines.sft_synthesis.params import SftSynthesisParams
from prorag.pipelines.tearag.nodes import select_ip_dpo_questions, select_sft_data_questions
from prorag.pipelines.tearag.params import TeaRAGParams
from prorag.specs import TrainedAgentSpec

ROOT = Path(__file__).resolve().parents[2]
TRAIN_PIPELINES = ("train", "train_sft", "train_rl", "train_rl_instruct",
                   *(f"train_{name}" for name in configured_methods()))
"""Every pipeline that trains: the fixed ones and one per ``methods`` entry (a new entry is covered as it comes)."""
TRAINER_SELECTIONS = {"sft_synthesis.synthesize_sft_data", "rl.select_rl_questions", "search_r1.rl.select_rl_questions",
                      "reasonrag_data.select_reasonrag_questions", "tearag.build_tearag_sft_data",
                      "tearag.run_ip_dpo_rounds"}
"""The nodes that choose a trainer's questions (``search_r1``: the rl pipeline in train_search_r1)."""


def _key(record: dict[str, Any]) -> str:
    return Question.from_dict(record).key


def _as_train(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records relabelled as a train split: SFT synthesis refuses dev/test questions, and this test is about
    the exclusion of evaluated questions, which the split does not change."""
    return [{**record, "split": "train (relabelled for this test)"} for record in records]


def _copy(record: dict[str, Any]) -> dict[str, Any]:
    """The same question under another key (a question that two files share, say)."""
    return {**record, "id": f"{record['id']}-copy"}


@pytest.fixture(scope="module")
def evaluation(questions) -> dict[str, Any]:
    """Indexed questions with two HotpotQA questions evaluated (one rolled out and compared, one only compared) and
    a copy of each under another key, appended after the originals; the evaluated set as the node makes it."""
    hotpotqa = [record for record in questions if record["source"] == "hotpotqa"]
    rolled_out, compared_only = hotpotqa[0], hotpotqa[1]
    pool = [*questions, _copy(rolled_out), _copy(compared_only)]
    rollout = select_rollout_questions(pool, RolloutParams(questions={"sources": ["hotpotqa"], "max_per_source": 1},
                                                           methods=[{"name": "direct", "kind": "direct"}]))
    compare = select_compare_questions(pool, CompareParams(
        questions={"sources": ["hotpotqa"], "max_per_source": 2},
        arms=[{"name": "direct", "method": {"kind": "direct"}},
              {"name": "standard_rag", "method": {"kind": "standard_rag"}}]))
    assert [_key(r) for r in rollout] == [_key(rolled_out)]
    assert [_key(r) for r in compare] == [_key(rolled_out), _key(compared_only)]
    evaluated = select_evaluated_questions(rollout, compare)
    forbidden = {_key(record) for record in (rolled_out, compared_only, _copy(rolled_out), _copy(compared_only))}
    allowed = {_key(record) for record in hotpotqa[2:]}
    return {"pool": pool, "evaluated": evaluated, "forbidden": forbidden, "allowed": allowed}


def test_evaluated_questions_are_the_rollout_and_compare_questions_once_each(evaluation):
    assert [_key(record) for record in evaluation["evaluated"]] == sorted(
        evaluation["forbidden"] - {key for key in evaluation["forbidden"] if key.endswith("-copy")},
        key=[_key(r) for r in evaluation["pool"]].index)
    assert select_evaluated_questions([], []) == []


def test_rl_never_trains_on_a_rollout_or_compare_question(evaluation):
    keys = {_key(r) for r in select_rl_questions(evaluation["pool"], evaluation["evaluated"], RLParams())}
    assert not keys & evaluation["forbidden"]
    assert evaluation["allowed"] <= keys


def test_sft_synthesis_never_trains_on_a_rollout_or_compare_question(evaluation, index, one_torch_thread):
    records, _ = synthesize_sft_data(_as_train(evaluation["pool"]), evaluation["evaluated"], index,
                                     SftSynthesisParams(sources=["hotpotqa"]), TrainedAgentSpec())
    keys = {record["question_key"] for record in records}
    assert not keys & evaluation["forbidden"]
    assert keys == evaluation["allowed"]


def test_reasonrag_never_trains_on_a_rollout_or_compare_question(evaluation):
    params = ReasonRAGDataParams(questions={"sources": ["hotpotqa"]}, retriever={"kind": "bm25"})
    keys = {_key(r) for r in select_reasonrag_questions(evaluation["pool"], evaluation["evaluated"], params)}
    assert not keys & evaluation["forbidden"]
    assert keys == evaluation["allowed"]


def test_tearag_never_trains_on_a_rollout_or_compare_question(evaluation):
    params = TeaRAGParams.model_validate({
        "sft_data": {"sources": ["hotpotqa", "musique_train"]},
        "questions": {"nq": 0, "hotpotqa_bridge": 10, "hotpotqa_comparison": 10, "musique": 0}})
    mix = {question.key for question in select_ip_dpo_questions(evaluation["pool"], evaluation["evaluated"], params)}
    assert not mix & evaluation["forbidden"]
    assert mix == evaluation["allowed"]  # the two evaluated (comparison) questions and their copies left out
    sft = {question.key
           for question in select_sft_data_questions(_as_train(evaluation["pool"]), evaluation["evaluated"], params)}
    assert not sft & evaluation["forbidden"]
    assert evaluation["allowed"] <= sft


@pytest.mark.parametrize("name", TRAIN_PIPELINES)
def test_every_trainer_excludes_the_one_evaluated_set(name):
    """Each training pipeline makes ``evaluated_questions`` from both selections, and every trainer's question
    selection reads it (none reads ``rollout_questions`` or the compare parameters instead)."""
    pipeline = register_pipelines()[name]
    nodes = {node.name: node for node in pipeline.nodes}
    made = nodes["rollout.select_evaluated_questions"]
    assert made.inputs == ["rollout_questions", "compare_questions"] and made.outputs == ["evaluated_questions"]
    assert {"rollout.select_rollout_questions", "compare.select_compare_questions"} <= set(nodes)
    trainers = TRAINER_SELECTIONS & set(nodes)
    assert trainers
    for trainer in trainers:
        assert "evaluated_questions" in nodes[trainer].inputs, trainer
        assert not {"rollout_questions", "compare_questions", "params:compare"} & set(nodes[trainer].inputs), trainer


def test_conf_base_tearag_ip_dpo_does_not_train_on_nq_open_dev_1(monkeypatch):
    """The leak of the 2026 architecture review (§3 "A copy that already leaks"): with conf/base, ``compare``
    evaluates ``nq/nq_open_dev_1`` and TeaRAG's IP-DPO mix took it as a training question. Runs the registered
    ``train_tearag`` wiring (its question nodes, then ``tearag.run_ip_dpo_rounds`` with the training stubbed out)
    on the conf/base questions and parameters."""
    import prorag.pipelines.tearag.nodes as tearag_nodes

    conf = OmegaConfigLoader(str(ROOT / "conf"), **CONFIG_LOADER_ARGS)["parameters"]
    schemas = all_parameter_schemas()
    monkeypatch.chdir(ROOT)
    questions = [q.to_dict() for path in conf["data_preparation"]["question_files"] for q in load_questions(path)]
    values: dict[str, Any] = {"questions": questions, "passages": [], "retrieval_index": None,
                              "knowledge_graph": None, "tearag_sft_adapter": "sft-adapter"}

    def run(node) -> None:
        for name in node.inputs:
            if name.startswith("params:") and name not in values:  # e.g. params:methods.tearag.stages.tearag
                path = name.removeprefix("params:").split(".")
                value = conf
                for key in path:
                    value = value[key]
                values[name] = schemas[path[-1]].model_validate(value)  # the block's schema: its last key's
        values.update(node.run({name: values[name] for name in node.inputs}))

    pipeline = register_pipelines()["train_tearag"]
    ip_dpo = next(node for node in pipeline.nodes if node.name == "tearag.run_ip_dpo_rounds")
    needed = [name for name in ip_dpo.inputs if name not in values and not name.startswith("params:")]
    for node in pipeline.to_outputs(*needed).from_inputs("questions").nodes:  # index, rollout (and compare) picks
        run(node)
    trained: list[Question] = []
    monkeypatch.setattr(tearag_nodes, "run_ip_dpo", lambda model, adapter, chosen, *args, **kwargs:
                        trained.extend(chosen) or [])
    monkeypatch.setattr(tearag_nodes, "_kag_retriever", lambda *args: None)
    run(ip_dpo)

    compare = register_pipelines()["compare"]
    run(next(node for node in compare.nodes if node.name == "compare.select_compare_questions"))
    compared = [Question.from_dict(record) for record in values["compare_questions"]]
    # the review's premise was compare evaluating nq_open_dev_1; it now evaluates NQ's reporting part
    assert "nq" in {question.source for question in compared}
    assert trained and "nq" in {question.source for question in trained}
    assert not {question.key for question in trained} & {question.key for question in compared}
    assert not {question_text_key(q) for q in trained} & {question_text_key(q) for q in compared}
