"""The plain-PyTorch GRPO backend (:mod:`prorag.training.torch_grpo`) with the tiny random Llama: the objective moves
probability toward the better completion of a group, KL to the reference pulls back, a run trains the adapter with
varied rewards and logs the TRL backend's metrics, and an interrupted run resumes from its last checkpoint."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from prorag.llm.registry import BUNDLED_TINY_LLAMA
from prorag.rewards.registry import build_reward
from prorag.rewards.scoring import ScoredBatch, batch_stats
from prorag.specs import AgentSpec
from prorag.training.backends import trainer_backend
from prorag.training.config import GRPOSettings
from prorag.training.grpo import COMPLETED_MARKER, AgentRollouts, PolicyServer
from prorag.training.torch_grpo import TorchGRPOArgs, _Generation, _logps, _policy, _update, train_torch_grpo

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "data" / "01_raw"
AGENT = AgentSpec(step_budget=1, max_new_tokens_per_turn=8, max_total_new_tokens=16, few_shot=False)
SETTINGS = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "num_generations": 2,
            "learning_rate": 1e-2, "save_steps": 1}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class PositionScorer:
    """Rewards 1 for the second rollout of each pair, 0 for the first: every group varies, so every step has a
    gradient (the tiny random policy never answers, so a real reward would be uniform)."""

    reward = build_reward({"kind": "search_r1"})
    components = reward.components

    def score(self, rollouts, policy, step=0):
        totals = [float(position % 2) for position in range(len(rollouts))]
        zeros = [0.0] * len(rollouts)
        return ScoredBatch({"outcome": totals, "format": zeros, "process": zeros}, totals,
                           batch_stats(rollouts, None), None, [None] * len(rollouts))


def _two_completions(tokenizer) -> _Generation:
    """One group of two hand-made completions of one prompt, the second with the higher reward."""
    prompt = tokenizer("Who wrote Jaws?")["input_ids"]
    rows = [prompt + tokenizer(" Peter Benchley", add_special_tokens=False)["input_ids"],
            prompt + tokenizer(" a shark", add_special_tokens=False)["input_ids"]]
    length = max(map(len, rows))
    ids = torch.tensor([row + [0] * (length - len(row)) for row in rows])
    attention = torch.tensor([[1] * len(row) + [0] * (length - len(row)) for row in rows])
    mask = torch.zeros(2, length - 1)
    for index, row in enumerate(rows):
        mask[index, len(prompt) - 1:len(row) - 1] = 1.0
    return _Generation(0, ids, attention, mask, torch.tensor([-0.7071, 0.7071]))


def _sequence_logps(model, generation: _Generation) -> list[float]:
    with torch.no_grad():
        return (_logps(model, generation, 1.0) * generation.mask).sum(-1).tolist()


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_the_objective_moves_probability_to_the_better_completion(loss_type):
    settings = GRPOSettings(per_device_train_batch_size=1, gradient_accumulation_steps=2, num_generations=2,
                            learning_rate=5e-3, loss_type=loss_type, temperature=1.0)
    policy, tokenizer = _policy(BUNDLED_TINY_LLAMA, settings, adapter_dir=None, full_parameters=False)
    generation = _two_completions(tokenizer)
    before = _sequence_logps(policy, generation)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=settings.learning_rate)
    for _ in range(3):
        metrics = _update(policy, generation, settings, TorchGRPOArgs(), False, torch.device("cpu"))
        optimizer.step()
        optimizer.zero_grad()
    after = _sequence_logps(policy, generation)
    assert after[1] > before[1] and after[0] < before[0]  # the better completion gained, the worse lost
    assert metrics["clip_ratio"] == 0.0  # one update per batch: the ratio is 1


def test_kl_to_the_reference_is_zero_at_the_start_and_grows_with_training():
    settings = GRPOSettings(per_device_train_batch_size=2, num_generations=2, learning_rate=5e-3, beta=0.1,
                            temperature=1.0)
    policy, tokenizer = _policy(BUNDLED_TINY_LLAMA, settings, adapter_dir=None, full_parameters=False)
    generation = _two_completions(tokenizer)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=settings.learning_rate)
    kls = []
    for _ in range(3):
        with torch.no_grad(), policy.disable_adapter():  # the reference: the base model, adapter off
            generation.ref_logps = _logps(policy, generation, 1.0)
        kls.append(_update(policy, generation, settings, TorchGRPOArgs(), False, torch.device("cpu"))["kl"])
        optimizer.step()
        optimizer.zero_grad()
        generation.ref_logps = None
    assert kls[0] == pytest.approx(0.0, abs=1e-9)  # a fresh adapter is the base model
    assert kls[2] > kls[1] > 0.0


@pytest.mark.integration
def test_a_run_trains_the_adapter_logs_the_metrics_and_resumes_after_an_interruption(questions, retriever,
                                                                                     tmp_path):
    settings = GRPOSettings(max_steps=3, **SETTINGS)
    rollouts = AgentRollouts(questions, retriever, PositionScorer(), AGENT, seed=0, batch_size=4)

    class Interrupt:
        def on_log(self, args, state, control, logs=None):
            pass

        def on_step_end(self, args, state, control):
            if state.global_step == 2:
                raise KeyboardInterrupt("stopped after step 2")

    with pytest.raises(KeyboardInterrupt):
        train_torch_grpo(BUNDLED_TINY_LLAMA, questions, rollouts, tmp_path, settings, callbacks=[Interrupt()])
    # stopped in step 2's end, before its checkpoint (transformers' order)
    assert sorted(path.name for path in (tmp_path / "checkpoints").iterdir()) == ["checkpoint-1"]
    assert not (tmp_path / COMPLETED_MARKER).exists()
    logged: list[int] = []

    class Steps:
        def on_log(self, args, state, control, logs=None):
            logged.append(state.global_step)

        def on_step_end(self, args, state, control):
            pass

    adapter, history = train_torch_grpo(BUNDLED_TINY_LLAMA, questions, rollouts, tmp_path, settings,
                                        callbacks=[Steps()])
    assert logged == [2, 3]  # resumed after step 1
    assert [entry["step"] for entry in history] == [1, 2, 3]
    assert {"loss", "reward", "rewards/outcome/mean", "agent/format_rate", "learning_rate", "grad_norm",
            "clip_ratio"} <= set(history[0])
    assert history[0]["reward"] == 0.5 and history[0]["frac_reward_zero_std"] == 0.0
    assert (tmp_path / COMPLETED_MARKER).is_file()
    trained = load_file(adapter / "adapter_model.safetensors")
    assert any(name.endswith("lora_B.weight") and value.abs().sum() > 0 for name, value in trained.items())
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]


def test_the_backend_refuses_what_it_cannot_do(questions, retriever, tmp_path):
    backend = trainer_backend("torch")
    local = backend.rollouts(questions, retriever, PositionScorer(), AGENT)
    with pytest.raises(ValueError, match=r"whole groups of rl\.trainer\.num_generations"):
        backend.train(BUNDLED_TINY_LLAMA, questions, local, tmp_path,
                      GRPOSettings(per_device_train_batch_size=3, num_generations=2), args={}, adapter_dir=None,
                      full_parameters=False, callbacks=[])
    served = backend.rollouts(questions, retriever, PositionScorer(), AGENT,
                              policy_server=PolicyServer(base_url="http://127.0.0.1:9", model="policy"))
    with pytest.raises(ValueError, match=r"rl\.policy_server needs rl\.backend\.name: trl"):
        backend.train(BUNDLED_TINY_LLAMA, questions, served, tmp_path, GRPOSettings(), args={}, adapter_dir=None,
                      full_parameters=False, callbacks=[])
    with pytest.raises(ValueError, match=r"rl.backend.args.num_iterations"):
        backend.check_args({"num_iterations": 0}, "rl.backend.args")


@pytest.mark.integration
def test_activation_checkpointing_is_switched_on_by_its_current_name(questions, retriever, tmp_path):
    settings = GRPOSettings(max_steps=1, gradient_checkpointing=True, **SETTINGS)
    rollouts = AgentRollouts(questions, retriever, PositionScorer(), AGENT, seed=0, batch_size=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, history = train_torch_grpo(BUNDLED_TINY_LLAMA, questions, rollouts, tmp_path, settings)
    assert [entry["step"] for entry in history] == [1]
    assert not [str(w.message) for w in caught if "checkpointing" in str(w.message) and "deprecated" in str(w.message)]
