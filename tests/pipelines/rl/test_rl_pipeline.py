"""The RL nodes with the tiny random policy: question selection, GRPO from an adapter, resumable run folders,
and the train / train_rl pipelines wiring base, SFT and RL policies into one evaluation."""

from __future__ import annotations

from pathlib import Path

import pytest
from peft import LoraConfig, get_peft_model

from prorag.data import Question
from prorag.llm import BUNDLED_TINY_LLAMA, load_causal_lm
from prorag.pipeline_registry import register_pipelines
from prorag.pipelines.rl.nodes import run_fingerprint, select_rl_questions, train_rl
from prorag.pipelines.rl.params import RLParams
from prorag.rewards.hiprag import HiPRAGSettings
from prorag.rewards.multistage import MultistageSettings
from prorag.rewards.registry import check_reward_protocol
from prorag.specs import PolicySpec, TrainedAgentSpec
from prorag.training.config import TrainerBackendSettings
from prorag.training.grpo import COMPLETED_MARKER

POLICY = PolicySpec(model=BUNDLED_TINY_LLAMA)
AGENT = TrainedAgentSpec(step_budget=1, max_new_tokens_per_turn=8, max_total_new_tokens=16)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def start_adapter(tmp_path_factory) -> str:
    """A LoRA adapter to continue (the SFT adapter's role)."""
    model, _ = load_causal_lm(BUNDLED_TINY_LLAMA)
    peft = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    folder = tmp_path_factory.mktemp("sft") / "adapter"
    peft.save_pretrained(str(folder))
    return str(folder)


def _params(tmp_path) -> RLParams:
    return RLParams(retriever={"kind": "bm25"}, run_root=str(tmp_path / "runs"),
                    trainer={"max_steps": 1, "per_device_train_batch_size": 4, "num_generations": 2,
                             "save_steps": 1})


def test_rl_questions_never_include_evaluated_ones(questions):
    evaluated = [q for q in questions if q["source"] == "hotpotqa"][:2]
    selected = select_rl_questions(questions, evaluated, RLParams())
    keys = {f"{q['dataset']}/{q['id']}" for q in selected}
    assert len(selected) == len(questions) - 2
    assert not keys & {f"{q['dataset']}/{q['id']}" for q in evaluated}
    with pytest.raises(ValueError, match=r"rl.questions.sources names \['bamboogle'\]"):
        select_rl_questions(questions, [], RLParams(questions={"sources": ["bamboogle"]}))


def test_rl_params_are_checked():
    with pytest.raises(ValueError, match="multistage"):
        check_reward_protocol(MultistageSettings(), TrainedAgentSpec().protocol)
    with pytest.raises(ValueError, match="multistage"):
        check_reward_protocol(HiPRAGSettings(), "multistage")
    check_reward_protocol(MultistageSettings(), "multistage")
    with pytest.raises(ValueError, match="loss_type"):
        RLParams(trainer={"loss_type": "ppo"})
    with pytest.raises(ValueError, match="extra"):
        RLParams(trainer={"learning_rat": 1e-5})


@pytest.mark.integration
def test_train_rl_continues_the_adapter_and_logs_each_step(questions, index, start_adapter, tmp_path):
    params = _params(tmp_path)
    adapter, log = train_rl(questions[:4], index, start_adapter, params, POLICY, AGENT, HiPRAGSettings())
    assert [entry["step"] for entry in log if "loss" in entry] == [1]
    assert {"reward", "rewards/process/mean", "agent/format_rate", "agent/cem"} <= set(log[0])
    run_dir = tmp_path / "runs" / run_fingerprint(params, start_adapter,
                                                  [Question.from_dict(q) for q in questions[:4]],
                                                  POLICY, AGENT, HiPRAGSettings(), index=index.fingerprint())
    assert adapter == str(run_dir / "adapter") and (run_dir / COMPLETED_MARKER).is_file()


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["trl", "torch"])
def test_each_trainer_backend_trains_through_the_rl_node(backend, questions, index, start_adapter, tmp_path):
    """The same rl node, rollouts and scorer under either trainer backend (``rl.backend.name``): each step logged
    with the same reward and agent metrics, a finished run folder of its own, the adapter saved."""
    params = _params(tmp_path).model_copy(update={"backend": TrainerBackendSettings(name=backend)})
    params = params.model_copy(update={"trainer": params.trainer.model_copy(update={"max_steps": 2})})
    adapter, log = train_rl(questions[:4], index, start_adapter, params, POLICY, AGENT, HiPRAGSettings())
    assert [entry["step"] for entry in log if "loss" in entry] == [1, 2]
    assert {"loss", "reward", "rewards/process/mean", "agent/format_rate", "agent/cem", "learning_rate"} <= set(log[0])
    run_dir = Path(adapter).parent
    assert (run_dir / COMPLETED_MARKER).is_file() and (Path(adapter) / "adapter_model.safetensors").is_file()
    default = _params(tmp_path).model_copy(update={"trainer": params.trainer})
    assert (run_dir.name == run_fingerprint(default, start_adapter, [Question.from_dict(q) for q in questions[:4]],
                                            POLICY, AGENT, HiPRAGSettings(), index=index.fingerprint())) \
        == (backend == "trl")  # the backend is part of the run's identity (TRL's, the default, adds nothing)


def test_the_run_folder_depends_on_the_settings(questions, start_adapter, tmp_path):
    chosen = [Question.from_dict(q) for q in questions[:2]]
    shared = (POLICY, AGENT, HiPRAGSettings())
    base = run_fingerprint(_params(tmp_path), start_adapter, chosen, *shared)
    assert base == run_fingerprint(_params(tmp_path), start_adapter, chosen, *shared)
    assert base != run_fingerprint(_params(tmp_path), start_adapter, chosen, POLICY, AGENT,
                                   HiPRAGSettings(lambda_p=0.0))
    assert base != run_fingerprint(_params(tmp_path), start_adapter, chosen, POLICY,
                                   AGENT.model_copy(update={"step_budget": 2}), HiPRAGSettings())
    assert base != run_fingerprint(_params(tmp_path), start_adapter + "-other", chosen, *shared)
    reindexed = run_fingerprint(_params(tmp_path), start_adapter, chosen, *shared, index="0123456789abcdef")
    assert reindexed != base != run_fingerprint(_params(tmp_path), start_adapter, chosen, *shared,
                                                index="fedcba9876543210") != reindexed
    resumable = _params(tmp_path).model_copy(update={"trainer": _params(tmp_path).trainer.model_copy(
        update={"resume": False})})
    assert base == run_fingerprint(resumable, start_adapter, chosen, *shared)


def test_train_evaluates_base_sft_and_rl_policies_together():
    pipelines = register_pipelines()
    train = pipelines["train"]
    names = {node.name for node in train.nodes}
    assert {"corpus_indexing.build_index", "sft_synthesis.synthesize_sft_data", "sft.train_sft", "rl.train_rl",
            "sft.run_policy_rollouts", "rl.run_policy_rollouts", "evaluation.concat_trajectories",
            "evaluation.evaluate_trajectories", "reward_judging.judge_trajectories"} <= names
    concat = next(node for node in train.nodes if node.name == "evaluation.concat_trajectories")
    assert concat.inputs == ["trajectories", "sft_policy_trajectories", "rl_policy_trajectories"]
    assert pipelines["__default__"] is train
    train_rl_pipeline = pipelines["train_rl"]
    evaluate = next(node for node in train_rl_pipeline.nodes if node.name == "evaluation.evaluate_trajectories")
    assert evaluate.inputs == ["all_trajectories"]  # the new RL arm beside the latest saved base, SFT and DPO arms
    concat = next(node for node in train_rl_pipeline.nodes if node.name == "evaluation.concat_trajectories")
    assert concat.inputs[0] == "rl_policy_trajectories"
    assert "rollout.run_rollouts" not in {node.name for node in train_rl_pipeline.nodes}

