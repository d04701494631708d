"""Issue 43 item 2: GRPO rollouts over several policy servers (data-parallel replicas, one per GPU). Each batch's
groups are spread over the servers, a group and its trajectories' turns stay on one, every group holds G distinct
rollouts, and a server that is down is named before any rollout."""

from __future__ import annotations

import itertools
import sys

import pytest

from prorag.judges import ReferenceJudge
from prorag.llm.registry import BUNDLED_TINY_LLAMA, load_tokenizer
from prorag.llm.replicas import ReplicatedGenerator, ServerDownError, shares
from prorag.llm.server_process import free_port, start_server
from prorag.llm.transformers_backend import TransformersGenerator
from prorag.rewards.registry import build_reward
from prorag.rewards.scoring import RolloutScorer
from prorag.scale.placement import PlacementError, check_placement, replica_count
from prorag.serving import create_app, serve_in_thread
from prorag.specs import AgentSpec
from prorag.training.grpo import AgentRollouts, PolicyServer
from prorag.training.trl_private import ReplicaWeightSync

from .conftest import ROOT, Captured, capturing, gpu_parameters, preflight, preset_params

RAW = ROOT / "data" / "01_raw"
AGENT = AgentSpec(step_budget=1, max_new_tokens_per_turn=6, max_total_new_tokens=12, few_shot=False)
GROUP = 3


def _rollouts(questions, retriever, roots: list[str]) -> AgentRollouts:
    judge = ReferenceJudge(retriever)
    scorer = RolloutScorer(build_reward({"kind": "hiprag"}), over_judge=judge, under_judge=judge)
    return AgentRollouts(questions, retriever, scorer, AGENT, temperature=1.0, seed=0, batch_size=4,
                         policy_server=PolicyServer(roots, "policy", timeout=60.0, max_retries=0))


def _roll_out(function: AgentRollouts, questions, *, rank: int = 0):
    prompts = [question.question for question in questions for _ in range(GROUP)]
    with function.server_generator(load_tokenizer(BUNDLED_TINY_LLAMA)) as generator:
        batch = function.roll_out(prompts, generator, step=0, rank=rank, group_size=GROUP, scale_rewards="group")
    return generator, batch


def _check_groups(batch, questions) -> None:
    """Question-major, whole groups of G rollouts, each group's G completions distinct (no collapse)."""
    assert [rollout.question_key for rollout in batch.rollouts] == [q.key for q in questions for _ in range(GROUP)]
    for start in range(0, len(batch.rollouts), GROUP):
        group = batch.rollouts[start:start + GROUP]
        assert len({tuple(rollout.completion_token_ids) for rollout in group}) == GROUP, start


def test_shares_are_contiguous_balanced_and_offset_moves_the_remainder():
    assert shares(10, 3) == [range(0, 4), range(4, 7), range(7, 10)]
    assert shares(10, 3, offset=1) == [range(0, 3), range(3, 7), range(7, 10)]
    assert shares(1, 2, offset=1) == [range(0, 0), range(0, 1)]
    for count, parts, offset in itertools.product(range(9), range(1, 5), range(4)):
        cut = shares(count, parts, offset=offset)
        assert [i for part in cut for i in part] == list(range(count))
        assert max(map(len, cut)) - min(map(len, cut)) <= 1


@pytest.mark.integration
def test_each_group_and_its_turns_stay_on_one_replica(questions, retriever, one_torch_thread):
    """Two servers on loopback, every request captured: each server gets two of the four groups, all of a group's
    turns, and each request's prompt starts with one of that server's questions' prompts."""
    served = []
    try:
        for _ in range(2):
            captured = Captured()
            url, stop = serve_in_thread(capturing(create_app(TransformersGenerator(BUNDLED_TINY_LLAMA, batch_size=4),
                                                             "policy", max_tokens_limit=64), captured))
            served.append((url.removesuffix("/v1"), stop, captured))
        function = _rollouts(questions, retriever, [root for root, _, _ in served])
        generator, batch = _roll_out(function, questions)
    finally:
        for _, stop, _ in served:
            stop()
    assert isinstance(generator, ReplicatedGenerator) and len(generator.replicas) == 2
    _check_groups(batch, questions)
    for index, (_, _, captured) in enumerate(served):
        turns = [body for body in captured.of("/v1/completions") if body.get("logprobs")]  # not the re-asks
        mine = batch.rollouts[index * 2 * GROUP:(index + 1) * 2 * GROUP]  # shares(4 groups, 2): 2 groups each
        theirs = [r for r in batch.rollouts if r not in mine]
        assert turns
        for body in turns:
            assert any(body["prompt"][:len(r.prompt_token_ids)] == list(r.prompt_token_ids) for r in mine)
            assert not any(body["prompt"][:len(r.prompt_token_ids)] == list(r.prompt_token_ids) for r in theirs)


@pytest.mark.integration
def test_a_replica_that_is_down_is_named_before_any_rollout(questions, retriever):
    url, stop = serve_in_thread(create_app(TransformersGenerator(BUNDLED_TINY_LLAMA, batch_size=4), "policy",
                                           max_tokens_limit=64))
    down = f"http://127.0.0.1:{free_port()}"
    try:
        function = _rollouts(questions, retriever, [url.removesuffix("/v1"), down])
        with pytest.raises(ServerDownError, match=rf"the policy server at {down} is down"):
            _roll_out(function, questions)
        function = _rollouts(questions, retriever, [url.removesuffix("/v1")])
        wrong = PolicyServer([url.removesuffix("/v1")], "another-name")
        function.policy_server = wrong
        with pytest.raises(ServerDownError, match=r"serves \['policy'\], not 'another-name'"):
            _roll_out(function, questions)
    finally:
        stop()


def test_a_policy_server_list_must_name_distinct_servers():
    with pytest.raises(ValueError, match="listed twice"):
        PolicyServer(["http://127.0.0.1:8001", "http://127.0.0.1:8001/"], "policy")
    with pytest.raises(ValueError, match="at least one"):
        PolicyServer([], "policy")
    assert PolicyServer(["http://h:1/", "http://h:2"], "p").openai_urls == ("http://h:1/v1", "http://h:2/v1")


@pytest.mark.integration
def test_two_prorag_serve_processes_both_roll_out_and_groups_stay_whole(questions, retriever, tmp_path,
                                                                        one_torch_thread):
    """Two real ``prorag serve`` processes (the tiny Llama) on loopback: both answer rollout requests (their access
    logs), and the batch comes back question-major in whole groups of G distinct rollouts."""
    servers, roots = [], []
    try:
        for index in range(2):
            port = free_port()
            roots.append(f"http://127.0.0.1:{port}")
            command = [sys.executable, "-m", "prorag.serving", "--model", BUNDLED_TINY_LLAMA, "--served-model-name",
                       "policy", "--host", "127.0.0.1", "--port", str(port), "--torch-threads", "1",
                       "--max-tokens-limit", "64"]
            servers.append(start_server(command, roots[-1] + "/v1", tmp_path / f"serve{index}.log",
                                        served_name="policy", startup_timeout=120))
        _, batch = _roll_out(_rollouts(questions, retriever, roots), questions, rank=1)
        logs = [(tmp_path / f"serve{index}.log").read_text() for index in range(2)]
    finally:
        for server in servers:
            server.stop()
    _check_groups(batch, questions)
    for log in logs:
        assert log.count("POST /v1/completions") >= 2 * GROUP  # its two groups' first turns at least


class Generation:
    """TRL's ``VLLMGeneration`` as :class:`ReplicaWeightSync` drives it: which client each sync pushed to."""

    def __init__(self, client: str | None) -> None:
        if client is not None:
            self.vllm_client = client
        self.pushed: list[str | None] = []
        self.max_completion_length = 16

    def sync_weights(self) -> None:
        self.pushed.append(getattr(self, "vllm_client", None))


def test_weights_go_to_every_replica_and_every_rank_walks_them_as_often():
    """The main process pushes once per replica, each through that replica's client, and keeps TRL's own client
    afterwards; another rank (no clients) walks the parameters as many times, so ZeRO-3's gathers pair up. (The NCCL
    transfer itself needs vLLM and two GPUs.)"""
    main = Generation("client-0")
    sync = ReplicaWeightSync(main, 3, ["client-0", "client-1", "client-2"])
    sync.sync_weights()
    sync.sync_weights()
    assert main.pushed == ["client-0", "client-1", "client-2"] * 2
    assert main.vllm_client == "client-0" and sync.max_completion_length == 16
    other = Generation(None)
    ReplicaWeightSync(other, 3).sync_weights()
    assert other.pushed == [None] * 3
    with pytest.raises(ValueError, match="2 vLLM clients for 3 replicas"):
        ReplicaWeightSync(main, 3, ["a", "b"])


def test_conf_gpu_rolls_out_on_three_replicas_the_preflight_admits(eight_gpus):
    parameters = gpu_parameters()
    found = preflight(parameters)
    assert replica_count(parameters) == 3
    roots = parameters["rl"]["policy_server"]["base_url"]
    ports = {int(root.rsplit(":", 1)[1]) for root in roots}
    served = {server.port: server for server in found.placement.active().values()}
    assert ports <= set(served) and all(served[port].model == parameters["policy"]["model"] for port in ports)
    assert len({served[port].gpus[0] for port in ports} | {found.placement.trainer_gpu}) == 4  # 3 replicas + trainer


def test_the_8_gpu_preset_puts_every_gpu_on_rl_and_keeps_the_batch(eight_gpus):
    """experiments/hiprag_rl_8gpu.yml: 3 vLLM replicas (GPUs 1-3) + 4 ZeRO-3 ranks (4-7), GPU 0 the evaluation
    server; the trained model's server takes GPU 4 after training; 4 x 160 x 4 ranks = 2,560 completions a step."""
    parameters = gpu_parameters(preset_params("hiprag_rl_8gpu.yml"))
    found = preflight(parameters)
    rl = next(estimate for estimate in found.trainers if estimate.stage == "rl")
    assert rl.total < 0.92 * found.placement.gpu_memory_gib
    launch, trainer = parameters["launch"], parameters["rl"]["trainer"]
    assert launch["config"] == "zero3" and launch["processes_per_machine"] == len(launch["gpu_ids"]) == 4
    assert (trainer["per_device_train_batch_size"] * trainer["gradient_accumulation_steps"]
            * launch["processes_per_machine"]) == 512 * 5
    during = found.placement.claim_gpus([*found.placement.server_gpus(during_training=True),
                                         ("launch", launch["gpu_ids"])])
    assert sorted(during) == list(range(8))
    assert replica_count(parameters) == 3


def test_each_url_of_a_server_list_is_checked_and_each_replica_gets_an_nccl_port():
    parameters = gpu_parameters()
    parameters["rl"]["policy_server"]["base_url"] = [*parameters["rl"]["policy_server"]["base_url"],
                                                     "http://127.0.0.1:8009"]
    with pytest.raises(PlacementError, match=r"rl\.policy_server\.base_url\[3\] = http://127.0.0.1:8009: no server"):
        check_placement(parameters)
    parameters = gpu_parameters()
    parameters["placement"]["nccl_port"] = 8005  # replica 1's weight transfer on 8006, rl_policy_2's port
    with pytest.raises(PlacementError, match=r"nccl_port \+ 1 = 8006 .* servers\.rl_policy_2's port"):
        check_placement(parameters)


def test_a_server_started_after_training_may_take_a_trainer_gpu_never_a_server_s(eight_gpus):
    parameters = gpu_parameters(preset_params("hiprag_rl_8gpu.yml"))
    parameters["placement"]["servers"]["trained_policy"]["after_training"] = False
    with pytest.raises(PlacementError, match=r"GPU 4 is used by both servers\.trained_policy\.gpus and launch"):
        preflight(parameters)
    parameters = gpu_parameters(preset_params("hiprag_rl_8gpu.yml"))
    parameters["placement"]["servers"]["trained_policy"]["gpus"] = [1]
    with pytest.raises(PlacementError, match=r"GPU 1 is used by both servers\.rl_policy\.gpus and servers\.trained"):
        preflight(parameters)
