"""Issue 43 item 2: before a GRPO run the preflight prints a step-time estimate (rollouts from stated per-token
costs and the replica count, judging, training) and the rollout concurrency it sizes for the batch."""

from __future__ import annotations

import copy
import logging

import pytest

from prorag.scale.memory import GIB, MODELS
from prorag.scale.step_time import RolloutShape, StatedCosts, describe, estimate_step

from .conftest import gpu_parameters, preflight, preset_params

COSTS = StatedCosts(hbm_bandwidth=1e12, decode_efficiency=0.5, peak_flops=1e15, mfu=0.5, generated_share=0.25,
                    padding=1.0, forward_equivalents=6, judge_latency_s=2.0, sync_bandwidth=1e10)
SHAPE = RolloutShape(parameters=1e9, kv_bytes_per_token=1e5, completions=100, replicas=2, ranks=1,
                     concurrency_per_rank=20, step_budget=1, top_k=1, max_new_tokens_per_turn=10,
                     max_total_new_tokens=400, prompt_tokens=100, passage_tokens=100,
                     server_memory_gib=(2e9 + 30 * 600 * 1e5) / GIB, judges=(("judge", 0.5, 600, 10),))


def test_the_estimate_is_the_hand_computation():
    """By hand: 2e9 B of weights; a full rollout is 100 + 100 + 400 = 600 tokens = 6e7 B of KV, so the KV cache
    holds 30; a replica's share is 50, sent 20 at a time: 20 decode at once. Mean context 100 + 100/2 + 100/2 = 200
    (100 generated = 0.25 x 400). A decode step reads 2e9 + 20 x 200 x 1e5 = 2.4e9 B at 5e11 B/s: 4.8 ms. Two
    turns of max(50 / 20 x 100 / 2, 10) = 125 steps: 1.2 s; prefill 50 x 200 tokens x 2e9 FLOP at 5e14: 0.04 s.
    Judging: 100 x 0.5 calls at min(600/min, 10 / 2 s) = 5/s: 10 s. Training: 100 x 300 tokens x 6 x 2e9 FLOP at
    5e14: 0.72 s. Sync: 2 replicas x 2e9 B at 1e10 B/s: 0.4 s."""
    step = estimate_step(SHAPE, COSTS)
    assert step.kv_sequences == 30 and step.concurrency == 20 and step.sized == 30
    assert step.detail["decode_step_s"] == pytest.approx(4.8e-3)
    assert step.detail["steps_per_turn"] == pytest.approx(125)
    assert step.rollouts == pytest.approx(1.2 + 0.04)
    assert step.judging == pytest.approx(10.0)
    assert step.training == pytest.approx(0.72)
    assert step.sync == pytest.approx(0.4)
    assert step.total == pytest.approx(12.36)
    assert "12.36" not in describe(step, SHAPE) and "0.2 min per step" in describe(step, SHAPE)


def test_more_replicas_and_ranks_shorten_what_they_share_and_lock_step_bounds_a_turn():
    one = estimate_step(SHAPE, COSTS)
    four = estimate_step(RolloutShape(**{**SHAPE.__dict__, "replicas": 4}), COSTS)
    assert four.detail["decode"] < one.detail["decode"] and four.training == one.training
    ranks = estimate_step(RolloutShape(**{**SHAPE.__dict__, "ranks": 2}), COSTS)
    assert ranks.training == pytest.approx(one.training / 2) and ranks.judging == pytest.approx(one.judging / 2)
    alone = estimate_step(RolloutShape(**{**SHAPE.__dict__, "completions": 2, "max_new_tokens_per_turn": 300}), COSTS)
    assert alone.detail["steps_per_turn"] == 300  # a turn lasts as long as its longest completion may


def test_the_qwen_kv_cache_per_token_is_its_grouped_query_width():
    assert MODELS["Qwen/Qwen2.5-3B-Instruct"].kv_bytes_per_token == 2 * 36 * 2 * 128 * 2  # 36,864 B


def test_the_preflight_prints_conf_gpu_s_step_time_and_its_concurrency_fits_the_kv_cache(eight_gpus, caplog):
    parameters = gpu_parameters()
    with caplog.at_level(logging.INFO, logger="prorag.scale.preflight"):
        found = preflight(parameters)
    shape, step = found.step_times["rl"]
    assert shape.replicas == 3 and shape.completions == 2560 and shape.ranks == 1
    assert step.sized == parameters["rl"]["generation_batch_size"]  # conf/gpu is sized by it
    assert step.training > step.rollouts  # one trainer GPU is most of the step
    assert "rl: GRPO step time (stated per-token costs, not measured" in caplog.text
    assert "on 3 vLLM replica(s)" in caplog.text and "days for 400 steps" in caplog.text
    assert "generation_batch_size is" not in caplog.text  # no sizing warning


def test_an_undersized_concurrency_is_named_and_the_8_gpu_preset_is_faster(eight_gpus, caplog):
    parameters = copy.deepcopy(gpu_parameters())
    parameters["rl"]["generation_batch_size"] = 16
    with caplog.at_level(logging.INFO, logger="prorag.scale.preflight"):
        slow = preflight(parameters).step_times["rl"][1]
    assert "rl.generation_batch_size is 16" in caplog.text and "254 would fill its KV cache" in caplog.text
    preset = preflight(gpu_parameters(preset_params("hiprag_rl_8gpu.yml"))).step_times["rl"]
    assert preset[0].ranks == 4 and preset[1].sized == 64
    conf = preflight(gpu_parameters()).step_times["rl"][1]
    assert preset[1].total < conf.total / 2 and slow.rollouts > conf.rollouts
