"""Issue 43 N9: what TRL 1.16's vLLM importance-sampling correction does to this project's multi-turn trajectories.

TRL's own code (``GRPOTrainer._generate_and_score_completions``) runs on the tiny model with the project's rollout
function, as in server mode: ``use_vllm`` on, the rollouts' sampler log-probabilities standing in for vLLM's. The
default ``sequence_mask`` sums ``old - sampling`` log-probabilities over the generated tokens (``env_mask`` 1: the
retrieved context and the engine's tags never count), and a trajectory whose ratio ``exp(sum)`` passes
``vllm_importance_sampling_clip_max`` (3) is dropped whole; below it, the ratio weighs the trajectory's loss. So a
per-token mismatch ``d`` drops every trajectory of more than ``ln 3 / d`` generated tokens and reweighs the others by
``exp(n d)``: the correction is length-biased."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from prorag.data.records import Passage, load_questions
from prorag.judges import ReferenceJudge
from prorag.llm.registry import BUNDLED_TINY_LLAMA
from prorag.retrieval.bm25 import BM25Retriever
from prorag.retrieval.store import PassageStore
from prorag.rewards.registry import build_reward
from prorag.rewards.scoring import RolloutScorer
from prorag.specs import AgentSpec
from prorag.training.config import GRPOSettings
from prorag.training.trl_grpo import AgentRolloutFunction, build_grpo_trainer, grpo_dataset

RAW = Path(__file__).resolve().parents[2] / "data" / "01_raw"
SHORT, LONG = 8, 24  # generated tokens: the tiny random model never closes a step, so every rollout uses its budget
SHIFT = math.log(3) / 16  # exp(8 d) = 1.73 is kept, exp(24 d) = 5.2 > 3 is dropped


class ShiftedSampler(AgentRolloutFunction):
    """The rollouts, with the sampler's log-probability of every generated token lowered by ``shift`` (as if vLLM
    had scored them ``shift`` lower than the trainer does) and every inserted token's set to ``inserted``."""

    shift = 0.0
    inserted = 0.0
    generated: list[int]

    def __call__(self, prompts, trainer):
        output = super().__call__(prompts, trainer)
        self.generated = [sum(mask) for mask in output["env_mask"]]
        output["logprobs"] = [[lp - self.shift if keep else self.inserted for lp, keep in zip(lps, mask, strict=True)]
                              for lps, mask in zip(output["logprobs"], output["env_mask"], strict=True)]
        return output


class ServerMode:
    """TRL's vLLM server mode, its weight sync a no-op: the trainer and the sampler are the same in-process model."""

    def sync_weights(self) -> None:
        pass


@pytest.fixture(scope="module")
def parts():
    questions = load_questions(RAW / "qa" / "hotpotqa.jsonl")[:2]
    with (RAW / "corpus" / "hotpotqa.jsonl").open(encoding="utf-8") as handle:
        passages = [Passage.from_dict(json.loads(line)) for line in itertools.islice(handle, 30)]
    retriever = BM25Retriever.build(PassageStore(passages))
    judge = ReferenceJudge(retriever)
    return questions, retriever, RolloutScorer(build_reward({"kind": "hiprag"}), over_judge=judge,
                                               under_judge=judge)


def _ratios(parts, tmp_path, *, shift, tokens=LONG, inserted=0.0, mode="sequence_mask", batch=8):
    questions, retriever, scorer = parts
    agent = AgentSpec(step_budget=1, max_new_tokens_per_turn=8, max_total_new_tokens=tokens, few_shot=False)
    function = ShiftedSampler(questions, retriever, scorer, agent, seed=3, batch_size=batch)
    function.shift, function.inserted = shift, inserted
    settings = GRPOSettings(per_device_train_batch_size=batch, num_generations=4, learning_rate=1e-3)
    trainer = build_grpo_trainer(BUNDLED_TINY_LLAMA, questions, function, tmp_path, settings,
                                 trainer_args={"vllm_importance_sampling_mode": mode})
    assert trainer.num_iterations == 1 and trainer.vllm_importance_sampling_correction  # TRL's defaults, kept
    assert trainer.vllm_importance_sampling_clip_max == 3.0 and not trainer.args.mask_truncated_completions
    trainer.use_vllm, trainer.vllm_mode, trainer.vllm_generation = True, "server", ServerMode()
    trainer._last_loaded_step = -1  # what TRL sets when it builds its vLLM client
    rows = [row for row in grpo_dataset(questions) for _ in range(4)]
    output = trainer._generate_and_score_completions(rows)
    return output["importance_sampling_ratio"], function.generated


@pytest.mark.integration
def test_on_policy_every_ratio_is_one_and_inserted_tokens_never_count(parts, tmp_path, one_torch_thread):
    """The sampler's log-probabilities are the trainer's (num_iterations 1, same weights): every trajectory's
    ratio is 1, whatever the inserted tokens' log-probabilities say (-50 each: they are left out of the sum)."""
    ratio, generated = _ratios(parts, tmp_path, shift=0.0, inserted=-50.0)
    assert ratio.shape == (8, 1) and set(generated) == {LONG}
    assert ratio.flatten().tolist() == pytest.approx([1.0] * 8, abs=1e-3)


@pytest.mark.integration
def test_a_per_token_mismatch_drops_the_long_trajectories_whole(parts, tmp_path, one_torch_thread):
    """The same mismatch d per generated token: 8-token trajectories are kept, weighed exp(8 d); 24-token ones pass
    ratio 3 and are zeroed whole (sequence_mask). token_truncate clips each token's ratio and keeps them all."""
    short, generated = _ratios(parts, tmp_path / "short", shift=SHIFT, tokens=SHORT)
    assert set(generated) == {SHORT}
    assert short.flatten().tolist() == pytest.approx([math.exp(SHORT * SHIFT)] * 8, rel=1e-2)
    long, generated = _ratios(parts, tmp_path / "long", shift=SHIFT)
    assert set(generated) == {LONG} and long.flatten().tolist() == [0.0] * 8
    token, _ = _ratios(parts, tmp_path / "token", shift=SHIFT, mode="token_truncate")
    assert token.shape[0] == 8 and token.shape[1] >= LONG
    assert float(token.max()) == pytest.approx(math.exp(SHIFT), rel=1e-2) and float(token.min()) > 0.99
