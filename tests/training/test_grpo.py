"""GRPO with TRL over the rollout engine: the rollout function's ids and masks, training with agent metrics in the
logs and MLflow, DAPO's dynamic sampling, and a run killed with SIGKILL that resumes from its last checkpoint."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import mlflow
import pytest
import torch
from trl.import_utils import is_vllm_available

from prorag.judges import ReferenceJudge
from prorag.llm.registry import BUNDLED_TINY_LLAMA
from prorag.llm.transformers_backend import TransformersGenerator
from prorag.rewards import hierarchical_reward
from prorag.rewards.diagnostics import grpo_advantages, process_shaped_groups, process_signal
from prorag.rewards.hiprag import OptimalCount
from prorag.rewards.registry import build_reward
from prorag.rewards.scoring import RolloutScorer, ScoredBatch, batch_stats
from prorag.serving import create_app, serve_in_thread
from prorag.specs import AgentSpec
from prorag.tracking.callbacks import MlflowStepMetrics
from prorag.training.config import GRPOSettings
from prorag.training.probe import probe_groups
from prorag.training.trl_grpo import (
    COMPLETED_MARKER,
    AgentRolloutFunction,
    PolicyServer,
    build_grpo_trainer,
    grpo_dataset,
    train_grpo_lora,
)

ROOT = Path(__file__).resolve().parents[2]


def hiprag_scorer(judge) -> RolloutScorer:
    """The HiPRAG reward's scorer with ``judge`` for both detectors."""
    return RolloutScorer(build_reward({"kind": "hiprag"}), over_judge=judge, under_judge=judge)
RAW = ROOT / "data" / "01_raw"
TINY_AGENT = {"step_budget": 1, "max_new_tokens_per_turn": 8, "max_total_new_tokens": 16, "few_shot": False}
TINY_TRAINER = {"per_device_train_batch_size": 4, "num_generations": 2, "learning_rate": 1e-3}
AGENT = AgentSpec(**TINY_AGENT)


def _settings(**overrides: object) -> GRPOSettings:
    return GRPOSettings(**{**TINY_TRAINER, **overrides})

SCRIPT = textwrap.dedent("""
    import itertools, json, os, signal, sys
    from pathlib import Path
    from transformers import TrainerCallback
    from prorag.data.records import Passage, load_questions
    from prorag.judges import ReferenceJudge
    from prorag.llm.registry import BUNDLED_TINY_LLAMA
    from prorag.retrieval.bm25 import BM25Retriever
    from prorag.retrieval.store import PassageStore
    from prorag.specs import AgentSpec
    from prorag.training.config import GRPOSettings
    from prorag.training.trl_grpo import AgentRolloutFunction, train_grpo_lora
    from prorag.rewards.registry import build_reward
    from prorag.rewards.scoring import RolloutScorer

    raw, out, kill_at = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])

    class KillAfterSave(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            with (out / "trained_steps.jsonl").open("a") as handle:
                handle.write(json.dumps({"pid": os.getpid(), "step": state.global_step}) + "\\n")

        def on_save(self, args, state, control, **kwargs):
            if state.global_step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    with (raw / "corpus" / "hotpotqa.jsonl").open() as handle:
        passages = [Passage.from_dict(json.loads(line)) for line in itertools.islice(handle, 50)]
    questions = load_questions(raw / "qa" / "hotpotqa.jsonl")[:4]
    retriever = BM25Retriever.build(PassageStore(passages))
    judge = ReferenceJudge(retriever)
    scorer = RolloutScorer(build_reward({"kind": "hiprag"}), over_judge=judge, under_judge=judge)
    function = AgentRolloutFunction(questions, retriever, scorer, AgentSpec(**json.loads(sys.argv[4])), seed=0,
                                    batch_size=4)
    settings = GRPOSettings(max_steps=3, save_steps=1, save_total_limit=None, **json.loads(sys.argv[5]))
    _, history = train_grpo_lora(BUNDLED_TINY_LLAMA, questions, function, out, settings, callbacks=[KillAfterSave()])
    (out / "history.json").write_text(json.dumps(history))
""")


@pytest.fixture(scope="module")
def rollout_function(questions, retriever, one_torch_thread):
    judge = ReferenceJudge(retriever)
    return AgentRolloutFunction(questions, retriever, hiprag_scorer(judge), AGENT,
                                seed=0, batch_size=4)


def test_rollout_function_returns_the_exact_ids_logprobs_and_env_mask(questions, rollout_function, tmp_path):
    trainer = build_grpo_trainer(BUNDLED_TINY_LLAMA, questions, rollout_function, tmp_path, _settings())
    prompts = [question.question for question in questions[:2] for _ in range(2)]
    output = rollout_function(prompts, trainer)

    assert trainer.model.training  # restored after generating in eval mode
    rollouts = rollout_function.last_rollouts
    assert [rollout.question_key for rollout in rollouts] == [q.key for q in questions[:2] for _ in range(2)]
    for index, rollout in enumerate(rollouts):
        completion, mask = output["completion_ids"][index], output["env_mask"][index]
        assert output["prompt_ids"][index] == rollout.prompt_token_ids
        assert completion == rollout.completion_token_ids and mask == rollout.env_mask
        assert len(output["logprobs"][index]) == len(completion)
        inserted = [segment for segment in rollout.segments if not segment.generated]
        assert inserted  # the engine's opening tags at least
        assert sum(mask) == rollout.generated_tokens
        generated_logprobs = [lp for lp, keep in zip(output["logprobs"][index], mask, strict=True) if keep]
        assert all(lp <= 0.0 for lp in generated_logprobs)
    assert set(output) >= {"reward_outcome", "reward_format", "reward_process"}
    assert len(output["reward_outcome"]) == 4
    with pytest.raises(KeyError, match="not one of the rollout function's training questions"):
        rollout_function(["An unknown question?"], trainer)


class CountingGenerator(TransformersGenerator):
    """The served policy, counting the generation calls that reach it."""

    calls = 0

    def generate(self, prompts, params):
        type(self).calls += 1
        return super().generate(prompts, params)


def test_policy_server_rollouts_go_through_the_openai_api(questions, retriever, rollout_function, tmp_path):
    """Server mode's rollout side against the project's own OpenAI-compatible server (TRL's weight sync to a
    vLLM server needs vLLM and a GPU and is TRL's part)."""
    url, stop = serve_in_thread(create_app(CountingGenerator(BUNDLED_TINY_LLAMA, batch_size=4), "policy",
                                           max_tokens_limit=64))
    judge = ReferenceJudge(retriever)
    server = PolicyServer(url.removesuffix("/v1"), "policy", timeout=30.0)
    function = AgentRolloutFunction(questions, retriever, hiprag_scorer(judge), AGENT,
                                    seed=0, batch_size=4, policy_server=server)
    try:
        trainer = build_grpo_trainer(BUNDLED_TINY_LLAMA, questions, rollout_function, tmp_path, _settings())
        output = function([question.question for question in questions[:2] for _ in range(2)], trainer)
    finally:
        stop()
    assert CountingGenerator.calls > 0
    for index, rollout in enumerate(function.last_rollouts):
        assert output["prompt_ids"][index] == rollout.prompt_token_ids
        assert output["completion_ids"][index] == rollout.completion_token_ids
        assert sum(output["env_mask"][index]) == rollout.generated_tokens > 0
        kept = [lp for lp, keep in zip(output["logprobs"][index], output["env_mask"][index], strict=True) if keep]
        assert all(lp <= 0.0 for lp in kept) and any(lp < 0.0 for lp in kept)
    assert len(output["reward_outcome"]) == 4


@pytest.mark.skipif(is_vllm_available(), reason="vllm is installed")
def test_a_policy_server_without_vllm_is_refused_before_training(questions, retriever, tmp_path):
    judge = ReferenceJudge(retriever)
    function = AgentRolloutFunction(questions, retriever, hiprag_scorer(judge), AGENT,
                                    batch_size=4, policy_server=PolicyServer("http://127.0.0.1:8001", "policy"))
    with pytest.raises(ImportError, match=r"http://127.0.0.1:8001.*needs vllm installed"):
        build_grpo_trainer(BUNDLED_TINY_LLAMA, questions, function, tmp_path, _settings())


@pytest.mark.integration
def test_training_logs_agent_metrics_to_mlflow_and_saves_the_adapter(questions, rollout_function, tmp_path,
                                                                    mlflow_uri):
    with mlflow.start_run() as run:
        adapter, history = train_grpo_lora(BUNDLED_TINY_LLAMA, questions, rollout_function, tmp_path,
                                           _settings(max_steps=2, save_steps=1), callbacks=[MlflowStepMetrics("rl")])
    assert (adapter / "adapter_config.json").is_file()
    assert (tmp_path / COMPLETED_MARKER).is_file()
    steps = [entry for entry in history if "loss" in entry]
    assert [entry["step"] for entry in steps] == [1, 2]
    for name in ("reward", "rewards/outcome/mean", "rewards/process/mean", "agent/format_rate", "agent/cem",
                 "agent/retrieval_count", "agent/generated_tokens", "agent/bonus_fired", "agent/process_shaped",
                 "num_tokens"):
        assert name in steps[0], name
    client = mlflow.tracking.MlflowClient()
    curve = client.get_metric_history(run.info.run_id, "rl.agent/format_rate")
    assert [point.step for point in curve] == [1, 2]
    assert [point.step for point in client.get_metric_history(run.info.run_id, "rl.reward")] == [1, 2]


@pytest.mark.integration
def test_the_multistage_stage_switch_shows_in_the_mlflow_step_metrics(questions, retriever, tmp_path, mlflow_uri,
                                                                      one_torch_thread):
    from prorag.retrieval.embedder import load_embedder

    scorer = RolloutScorer(build_reward({"kind": "multistage", "stage_switch_step": 2}),
                           embed=load_embedder("hashing:64").encode_queries)
    function = AgentRolloutFunction(questions, retriever, scorer, AgentSpec(**TINY_AGENT, protocol="multistage"),
                                    seed=0, batch_size=4)
    with mlflow.start_run() as run:
        train_grpo_lora(BUNDLED_TINY_LLAMA, questions, function, tmp_path,
                        _settings(max_steps=3, save_steps=3), callbacks=[MlflowStepMetrics("rl")])
    stages = mlflow.tracking.MlflowClient().get_metric_history(run.info.run_id, "rl.agent/stage")
    # TRL logs after the optimizer step: logged step k trained on the rollouts of global step k - 1
    assert [(point.step, point.value) for point in stages] == [(1, 1.0), (2, 1.0), (3, 2.0)]


def test_dynamic_sampling_drops_groups_whose_rewards_are_equal(questions, rollout_function, tmp_path):
    trainer = build_grpo_trainer(BUNDLED_TINY_LLAMA, questions, rollout_function, tmp_path,
                                 _settings(drop_uniform_groups=True))
    output = {"advantages": torch.tensor([0.7, -0.7, 0.0, 0.0]), "completion_mask": torch.ones(4, 3, dtype=torch.int),
              "tool_mask": torch.tensor([[1, 0, 1]] * 4), "num_items_in_batch": torch.tensor(8)}
    trainer._drop_uniform_groups(output)
    assert output["completion_mask"].tolist() == [[1, 1, 1], [1, 1, 1], [0, 0, 0], [0, 0, 0]]
    assert int(output["num_items_in_batch"]) == 4  # the loss is normalized by the remaining tokens
    assert trainer._metrics["train"]["dapo/dropped_group_fraction"] == [0.5]

    all_uniform = {"advantages": torch.zeros(4), "completion_mask": torch.ones(4, 2, dtype=torch.int),
                   "num_items_in_batch": torch.tensor(8)}
    trainer._drop_uniform_groups(all_uniform)
    assert all_uniform["completion_mask"].sum() == 8  # nothing would remain: kept (its loss is zero anyway)


class KeyedScorer:
    """A scorer whose rewards vary within a group only for one question (the others' groups are uniform)."""

    reward = build_reward({"kind": "search_r1"})
    components = reward.components

    def __init__(self, varied_key: str | None) -> None:
        self.varied_key = varied_key  # None: every group varies

    def score(self, rollouts, policy, step=0):
        totals = [float(position % 2) if self.varied_key in (None, rollout.question_key) else 0.0
                  for position, rollout in enumerate(rollouts)]
        zeros = [0.0] * len(rollouts)
        return ScoredBatch({"outcome": totals, "format": zeros, "process": zeros}, totals,
                           batch_stats(rollouts, None), None, [None] * len(rollouts))


def test_dapo_refill_replaces_uniform_groups_with_newly_drawn_questions(questions, retriever, tmp_path,
                                                                        one_torch_thread):
    function = AgentRolloutFunction(questions, retriever, KeyedScorer(questions[3].key), AGENT, seed=0,
                                    batch_size=4, refill_rounds=2)
    trainer = build_grpo_trainer(BUNDLED_TINY_LLAMA, questions, function, tmp_path, _settings(refill_rounds=2))
    prompts = [questions[0].question] * 2 + [questions[1].question] * 2
    output = function(prompts, trainer)
    keys = [rollout.question_key for rollout in function.last_rollouts]
    assert keys[0] == keys[1] and keys[2] == keys[3]  # whole groups were replaced
    assert questions[3].key in keys and questions[0].key not in keys and questions[1].key not in keys
    varied = keys.index(questions[3].key)
    assert output["reward_outcome"][varied:varied + 2] == [0.0, 1.0]
    assert function.last_refill == {"dapo/uniform_groups_drawn": 2.0, "dapo/refilled_groups": 2.0,
                                    "dapo/refill_rounds": 1.0, "dapo/uniform_groups_left": 1.0}
    assert output["prompt_ids"][varied] == function.last_rollouts[varied].prompt_token_ids
    assert trainer._metrics["train"]["dapo/refilled_groups"] == [2.0]


class FlaggingScorer(KeyedScorer):
    """:class:`KeyedScorer` that also flags, per rollout, a correct answer and an open process-bonus gate: both true
    exactly for the rollouts of the varied question."""

    def score(self, rollouts, policy, step=0):
        base = super().score(rollouts, policy, step)
        flags = [rollout.question_key == self.varied_key for rollout in rollouts]
        stats = batch_stats(rollouts, None, bonus_fired=flags, answer_correct=flags, stage=1)
        return ScoredBatch(base.components, base.totals, stats, None, base.optimal, flags, list(flags), 1)


def test_dapo_refill_statistics_describe_the_refilled_batch(questions, retriever, tmp_path, one_torch_thread):
    function = AgentRolloutFunction(questions, retriever, FlaggingScorer(questions[3].key), AGENT, seed=0,
                                    batch_size=4, refill_rounds=2)
    trainer = build_grpo_trainer(BUNDLED_TINY_LLAMA, questions, function, tmp_path, _settings(refill_rounds=2))
    function([questions[0].question] * 2 + [questions[1].question] * 2, trainer)
    keys = [rollout.question_key for rollout in function.last_rollouts]
    assert keys.count(questions[3].key) == 2  # the drawn batch had no flagged rollout; the refilled one has two
    metrics = trainer._metrics["train"]
    assert metrics["agent/bonus_fired"] == [0.5]
    assert metrics["agent/answer_correct"] == [0.5] and metrics["agent/answer_unknown_rate"] == [0.0]
    assert metrics["agent/stage"] == [1.0]


def test_grpo_dataset_has_the_prompt_column_and_drops_duplicate_texts(questions):
    dataset = grpo_dataset([*questions, questions[0]])
    assert dataset.column_names[:2] == ["prompt", "question_key"]
    assert dataset["prompt"] == [question.question for question in questions]


@pytest.mark.integration
@pytest.mark.slow
def test_a_killed_run_resumes_from_its_last_checkpoint(tmp_path, one_torch_thread):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    arguments = [sys.executable, str(script), str(RAW), str(out)]
    settings = [json.dumps(TINY_AGENT), json.dumps(TINY_TRAINER)]
    killed = subprocess.run([*arguments, "2", *settings], env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    checkpoints = sorted(path.name for path in (out / "checkpoints").glob("checkpoint-*"))
    assert checkpoints == ["checkpoint-1", "checkpoint-2"]
    assert not (out / COMPLETED_MARKER).exists() and not (out / "adapter").exists()

    resumed = subprocess.run([*arguments, "0", *settings], env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    trained = [json.loads(line) for line in (out / "trained_steps.jsonl").read_text().splitlines()]
    pids = dict.fromkeys(entry["pid"] for entry in trained)
    runs = [[entry["step"] for entry in trained if entry["pid"] == pid] for pid in pids]
    assert runs == [[1, 2], [3]]  # the second process trained only the missing step
    history = json.loads((out / "history.json").read_text())
    assert [entry["step"] for entry in history if "loss" in entry] == [1, 2, 3]  # the log continues too
    assert json.loads((out / COMPLETED_MARKER).read_text()) == {"global_step": 3}
    assert (out / "adapter" / "adapter_config.json").is_file()


@pytest.mark.integration
def test_the_policy_is_freed_when_train_grpo_lora_returns(questions, retriever, tmp_path, one_torch_thread):
    """`make train` runs every stage in one process: the GRPO policy (held in reference cycles by TRL's patched
    forward and the trainer) must not stay alive into the trained-policy rollouts, even with the cyclic collector
    idle."""
    import gc
    import weakref

    from transformers import TrainerCallback

    refs: list[weakref.ref] = []

    class Recorder(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            refs.extend(weakref.ref(module) for module in (model, model.get_base_model()))

    function = AgentRolloutFunction(questions, retriever, KeyedScorer(None), AGENT, seed=0, batch_size=4)
    gc.disable()
    try:
        train_grpo_lora(BUNDLED_TINY_LLAMA, questions, function, tmp_path, _settings(max_steps=1, save_steps=1),
                        callbacks=[Recorder()])
        assert len(refs) == 2 and [ref() for ref in refs] == [None, None]
    finally:
        gc.enable()


@pytest.mark.integration
def test_full_parameter_training_from_the_instruct_model_saves_a_loadable_model(questions, retriever, tmp_path,
                                                                                 one_torch_thread):
    from prorag.assembly import build_policy
    from prorag.specs import PolicySpec

    function = AgentRolloutFunction(questions, retriever, KeyedScorer(None), AGENT, seed=0, batch_size=4)
    folder, history = train_grpo_lora(BUNDLED_TINY_LLAMA, questions, function, tmp_path,
                                      _settings(max_steps=1, save_steps=1), full_parameters=True)
    assert (folder / "config.json").is_file() and not (folder / "adapter_config.json").exists()
    policy = PolicySpec(model=BUNDLED_TINY_LLAMA, batch_size=2).with_trained(str(folder))
    assert (policy.model, policy.adapter) == (str(folder), None)
    trained = build_policy(policy)
    base = TransformersGenerator(BUNDLED_TINY_LLAMA, batch_size=2)
    changed = [not torch.equal(a, b) for a, b in zip(trained.model.parameters(), base.model.parameters(), strict=True)]
    assert any(changed)  # weights outside any adapter moved (learning rate 1e-3, one step)
    assert [entry["step"] for entry in history if "loss" in entry] == [1]


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_grpo_advantages_are_trls(scale_rewards):
    rewards = torch.tensor([1.4, 0.2, 0.2, 0.0, 1.0, 1.0, 0.2, 0.2])
    grouped = rewards.view(-1, 4)
    centred = (grouped - grouped.mean(dim=1, keepdim=True)).flatten()
    spread = {"group": grouped.std(dim=1).repeat_interleave(4), "batch": rewards.std().expand(8),
              "none": None}[scale_rewards]
    expected = centred if spread is None else centred / (spread + 1e-4)
    assert grpo_advantages(rewards.tolist(), 4, scale_rewards) == pytest.approx(expected.tolist(), abs=1e-5)


def _scored(rollouts: list[tuple[bool, bool, int, int]], lambda_p: float) -> ScoredBatch:
    """A scored batch of (answer correct, format ok, steps, optimal steps) rollouts under eq. 1."""
    rewards = [hierarchical_reward(a, f, n, k, 0.2, lambda_p) for a, f, n, k in rollouts]
    optimal = [OptimalCount(k, n, n, 0, n - k, 0, 0, "both") for _, _, n, k in rollouts]
    return ScoredBatch({"outcome": [r.outcome for r in rewards], "format": [r.format for r in rewards],
                        "process": [r.process for r in rewards]}, [r.total for r in rewards], {}, None, optimal,
                       [a and f and k > 0 for a, f, _, k in rollouts])


RIGHT, WRONG, BROKEN = (True, True, 1, 1), (True, True, 1, 0), (False, False, 1, 0)
AFFINE = [RIGHT, (False, True, 1, 1), (False, True, 2, 1), RIGHT]  # two reward levels: the term is affine in them
UNEQUAL = [RIGHT, (True, True, 2, 1), (False, True, 1, 1), (False, True, 1, 1)]  # correct, N_corr/N 1 vs 1/2
THREE_LEVELS = [RIGHT, (False, True, 1, 1), BROKEN, BROKEN]  # correct, wrong but well-formed, malformed


@pytest.mark.parametrize("lambda_p", [0.4, 0.0])
def test_process_shaped_counts_the_groups_whose_advantages_the_process_term_changes(lambda_p):
    settings = build_reward({"kind": "hiprag", "lambda_p": lambda_p})  # λp = 0 reports what λp = 0.4 would change
    batch = _scored(AFFINE + UNEQUAL + THREE_LEVELS + [WRONG] * 4, lambda_p)
    assert process_shaped_groups(batch, settings, 4, "group") == (2.0, 4.0)
    assert process_shaped_groups(batch, settings, 4, "none") == (3.0, 4.0)  # unscaled: AFFINE differs too
    assert process_shaped_groups(_scored(AFFINE * 2, lambda_p), settings, 4, "group") == (0.0, 2.0)


def test_process_shaped_leaves_out_unknown_gates_and_other_rewards():
    settings = build_reward({"kind": "hiprag"})
    batch = _scored(UNEQUAL + THREE_LEVELS, 0.4)
    batch.bonus_fired[1] = None  # a gate detection could not decide: that group is not counted
    assert process_shaped_groups(batch, settings, 4, "group") == (1.0, 1.0)
    assert process_shaped_groups(batch, settings, 4, "batch") == (0.0, 0.0)
    assert process_shaped_groups(_scored(UNEQUAL, 0.4), settings, 3, "group") == (0.0, 0.0)  # not whole groups
    no_detection = _scored(UNEQUAL, 0.4)
    no_detection.bonus_fired = None
    assert process_shaped_groups(no_detection, settings, 4, "group") is None
    assert process_shaped_groups(_scored(UNEQUAL, 0.4), build_reward({"kind": "multistage"}), 4,
                                 "group") is None


def _eligible(rollouts: list[tuple[bool, bool, int, int]]) -> list[bool]:
    return [a and f for a, f, _, _ in rollouts]


# the review of issue 44 at G = 8: {1 x3, 0.2 x2, 0 x3}, every correct N_corr/N = 1 (the term re-weights the levels);
# three correct with N_corr/N 1, 1/2, 0 (one answered directly, two searched: the term ranks them)
REWEIGHTED_8 = [RIGHT] * 3 + [(False, True, 1, 1)] * 2 + [BROKEN] * 3
RANKED_8 = [RIGHT, (True, True, 2, 1), (True, True, 1, 0)] + [(False, True, 1, 1)] * 2 + [BROKEN] * 3
RANKED_SEARCHED = [False, True, True, True, True, False, False, False]


@pytest.mark.parametrize("lambda_p", [0.4, 0.0])
def test_process_signal_tells_ratio_shaped_groups_from_reweighted_ones(lambda_p):
    reward = build_reward({"kind": "hiprag", "lambda_p": lambda_p})
    rollouts = REWEIGHTED_8 + RANKED_8
    batch = _scored(rollouts, lambda_p)
    assert process_shaped_groups(batch, reward, 8, "group") == (2.0, 2.0)  # the old gate counts both
    signal = process_signal(batch, reward, 8, "group", eligible=_eligible(rollouts),
                            searched=[True] * 8 + RANKED_SEARCHED)
    assert (signal.groups, signal.ratio_shaped, signal.reweighted) == (2, 1, 1)
    with_term = grpo_advantages(_scored(RANKED_8, 0.4).totals, 8, "group")  # the correct ones ranked by N_corr/N
    without = grpo_advantages(_scored(RANKED_8, 0.0).totals, 8, "group")  # ... and tied without the term
    assert with_term[0] > with_term[1] > with_term[2] and without[0] == pytest.approx(without[2])
    assert signal.gap_groups == 1
    assert signal.gap_with == pytest.approx(with_term[0] - (with_term[1] + with_term[2]) / 2)
    assert signal.gap_with > 0.3 and signal.gap_without == pytest.approx(0.0, abs=1e-3)


def test_process_signal_needs_one_flag_per_rollout_and_a_process_term():
    reward = build_reward({"kind": "hiprag"})
    batch = _scored(RANKED_8, 0.4)
    with pytest.raises(ValueError, match="one entry per rollout"):
        process_signal(batch, reward, 8, "group", eligible=[True], searched=RANKED_SEARCHED)
    no_group_with_both = process_signal(batch, reward, 8, "group", eligible=_eligible(RANKED_8), searched=[True] * 8)
    assert no_group_with_both.ratio_shaped == 1 and no_group_with_both.gap_groups == 0
    assert math.isnan(no_group_with_both.gap_with)
    assert process_signal(batch, build_reward({"kind": "multistage"}), 8, "group", eligible=_eligible(RANKED_8),
                          searched=RANKED_SEARCHED) is None


def test_probe_groups_samples_the_largest_group_once_and_reports_each_size(questions, retriever, one_torch_thread):
    judge = ReferenceJudge(retriever)
    scorer = hiprag_scorer(judge)
    generator = TransformersGenerator(BUNDLED_TINY_LLAMA, batch_size=8)
    rows = probe_groups(questions[:2], generator, retriever, scorer, AGENT, group_sizes=[4, 2], temperature=1.0)
    assert [row["group_size"] for row in rows] == [2.0, 4.0]
    assert [row["rollouts"] for row in rows] == [4.0, 8.0] and all(row["groups"] == 2.0 for row in rows)
    for row in rows:
        assert 0.0 <= row["cem"] <= 1.0 and 0.0 <= row["uniform_groups"] <= 1.0
        assert 0.0 <= row["bonus_fired"] <= 1.0 and 0.0 <= row["process_shaped"] <= 1.0
        assert row["ratio_shaped"] + row["reweighted"] == pytest.approx(row["process_shaped"]) or \
            row["ratio_shaped"] > 0  # a ratio-shaped group's advantages may move by less than the tolerance
        assert 0.0 <= row["no_search_correct"] <= row["cem"] and row["gap_groups"] <= row["groups"]
    with pytest.raises(ValueError, match="group sizes must be >= 2"):
        probe_groups(questions[:1], generator, retriever, scorer, AGENT, group_sizes=[1])
