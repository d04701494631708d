"""Nodes of the RL pipeline."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from prorag.data import Question, select_questions, warn_non_train_splits
from prorag.data.selection import question_parts
from prorag.pipelines.rl.params import RLParams
from prorag.retrieval import RetrievalIndex
from prorag.rewards.base import RewardSettings
from prorag.rewards.registry import check_reward_protocol
from prorag.specs import PolicySpec, TrainedAgentSpec
from prorag.tracking.callbacks import MlflowStepMetrics
from prorag.training.launch import IN_PROCESS, LaunchSettings, launch_grpo

logger = logging.getLogger(__name__)


def select_rl_questions(question_records: list[dict[str, Any]], evaluation_records: list[dict[str, Any]],
                        params: RLParams) -> list[dict[str, Any]]:
    """The training questions; the evaluated questions (``evaluated_questions``: rollout and compare questions; by
    key and by text) are never among them."""
    pool = [Question.from_dict(record) for record in question_records]
    if params.questions.part != "all":
        parts = question_parts(pool)
        pool = [question for question in pool if parts[question.key] == params.questions.part]
    if params.questions.min_metadata:
        pool = [question for question in pool if _meets(question, params.questions.min_metadata)]
    selected = select_questions(pool, params.questions.sources,
                                max_per_source=params.questions.max_per_source,
                                exclude=[Question.from_dict(record) for record in evaluation_records],
                                setting="rl.questions.sources")
    if not selected:
        raise ValueError("rl.questions selects no question")
    warn_non_train_splits(selected, "rl.questions.sources")
    return [question.to_dict() for question in selected]


def _meets(question: Question, minimum: dict[str, float]) -> bool:
    """Every ``metadata[key]`` of ``minimum`` is a number at least its value (``rl.questions.min_metadata``)."""
    values = [question.metadata.get(key) for key in minimum]
    return all(isinstance(value, int | float) and not isinstance(value, bool) and value >= bound
               for value, bound in zip(values, minimum.values(), strict=True))


def train_rl(question_records: list[dict[str, Any]], index: RetrievalIndex, sft_adapter: str, params: RLParams,
             policy: PolicySpec, agent: TrainedAgentSpec, reward: RewardSettings,
             launch: LaunchSettings = IN_PROCESS) -> tuple[str, list[dict[str, Any]]]:
    """GRPO on ``policy.model``: continuing the SFT adapter (``rl.init: sft``) or from the instruct model itself
    (``instruct``), as a LoRA adapter or with every parameter (``rl.lora: false``); returns the trained adapter (or
    full model) folder and the training log (one entry per step).

    The agent (protocol, budgets) and the reward with its judges are the shared ``agent`` and ``reward`` blocks,
    which the trained-policy rollouts and reward judging read too. Every logged step goes to the active MLflow run
    as it happens (``rl.*`` metrics). The run folder is keyed by a fingerprint of the settings, the SFT adapter
    and the questions, so re-running the same configuration after an interruption resumes from its last
    checkpoint. The trainer is ``rl.backend``'s (:mod:`prorag.training.backends`; TRL's by default). With
    ``launch.mode: accelerate`` the training runs under ``accelerate launch`` (:mod:`prorag.training.launch`; its
    bundle folder holds the checkpoints, rank 0 logs the curves).
    """
    from prorag.assembly import build_grpo_rollouts
    from prorag.training.backends import trainer_backend

    check_reward_protocol(reward, agent.protocol)
    backend = trainer_backend(params.backend.name)
    questions = [Question.from_dict(record) for record in question_records]
    trainer = params.trainer
    server = params.policy_server.model_dump() if params.policy_server else None
    start = sft_adapter if params.init == "sft" else None
    if launch.enabled:
        result = launch_grpo(policy.model, questions, index, launch, trainer=trainer, retriever=params.retriever,
                             agent=agent, reward=reward, start_adapter=start, full_parameters=not params.lora,
                             generation_batch_size=params.generation_batch_size,
                             judge_for_metrics=params.judge_for_metrics, policy_server=server, metrics_prefix="rl",
                             backend=params.backend.model_dump())
        return str(result.adapter), [{key: value for key, value in entry.items() if isinstance(value, int | float)}
                                     for entry in result.log_history if "step" in entry]
    rollout_function = build_grpo_rollouts(
        questions, index, retriever=params.retriever, agent=agent, reward=reward, trainer=trainer,
        generation_batch_size=params.generation_batch_size, judge_for_metrics=params.judge_for_metrics,
        policy_server=server, backend=params.backend.name)
    run_dir = Path(params.run_root) / run_fingerprint(params, start or "", questions, policy, agent, reward,
                                                      index=index.fingerprint())
    adapter, history = backend.train(policy.model, questions, rollout_function, run_dir, trainer,
                                     args=params.backend.args, adapter_dir=start, full_parameters=not params.lora,
                                     callbacks=[MlflowStepMetrics("rl")])
    steps = [{key: value for key, value in entry.items() if isinstance(value, int | float)}
             for entry in history if "step" in entry]
    return str(adapter), steps


def train_rl_from_instruct(question_records: list[dict[str, Any]], index: RetrievalIndex, params: RLParams,
                           policy: PolicySpec, agent: TrainedAgentSpec, reward: RewardSettings,
                           launch: LaunchSettings = IN_PROCESS) -> tuple[str, list[dict[str, Any]]]:
    """:func:`train_rl` from the instruct model itself, with no SFT adapter: the pipeline has no SFT stage, so it
    trains with ``rl.init: instruct`` whatever the block says (``sft``, the embedded default, is logged as not
    applying; the run fingerprint records ``instruct``)."""
    if params.init != "instruct":
        logger.info("rl.init: %s does not apply here: this pipeline has no SFT stage and trains policy.model itself",
                    params.init)
        params = params.model_copy(update={"init": "instruct"})
    return train_rl(question_records, index, "", params, policy, agent, reward, launch)


def run_fingerprint(params: RLParams, sft_adapter: str, questions: list[Question], policy: PolicySpec,
                    agent: TrainedAgentSpec, reward: RewardSettings, *, index: str = "") -> str:
    """A short hash of everything that determines a training run (the checkpoint folder's name), the version of the
    index it retrieves from included (:meth:`~prorag.retrieval.RetrievalIndex.fingerprint`): after a re-index a run
    starts afresh instead of resuming checkpoints trained on other passages."""
    rl = params.model_dump(exclude={"trainer": {"resume"}, "policy_server": True, "backend": True})
    # the backend only when not TRL's (and TRL's args where they were, in trainer.trainer_args, only when set), so
    # runs from before the backend seam keep their fingerprint (and checkpoints)
    if params.backend.name != "trl":
        rl["backend"] = params.backend.model_dump()
    elif params.backend.args:
        rl["trainer"]["trainer_args"] = dict(params.backend.args)
    payload = {"rl": rl,
               "model": policy.model, "agent": agent.model_dump(exclude={"name"}), "reward": reward.model_dump(),
               "sft_adapter": str(Path(sft_adapter)) if sft_adapter else None,
               "questions": [question.key for question in questions]}
    if index:  # only when known, so a fingerprint computed without an index keeps its value
        payload["index"] = index
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]
