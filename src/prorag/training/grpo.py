"""GRPO / DAPO / Dr. GRPO with TRL's ``GRPOTrainer`` over the project's multi-turn rollout engine.

* :class:`AgentRolloutFunction` is TRL's ``rollout_func``: for the prompts of a generation batch (TRL's sampler
  already repeats each question ``num_generations`` times) it runs :class:`~prorag.agent.RolloutEngine` — the
  HiPRAG step protocol (or Search-R1 / multi-stage), with one batched retriever call per turn — on the trainer's
  *current* policy, in-process. It returns the exact prompt ids, the completion ids (generated and inserted
  segments), the sampler's log-probabilities (0 for inserted tokens) and ``env_mask`` (1 for generated tokens,
  0 for inserted ones: retrieved ``<context>`` and the engine's tags stay out of the loss). The batch is then
  scored with :class:`~prorag.training.process_rewards.RolloutScorer` while the same policy is unwrapped, so
  over-search re-asks use the current policy; the reward components travel to TRL as extra fields.
  With a :class:`PolicyServer` the same rollouts and re-asks go through an OpenAI-compatible server instead
  (``trl vllm-serve``): :func:`build_grpo_trainer` then turns on TRL's vLLM server mode, which pushes the
  current weights (LoRA merged) to that server before every generation batch, so it serves the current policy.
* :class:`ComponentReward` hands one component to TRL, which sums the components (each already weighted) and
  logs each one's mean and std.
* :class:`AgentGRPOTrainer` adds the agent statistics (format rate, CEM, OSR, USR, search ratio, retrievals,
  unknown-judge rate, tokens, ``bonus_fired``: the share of rollouts whose process bonus fired, ``process_shaped``:
  the share of groups whose advantages the process term changes, :func:`process_shaped_groups`) to TRL's logged
  metrics, summed over processes before the ratio is taken, and DAPO's dynamic sampling filter when
  ``drop_uniform_groups`` is set (TRL 1.16 has none): groups whose rewards are all equal are removed from the loss
  and its token normalizer, and ``dapo/dropped_group_fraction`` says how many. DAPO's refill (``refill_rounds``)
  happens before, in the rollout function: each uniform group is replaced by the group of a newly drawn training
  question, for a bounded number of rounds (``dapo/refilled_groups``).
* :func:`train_grpo_lora` trains a LoRA adapter (a fresh one, or continuing a given one such as the SFT adapter),
  with checkpoints every ``save_steps`` and resumption from the last checkpoint of an unfinished run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import torch
from trl import GRPOConfig, GRPOTrainer
from trl.import_utils import is_vllm_available
from trl.models.utils import unwrap_model_for_generation

from prorag.agent.runner import build_engine
from prorag.llm.generation import Generator
from prorag.llm.openai_backend import OpenAICompatibleGenerator, api_key_from_env
from prorag.llm.transformers_backend import TransformersGenerator
from prorag.metrics.qa import cover_exact_match
from prorag.rewards import count_optimal
from prorag.specs import AgentSpec, SamplingSpec
from prorag.training.config import GRPOSettings
from prorag.training.process_rewards import Ratio, RewardSettings, ScoredBatch, batch_stats
from prorag.training.trl_private import GRPOTrainerHooks

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, TrainerCallback

    from prorag.agent.engine import RolloutEngine
    from prorag.agent.trajectory import Rollout
    from prorag.data.records import Question
    from prorag.retrieval.base import Retriever
    from prorag.training.process_rewards import RolloutScorer

logger = logging.getLogger(__name__)

COMPLETED_MARKER: Final = "COMPLETED"
"""Written into the output folder when training finished: its checkpoints are then not resumed."""
REWARD_FIELD_PREFIX: Final = "reward_"
STAT_PREFIX: Final = "agent/"


@dataclass(frozen=True)
class PolicyServer:
    """A vLLM server (``trl vllm-serve``) serving the policy being trained.

    ``base_url`` is the server root (``http://host:8000``): TRL syncs weights through it and the rollouts use
    its OpenAI-compatible ``/v1`` API; ``model`` is the name the server serves the policy under. The rollouts
    send the key held by the environment variable named ``api_key_env`` (``None``: a keyless server, as
    ``trl vllm-serve`` is); a named variable that is unset fails here, before any request, and no other
    variable (``$OPENAI_API_KEY``) is ever sent.
    """

    base_url: str
    model: str
    timeout: float = 300.0
    max_retries: int = 2
    api_key_env: str | None = None

    def __post_init__(self) -> None:
        self.api_key()  # an unset named variable is an error now, not at the first rollout

    def api_key(self) -> str:
        """The key to send (see the class docstring)."""
        return api_key_from_env(self.api_key_env, endpoint=f"the policy server at {self.root}")

    @property
    def root(self) -> str:
        return self.base_url.rstrip("/")

    @property
    def openai_url(self) -> str:
        return self.root + "/v1"


class AgentRolloutFunction:
    """TRL ``rollout_func`` running the multi-turn engine on the trainer's current policy (module docstring).

    ``questions`` are the training questions; prompts arrive as their text (the dataset's ``prompt`` column,
    see :func:`grpo_dataset`). ``seed`` is offset by the global step and the process index, so every step and
    process samples differently and a resumed run samples as the uninterrupted one would.
    """

    def __init__(self, questions: Sequence[Question], retriever: Retriever, scorer: RolloutScorer, agent: AgentSpec,
                 *, top_k: int = 3, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, batch_size: int = 8,
                 policy_server: PolicyServer | None = None, refill_rounds: int = 0) -> None:
        self._questions: dict[str, Question] = {}
        for question in questions:
            known = self._questions.setdefault(question.question, question)
            if known is not question and tuple(known.golden_answers) != tuple(question.golden_answers):
                raise ValueError(f"questions {known.key!r} and {question.key!r} have the same text and different "
                                 "answers; deduplicate the training set (grpo_dataset does)")
        self.retriever = retriever
        self.scorer = scorer
        self.agent = agent
        self.top_k = top_k
        self.sampling = SamplingSpec(temperature=temperature, top_p=top_p, seed=seed)
        self.seed = seed
        self.batch_size = batch_size
        self.policy_server = policy_server
        self.refill_rounds = refill_rounds
        """DAPO dynamic sampling with refill: rounds of re-drawing groups whose rewards are all equal."""
        self.last_rollouts: list[Rollout] = []
        self.last_refill: dict[str, float] = {}

    @property
    def reward_components(self) -> tuple[str, ...]:
        return self.scorer.settings.components

    def __call__(self, prompts: list[Any], trainer: GRPOTrainer) -> dict[str, Any]:
        questions = [self._question(prompt) for prompt in prompts]
        step = int(trainer.state.global_step)
        seed = self.seed + 1_000_003 * step + 7_919 * trainer.accelerator.process_index
        with self._policy(trainer) as generator:
            engine = build_engine(self.agent, generator, self.retriever, top_k=self.top_k, logprobs=True,
                                  sampling=self.sampling.model_copy(update={"seed": seed}), progress=False)
            rollouts = engine.run(questions)
            scored = self.scorer.score(rollouts, generator, step=step)
            if self.refill_rounds:
                rollouts, scored = self._refill(questions, rollouts, scored, engine, generator, trainer, seed)
        if isinstance(trainer, AgentGRPOTrainer):
            shaped = process_shaped_groups(scored, self.scorer.settings, int(trainer.num_generations),
                                           str(trainer.scale_rewards))
            trainer.record_rollout_stats({**scored.stats, **({"process_shaped": shaped} if shaped else {})})
            for name, value in self.last_refill.items():
                trainer.log_metric(name, value)
        self.last_rollouts = rollouts
        completions = [_completion_arrays(rollout) for rollout in rollouts]
        return {
            "prompt_ids": [list(rollout.prompt_token_ids) for rollout in rollouts],
            "completion_ids": [ids for ids, _, _ in completions],
            "logprobs": [logprobs for _, logprobs, _ in completions],
            "env_mask": [mask for _, _, mask in completions],
            **{REWARD_FIELD_PREFIX + name: values for name, values in scored.components.items()},
        }

    def _refill(self, questions: list[Question], rollouts: list[Rollout], scored: ScoredBatch, engine: RolloutEngine,
                generator: Generator, trainer: GRPOTrainer, seed: int) -> tuple[list[Rollout], ScoredBatch]:
        """DAPO's dynamic sampling with refill: a group whose rewards are all equal has zero advantage and teaches
        nothing, so it is replaced by the group of a newly drawn training question (not in the batch), for up to
        ``refill_rounds`` rounds; what is still uniform then is left to ``drop_uniform_groups``.

        The groups are TRL's: ``num_generations`` consecutive copies of one prompt. A local batch that is not whole
        groups is left as it is (logged). The returned statistics (``bonus_fired`` and the multi-stage answer
        statistics included) describe the final, refilled batch.
        """
        size = int(trainer.num_generations)
        groups = len(questions) // size
        if len(questions) % size or any(len({q.key for q in questions[g * size:(g + 1) * size]}) != 1
                                        for g in range(groups)):
            logger.warning("DAPO refill skipped: %d local prompts are not whole groups of %d", len(questions), size)
            return rollouts, scored
        rng = random.Random(seed)
        pool = list(self._questions.values())
        rollouts, totals = list(rollouts), list(scored.totals)
        components = {name: list(values) for name, values in scored.components.items()}
        # what else is per rollout travels with it, so the statistics describe the final batch
        per_rollout: dict[str, list[Any] | None] = {
            name: list(values) if values is not None and len(values) == len(rollouts) else None
            for name, values in (("verdicts", scored.verdicts), ("optimal", scored.optimal),
                                 ("bonus_fired", scored.bonus_fired), ("answer_correct", scored.answer_correct))}
        uniform_at_start = refilled = rounds = 0
        tried: set[str] = set()  # a question whose group was drawn once is not drawn again for this batch
        for round_index in range(self.refill_rounds + 1):
            uniform = uniform_groups(totals, size)
            if round_index == 0:
                uniform_at_start = len(uniform)
            tried.update(rollout.question_key for rollout in rollouts)
            candidates = [question for question in pool if question.key not in tried]
            if not uniform or round_index == self.refill_rounds or not candidates:
                break
            rounds += 1
            drawn = rng.sample(candidates, min(len(uniform), len(candidates)))
            uniform = uniform[:len(drawn)]
            new_questions = [question for question in drawn for _ in range(size)]
            new_rollouts = engine.run(new_questions)
            new_scored = self.scorer.score(new_rollouts, generator, step=int(trainer.state.global_step))
            for slot, group in enumerate(uniform):
                for offset in range(size):
                    target, source = group * size + offset, slot * size + offset
                    rollouts[target] = new_rollouts[source]
                    totals[target] = new_scored.totals[source]
                    for name in components:
                        components[name][target] = new_scored.components[name][source]
                    for name, values in per_rollout.items():
                        new_values = getattr(new_scored, name)
                        if values is not None:
                            values[target] = (new_values[source] if new_values is not None
                                              and source < len(new_values) else None)
            refilled += len(uniform)
        self.last_refill = {"dapo/uniform_groups_drawn": float(uniform_at_start),
                            "dapo/refilled_groups": float(refilled), "dapo/refill_rounds": float(rounds),
                            "dapo/uniform_groups_left": float(len(uniform_groups(totals, size)))}
        verdicts, optimal = per_rollout["verdicts"], per_rollout["optimal"]
        bonus_fired, answer_correct = per_rollout["bonus_fired"], per_rollout["answer_correct"]
        stats = {**scored.stats, **batch_stats(rollouts, verdicts, bonus_fired=bonus_fired,
                                               answer_correct=answer_correct, stage=scored.stage)}
        return rollouts, ScoredBatch(components, totals, stats, verdicts,
                                     optimal if optimal is not None else [None] * len(rollouts), bonus_fired,
                                     answer_correct, scored.stage)

    @contextlib.contextmanager
    def _policy(self, trainer: GRPOTrainer) -> Iterator[Generator]:
        """The current policy: in-process, or the policy server that TRL keeps in sync."""
        if self.policy_server is None:
            with policy_generator(trainer, batch_size=self.batch_size) as generator:
                yield generator
            return
        server = self.policy_server
        with OpenAICompatibleGenerator(server.openai_url, server.model, server.api_key(), mode="completions",
                                       max_concurrency=self.batch_size, timeout=server.timeout,
                                       max_retries=server.max_retries, tokenizer=trainer.processing_class,
                                       return_token_ids=True) as generator:
            yield generator

    def _question(self, prompt: Any) -> Question:
        text = prompt if isinstance(prompt, str) else None
        if text is None or text not in self._questions:
            raise KeyError(f"prompt {str(prompt)[:80]!r} is not one of the rollout function's training questions")
        return self._questions[text]


def uniform_groups(totals: Sequence[float], size: int) -> list[int]:
    """Indices of the consecutive groups of ``size`` rewards whose rewards are all equal (zero advantage)."""
    return [group for group in range(len(totals) // size)
            if max(totals[group * size:(group + 1) * size]) - min(totals[group * size:(group + 1) * size]) < 1e-8]


def grpo_advantages(rewards: Sequence[float], size: int, scale_rewards: str) -> np.ndarray:
    """TRL's GRPO advantages for consecutive groups of ``size``: reward minus its group mean, divided by the
    group's (``group``) or the batch's (``batch``) standard deviation + 1e-4, or not divided (``none``)."""
    values = np.asarray(rewards, dtype=np.float64)[: len(rewards) // size * size].reshape(-1, size)
    centred = values - values.mean(axis=1, keepdims=True)
    if scale_rewards == "none":
        return centred.ravel()
    spread = (values.std(axis=1, ddof=1, keepdims=True) if scale_rewards == "group"
              else np.full((len(values), 1), values.std(ddof=1) if values.size > 1 else 0.0))
    return (centred / (spread + 1e-4)).ravel()


def process_shaped_groups(scored: ScoredBatch, settings: RewardSettings, size: int, scale_rewards: str,
                          reference_lambda_p: float = 0.4, tolerance: float = 1e-3) -> Ratio | None:
    """Groups whose GRPO advantages eq. 1's process term ``λp·A·F·N_corr/N`` changes, out of all groups.

    "The bonus fired" is not enough for HiPRAG's reward to teach something Search-R1's does not: when every
    correct rollout of a group has the same ``N_corr/N`` and the rest share one reward, the process term is an
    affine map of the outcome + format reward within the group, and the group-normalized advantages are the
    same (up to the 1e-4 in the denominator). This counts the groups where they differ by more than
    ``tolerance``, comparing the reward with and without the term. A λp = 0 (Search-R1) run uses
    ``reference_lambda_p`` (the paper's 0.4), so it reports what HiPRAG's term *would* have changed. None for
    the multi-stage reward and when detection did not run; a group with a rollout whose gate is unknown is left
    out, and so is a batch that is not whole groups (``(0, 0)``).
    """
    if settings.method == "multistage" or scored.bonus_fired is None:
        return None
    count = len(scored.totals)
    if count % size or len(scored.bonus_fired) != count or len(scored.optimal) != count:
        return 0.0, 0.0
    counts = list(scored.optimal)
    if scored.verdicts is not None and len(scored.verdicts) == count:  # λp = 0 scores no N_corr: count it here
        counts = [optimal if optimal is not None or not fired else count_optimal(verdicts, settings.detection_mode)
                  for optimal, fired, verdicts in zip(counts, scored.bonus_fired, scored.verdicts, strict=True)]
    terms = [float("nan") if fired is None or (fired and optimal is None)
             else optimal.n_optimal / optimal.n_steps if fired and optimal is not None else 0.0
             for fired, optimal in zip(scored.bonus_fired, counts, strict=True)]
    lambda_p = settings.effective_lambda_p or reference_lambda_p
    without = np.asarray(scored.totals) - np.asarray(scored.components.get("process", [0.0] * count))
    with_term = without + lambda_p * np.asarray(terms)
    known = ~np.isnan(with_term.reshape(-1, size)).any(axis=1)
    if scale_rewards == "batch" and not known.all():  # one unknown term makes the batch's spread unknown
        return 0.0, 0.0
    difference = np.abs(grpo_advantages(with_term, size, scale_rewards)
                        - grpo_advantages(without, size, scale_rewards)).reshape(-1, size)
    shaped = (difference[known].max(axis=1) > tolerance).sum() if known.any() else 0
    return float(shaped), float(known.sum())


def probe_groups(questions: Sequence[Question], generator: Generator, retriever: Retriever, scorer: RolloutScorer,
                 agent: AgentSpec, *, group_sizes: Sequence[int], top_k: int = 3, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int = 0, scale_rewards: str = "group") -> list[dict[str, float]]:
    """What a GRPO configuration's first step would see, without training: ``max(group_sizes)`` rollouts per
    question from the starting policy, sampled and scored as :class:`AgentRolloutFunction` does, then cut into
    groups of each size (a group of ``g`` is the first ``g`` samples of each question's group: i.i.d. samples).

    Per group size: ``groups``; ``cem`` and ``bonus_fired`` over rollouts; ``uniform_groups`` (all rewards equal:
    no gradient); ``process_shaped`` (:func:`process_shaped_groups`: groups whose advantages eq. 1's process term
    changes; NaN when not measurable). Sizes a HiPRAG vs Search-R1 run before paying for it.
    """
    sizes = sorted(set(group_sizes))
    if not sizes or sizes[0] < 2:
        raise ValueError(f"group sizes must be >= 2 (GRPO needs two samples to compare), got {list(group_sizes)}")
    largest = sizes[-1]
    engine = build_engine(agent, generator, retriever, top_k=top_k, progress=True,
                          sampling=SamplingSpec(temperature=temperature, top_p=top_p, seed=seed))
    rollouts = engine.run([question for question in questions for _ in range(largest)])
    scored = scorer.score(rollouts, generator, step=0)
    results = []
    for size in sizes:
        keep = [index for index in range(len(rollouts)) if index % largest < size]
        subset = ScoredBatch({name: [values[i] for i in keep] for name, values in scored.components.items()},
                             [scored.totals[i] for i in keep], {},
                             [scored.verdicts[i] for i in keep] if scored.verdicts is not None else None,
                             [scored.optimal[i] for i in keep] if len(scored.optimal) == len(rollouts) else [],
                             [scored.bonus_fired[i] for i in keep] if scored.bonus_fired is not None else None)
        shaped = process_shaped_groups(subset, scorer.settings, size, scale_rewards)
        fired = subset.bonus_fired or []
        results.append({
            "group_size": float(size), "groups": float(len(questions)), "rollouts": float(len(keep)),
            "cem": float(np.mean([cover_exact_match(rollouts[i].answer, rollouts[i].golden_answers) for i in keep])),
            "bonus_fired": float(np.mean([value is True for value in fired])) if fired else float("nan"),
            "uniform_groups": len(uniform_groups(subset.totals, size)) / len(questions),
            "process_shaped": shaped[0] / shaped[1] if shaped and shaped[1] else float("nan")})
    return results


def _completion_arrays(rollout: Rollout) -> tuple[list[int], list[float], list[int]]:
    ids: list[int] = []
    logprobs: list[float] = []
    mask: list[int] = []
    for segment in rollout.segments:
        ids.extend(segment.token_ids)
        mask.extend([int(segment.generated)] * len(segment.token_ids))
        values = segment.logprobs if segment.generated and segment.logprobs is not None else None
        logprobs.extend(values if values is not None else [0.0] * len(segment.token_ids))
    return ids, logprobs, mask


@contextlib.contextmanager
def policy_generator(trainer: GRPOTrainer, *, batch_size: int) -> Iterator[TransformersGenerator]:
    """The trainer's current policy as a :class:`TransformersGenerator` (unwrapped, eval mode, no grad)."""
    model = trainer.model_wrapped
    with (unwrap_model_for_generation(model, trainer.accelerator,
                                      gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
                                      gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs)
          as unwrapped, torch.no_grad()):
        was_training = unwrapped.training
        try:
            yield TransformersGenerator((unwrapped, trainer.processing_class), batch_size=batch_size)
        finally:
            unwrapped.train(was_training)


class ComponentReward:
    """One reward component computed by the rollout function, handed to TRL as a reward function."""

    def __init__(self, component: str) -> None:
        self.component = component
        self.__name__ = component

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        field = REWARD_FIELD_PREFIX + self.component
        if field not in kwargs:
            raise KeyError(f"the rollout function returned no {field!r} (use AgentRolloutFunction)")
        return [float(value) for value in kwargs[field]]


class AgentGRPOTrainer(GRPOTrainerHooks):
    """``GRPOTrainer`` with agent statistics in its logs and optional DAPO dynamic sampling (module docstring)."""

    def __init__(self, *args: Any, drop_uniform_groups: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.drop_uniform_groups = drop_uniform_groups

    def record_rollout_stats(self, stats: dict[str, Ratio]) -> None:
        """Add ``(numerator, denominator)`` statistics, summed over processes, to the next logged metrics."""
        names = sorted(stats)
        local = torch.tensor([stats[name] for name in names], dtype=torch.float64, device=self.accelerator.device)
        total = self.accelerator.reduce(local, reduction="sum") if self.accelerator.num_processes > 1 else local
        for name, (numerator, denominator) in zip(names, total.tolist(), strict=True):
            if denominator > 0:
                self.log_metric(STAT_PREFIX + name, numerator / denominator)

    def after_scoring(self, output: dict[str, Any]) -> None:
        if self.drop_uniform_groups and self.model.training:
            self._drop_uniform_groups(output)

    def _drop_uniform_groups(self, output: dict[str, Any]) -> None:
        advantages = output["advantages"]
        size = self.num_generations
        if advantages.shape[0] % size:
            logger.warning("dynamic sampling skipped: %d local completions are not whole groups of %d",
                           advantages.shape[0], size)
            return
        uniform = (advantages.view(-1, size).abs() < 1e-8).all(dim=1)
        dropped = float(uniform.float().mean())
        self.log_metric("dapo/dropped_group_fraction", dropped, mode="train")
        if not uniform.any() or uniform.all():  # nothing to drop, or nothing would remain (zero loss anyway)
            return
        keep = (~uniform).repeat_interleave(size).to(output["completion_mask"].dtype).unsqueeze(1)
        output["completion_mask"] = output["completion_mask"] * keep
        loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
        output["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()


def grpo_dataset(questions: Sequence[Question]) -> Any:
    """A ``datasets.Dataset`` with TRL's ``prompt`` column (the question text; duplicates by text dropped)."""
    from datasets import Dataset

    seen: set[str] = set()
    rows = []
    for question in questions:
        if question.question in seen:
            continue
        seen.add(question.question)
        rows.append({"prompt": question.question, "question_key": question.key, "dataset": question.dataset,
                     "golden_answers": list(question.golden_answers)})
    if not rows:
        raise ValueError("no training question for GRPO")
    return Dataset.from_list(rows)


def build_grpo_trainer(model: str | tuple[PreTrainedModel, PreTrainedTokenizerBase], questions: Sequence[Question],
                       rollout_function: AgentRolloutFunction, checkpoint_dir: str | Path, settings: GRPOSettings, *,
                       adapter_dir: str | Path | None = None, full_parameters: bool = False,
                       callbacks: list[TrainerCallback] | None = None) -> AgentGRPOTrainer:
    """An :class:`AgentGRPOTrainer` training a LoRA policy with ``rollout_function`` (see :func:`train_grpo_lora`).

    ``model`` is a registry spec or a loaded ``(model, tokenizer)``. ``adapter_dir`` continues training an
    existing adapter (e.g. the SFT one) instead of a fresh LoRA (``settings.lora``). ``full_parameters`` trains
    every weight instead (HiPRAG's setting); a given adapter is then merged into the model first.
    """
    from peft import LoraConfig, PeftModel

    from prorag.llm.registry import load_causal_lm

    policy, tokenizer = load_causal_lm(model, dtype=settings.dtype) if isinstance(model, str) else model
    peft_config = None
    if full_parameters:
        if adapter_dir is not None:
            policy = PeftModel.from_pretrained(policy, str(adapter_dir)).merge_and_unload()
    elif adapter_dir is not None:
        policy = PeftModel.from_pretrained(policy, str(adapter_dir), is_trainable=True)
    else:
        lora = settings.lora
        peft_config = LoraConfig(r=lora.lora_r, lora_alpha=lora.lora_alpha, lora_dropout=lora.lora_dropout,
                                 target_modules=list(lora.target_modules), bias="none", task_type="CAUSAL_LM")
    server = rollout_function.policy_server
    if server is not None and not is_vllm_available():
        raise ImportError(f"a policy server ({server.base_url}) needs vllm installed (the gpu extra): TRL pushes the "
                          "trained weights to it through vLLM's client before every generation batch")
    vllm = ({"use_vllm": True, "vllm_mode": "server", "vllm_server_base_url": server.root}
            if server is not None else {})
    trl_names = settings.model_dump(include={
        "learning_rate", "max_steps", "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
        "loss_type", "beta", "epsilon", "epsilon_high", "scale_rewards", "temperature", "seed", "logging_steps",
        "save_steps", "save_total_limit", "use_cpu"})
    config = GRPOConfig(
        **vllm,
        **trl_names,
        output_dir=str(checkpoint_dir),
        report_to=[],
        bf16=settings.dtype == "bfloat16" and not settings.use_cpu,
        fp16=False,
        mask_truncated_completions=False,  # agent completions end with </answer>, not EOS
        data_seed=settings.seed,
        save_strategy="steps",
        activation_checkpointing=settings.gradient_checkpointing,
        remove_unused_columns=False,
        shuffle_dataset=True,
    )
    # rollout_func is flagged experimental by TRL; the pinned TRL version is the one this module is tested with.
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    return AgentGRPOTrainer(
        model=policy, args=config, processing_class=tokenizer, train_dataset=grpo_dataset(questions),
        reward_funcs=[ComponentReward(name) for name in rollout_function.reward_components],
        peft_config=peft_config, rollout_func=rollout_function, callbacks=callbacks,
        drop_uniform_groups=settings.drop_uniform_groups)


def train_grpo_lora(model: str | tuple[PreTrainedModel, PreTrainedTokenizerBase], questions: Sequence[Question],
                    rollout_function: AgentRolloutFunction, output_dir: str | Path, settings: GRPOSettings, *,
                    adapter_dir: str | Path | None = None, full_parameters: bool = False,
                    callbacks: list[TrainerCallback] | None = None) -> tuple[Path, list[dict[str, Any]]]:
    """Train with :func:`build_grpo_trainer`; save only the adapter, to ``output_dir / "adapter"``.

    Checkpoints go to ``output_dir / "checkpoints"`` every ``save_steps``. With ``settings.resume``, an unfinished
    run in the same ``output_dir`` continues from its last checkpoint (the step count, optimizer, scheduler and RNG
    states go on); a finished one is started afresh. Returns the adapter folder and ``log_history``.
    """
    from transformers.trainer_utils import get_last_checkpoint

    output = Path(output_dir)
    checkpoints = output / "checkpoints"
    trainer = build_grpo_trainer(model, questions, rollout_function, checkpoints, settings, adapter_dir=adapter_dir,
                                 full_parameters=full_parameters, callbacks=callbacks)
    if trainer.accelerator.is_main_process:  # under `accelerate launch` only the main process edits the folder
        if (output / COMPLETED_MARKER).exists():
            logger.info("%s holds a finished run: starting afresh", output)
            shutil.rmtree(checkpoints, ignore_errors=True)
            (output / COMPLETED_MARKER).unlink()
        checkpoints.mkdir(parents=True, exist_ok=True)
    trainer.accelerator.wait_for_everyone()
    last = get_last_checkpoint(str(checkpoints)) if settings.resume else None
    if last is not None:
        logger.info("resuming GRPO from %s", last)
    trainer.train(resume_from_checkpoint=last)
    adapter = output / "adapter"
    trainer.save_model(str(adapter))  # the adapter only (PEFT) or the full model, gathered under ZeRO-3
    if trainer.accelerator.is_main_process:
        if full_parameters:  # a loadable model folder: the rollouts load it as the model
            trainer.processing_class.save_pretrained(str(adapter))
        (output / COMPLETED_MARKER).write_text(json.dumps({"global_step": trainer.state.global_step}))
    trainer.accelerator.wait_for_everyone()
    logger.info("saved the GRPO LoRA adapter to %s after %d steps", adapter, trainer.state.global_step)
    return adapter, list(trainer.state.log_history)
