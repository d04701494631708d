"""Nodes of the RL pipeline."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from prorag.config import StrictModel, register_parameters
from prorag.data import Question, select_training_questions
from prorag.judges.factory import build_judge
from prorag.llm.registry import BUNDLED_SMOLLM2
from prorag.pipelines.reward_judging.nodes import RewardJudgingParams
from prorag.retrieval import RetrievalIndex
from prorag.tracking.callbacks import MlflowStepMetrics
from prorag.training.process_rewards import RewardSettings, RolloutScorer


class RLQuestions(StrictModel):
    """Training questions: by source file stem, first N of each; evaluated questions are always excluded."""

    sources: list[str] = Field(default=["musique_train", "hotpotqa"], min_length=1)
    max_per_source: int | None = Field(default=None, ge=1)


class RLReward(StrictModel):
    """The reward method and its coefficients (see prorag.training.process_rewards)."""

    method: Literal["hiprag", "search_r1", "over_only", "under_only", "multistage"] = "hiprag"
    lambda_f: float = Field(default=0.2, ge=0, le=1)
    lambda_p: float = Field(default=0.4, ge=0)
    beta: float = Field(default=0.3, ge=0)
    stage_switch_step: int = Field(default=0, ge=0)
    judge_for_metrics: bool = False
    reask_max_new_tokens: int = Field(default=32, ge=1)


class RLAgent(StrictModel):
    """The rollout protocol and budgets used while training."""

    protocol: Literal["hiprag", "search_r1", "multistage"] = "hiprag"
    few_shot: bool = False
    step_budget: int = Field(default=2, ge=1)
    max_new_tokens_per_turn: int = Field(default=64, ge=1)
    max_total_new_tokens: int = Field(default=160, ge=1)
    generation_batch_size: int = Field(default=8, ge=1)


class RLTrainer(StrictModel):
    """GRPOTrainer settings (TRL names); ``per_device_train_batch_size`` counts completions."""

    loss_type: Literal["grpo", "dapo", "dr_grpo"] = "grpo"
    max_steps: int = Field(default=4, ge=1)
    learning_rate: float = Field(default=5e-5, gt=0)
    per_device_train_batch_size: int = Field(default=4, ge=1)
    num_generations: int = Field(default=4, ge=2)
    gradient_accumulation_steps: int = Field(default=1, ge=1)
    beta: float = Field(default=0.0, ge=0)
    epsilon: float = Field(default=0.2, gt=0)
    epsilon_high: float | None = Field(default=None, gt=0)
    scale_rewards: Literal["group", "batch", "none"] = "group"
    drop_uniform_groups: bool = False
    """DAPO's dynamic sampling: leave groups whose rewards are all equal out of the loss."""
    temperature: float = Field(default=1.0, gt=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    seed: int = 0
    save_steps: int = Field(default=2, ge=1)
    resume: bool = True
    gradient_checkpointing: bool = False
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    use_cpu: bool = True


class RLPolicyServer(StrictModel):
    """A ``trl vllm-serve`` server for the rollouts; TRL syncs the trained weights into it before each batch."""

    base_url: str = Field(pattern=r"^https?://")
    """The server root, e.g. ``http://127.0.0.1:8001`` (not the ``/v1`` API path)."""
    model: str = Field(min_length=1)
    """The name the server serves the policy under (the ``--model`` it was started with)."""
    timeout: float = Field(default=300.0, gt=0)


@register_parameters("rl")
class RLParams(StrictModel):
    """``rl`` parameters; see conf/base/parameters_rl.yml."""

    model: str = BUNDLED_SMOLLM2
    questions: RLQuestions = RLQuestions()
    reward: RLReward = RLReward()
    agent: RLAgent = RLAgent()
    trainer: RLTrainer = RLTrainer()
    retriever: Literal["dense", "bm25", "hybrid"] = "dense"
    top_k: int = Field(default=3, ge=1)
    policy_server: RLPolicyServer | None = None
    """None: roll out in-process with the trainer's policy (CPU, small models); set: TRL's vLLM server mode."""
    run_root: str = "data/06_models/rl_runs"
    """Checkpoints live in ``<run_root>/<fingerprint of the settings>``: an interrupted run resumes there."""

    @model_validator(mode="after")
    def _multistage_protocol(self) -> RLParams:
        if (self.reward.method == "multistage") != (self.agent.protocol == "multistage"):
            raise ValueError("rl.reward.method multistage goes with rl.agent.protocol multistage (and only with it)")
        return self


def select_rl_questions(question_records: list[dict[str, Any]], evaluation_records: list[dict[str, Any]],
                        params: RLParams) -> list[dict[str, Any]]:
    """The training questions; the evaluated questions are never among them."""
    evaluation_keys = {Question.from_dict(record).key for record in evaluation_records}
    selected = select_training_questions(map(Question.from_dict, question_records), params.questions.sources,
                                         max_per_source=params.questions.max_per_source,
                                         exclude_keys=evaluation_keys, setting="rl.questions.sources")
    if not selected:
        raise ValueError("rl.questions selects no question")
    return [question.to_dict() for question in selected]


def train_rl(question_records: list[dict[str, Any]], index: RetrievalIndex, sft_adapter: str, params: RLParams,
             judging: RewardJudgingParams) -> tuple[str, list[dict[str, Any]]]:
    """Continue the SFT adapter with GRPO; returns the adapter folder and the training log (one entry per step).

    Every logged step goes to the active MLflow run as it happens (``rl.*`` metrics); the judges are the
    ``reward_judging`` ones. The run folder is keyed by a fingerprint of the settings, the SFT adapter and the
    questions, so re-running the same configuration after an interruption resumes from its last checkpoint.
    """
    from prorag.training.grpo import AgentRolloutFunction, PolicyServer, train_grpo_lora

    questions = [Question.from_dict(record) for record in question_records]
    retriever = index.retriever(params.retriever)
    reward = params.reward
    settings = RewardSettings(method=reward.method, lambda_f=reward.lambda_f, lambda_p=reward.lambda_p,
                              beta=reward.beta, stage_switch_step=reward.stage_switch_step,
                              judge_for_metrics=reward.judge_for_metrics,
                              reask_max_new_tokens=reward.reask_max_new_tokens)
    judges = (None, None)
    if settings.needs_detection:
        judge_retriever = index.retriever(judging.retriever)
        judges = tuple(build_judge(**judge.model_dump(), retriever=judge_retriever)  # type: ignore[assignment]
                       for judge in (judging.over_search_judge, judging.under_search_judge))
    embed = index.embedder.encode_queries if reward.method == "multistage" else None
    scorer = RolloutScorer(settings, *judges, embed=embed)
    agent, trainer = params.agent, params.trainer
    rollout_function = AgentRolloutFunction(
        questions, retriever, scorer, protocol=agent.protocol, few_shot=agent.few_shot,
        step_budget=agent.step_budget, top_k=params.top_k, max_new_tokens_per_turn=agent.max_new_tokens_per_turn,
        max_total_new_tokens=agent.max_total_new_tokens, temperature=trainer.temperature, top_p=trainer.top_p,
        seed=trainer.seed, batch_size=agent.generation_batch_size,
        policy_server=PolicyServer(**params.policy_server.model_dump()) if params.policy_server else None)
    run_dir = Path(params.run_root) / run_fingerprint(params, sft_adapter, questions, judging)
    adapter, history = train_grpo_lora(
        params.model, questions, rollout_function, run_dir, adapter_dir=sft_adapter,
        learning_rate=trainer.learning_rate, max_steps=trainer.max_steps,
        per_device_train_batch_size=trainer.per_device_train_batch_size, num_generations=trainer.num_generations,
        gradient_accumulation_steps=trainer.gradient_accumulation_steps, loss_type=trainer.loss_type,
        beta=trainer.beta, epsilon=trainer.epsilon, epsilon_high=trainer.epsilon_high,
        scale_rewards=trainer.scale_rewards, drop_uniform_groups=trainer.drop_uniform_groups,
        temperature=trainer.temperature, seed=trainer.seed, save_steps=trainer.save_steps, resume=trainer.resume,
        dtype=trainer.dtype, gradient_checkpointing=trainer.gradient_checkpointing, use_cpu=trainer.use_cpu,
        callbacks=[MlflowStepMetrics("rl")])
    steps = [{key: value for key, value in entry.items() if isinstance(value, int | float)}
             for entry in history if "step" in entry]
    return str(adapter), steps


def run_fingerprint(params: RLParams, sft_adapter: str, questions: list[Question],
                    judging: RewardJudgingParams) -> str:
    """A short hash of everything that determines a training run (the checkpoint folder's name)."""
    payload = {"rl": params.model_dump(exclude={"trainer": {"resume"}, "policy_server": True}),
               "sft_adapter": str(Path(sft_adapter)),
               "questions": [question.key for question in questions],
               "judges": [judging.over_search_judge.model_dump(), judging.under_search_judge.model_dump(),
                          judging.retriever]}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]
