"""The GPU preflight under ``launch.mode: accelerate``: the run is not narrowed to the in-process trainer's GPU, the
launch's GPUs are checked against the servers', memory is planned per rank with the launch's sharding; and an
embedding worker on ``cuda:k`` gets the node's GPU k even after the run narrowed itself to its trainer's GPU."""

from __future__ import annotations

import os

import pytest

from prorag.gpus import NODE_GPUS_ENV, node_gpus, pin_child_to
from prorag.scale.memory import MemoryPlanError, Sharding
from prorag.scale.placement import PlacementError
from prorag.scale.preflight import launch_sharding

from .conftest import gpu_parameters, preflight

FREE = [2, 6, 7]  # conf/gpu's GPUs no server holds once its RL replicas on 6 and 7 are given back
ONE_REPLICA = {"rl": {"policy_server": {"base_url": "http://127.0.0.1:8001"}},
               "placement": {"servers": {"rl_policy_2": None, "rl_policy_3": None}}}


def launched(**launch) -> dict:
    return gpu_parameters({**ONE_REPLICA, "launch": {"mode": "accelerate", **launch}})


def test_a_launch_leaves_the_run_seeing_every_gpu(eight_gpus):
    found = preflight(launched(processes_per_machine=3, config="zero2", gpu_ids=FREE))
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert found.trainers and all(estimate.total < 79 for estimate in found.trainers)


def test_the_in_process_trainer_still_narrows_the_run_and_remembers_the_node(eight_gpus):
    preflight(gpu_parameters())
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"
    assert os.environ[NODE_GPUS_ENV] == "all" and node_gpus() is None


@pytest.mark.parametrize(("launch", "message"), [
    ({"processes_per_machine": 3}, r"launch\.gpu_ids is unset.*\[0, 1, 3, 4, 5\].*free GPUs \[2, 6, 7\]"),
    ({"processes_per_machine": 2, "gpu_ids": [2, 3]},
     r"GPU 3 is used by both servers\.trained_policy\.gpus and launch\.gpu_ids"),
    ({"processes_per_machine": 2, "gpu_ids": [2, 9]}, r"launch\.gpu_ids: GPU 9 does not exist"),
    ({"processes_per_machine": 3, "gpu_ids": [2, 6]}, r"names 2 GPU\(s\) for launch\.processes_per_machine 3"),
])
def test_a_launch_on_the_servers_gpus_is_refused(eight_gpus, launch, message):
    with pytest.raises(PlacementError, match=message):
        preflight(launched(**launch))


@pytest.mark.parametrize(("config", "stage"), [("ddp", 0), ("zero2", 2), ("zero3", 3), ("fsdp2", 3)])
def test_the_sharding_is_read_from_the_accelerate_config(config, stage):
    assert launch_sharding(launched(processes_per_machine=3, config=config, gpu_ids=FREE)) == Sharding(3, stage)
    assert launch_sharding(gpu_parameters()) is None


def test_zero3_fits_the_7b_full_parameter_model_one_process_cannot(eight_gpus):
    """18 B per parameter (fp32 states and a bf16 reference, beta > 0) of 7.6B parameters: ~128 GiB on one GPU,
    ~43 GiB on each of 3 ZeRO-3 ranks."""
    seven_b = {**ONE_REPLICA, "policy": {"model": "Qwen/Qwen2.5-7B-Instruct"}}
    with pytest.raises(MemoryPlanError, match=r"rl needs about \d+ GiB on one GPU"):
        preflight(gpu_parameters(seven_b))
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    launch = {"mode": "accelerate", "processes_per_machine": 3, "config": "zero3", "gpu_ids": FREE}
    found = preflight(gpu_parameters({**seven_b, "launch": launch}))
    rl = next(estimate for estimate in found.trainers if estimate.stage == "rl")
    assert 40 < rl.states < 45
    with pytest.raises(MemoryPlanError, match=r"each of 3 ranks \(stage 2\)"):  # ZeRO-2 keeps fp32 weights per rank
        preflight(gpu_parameters({**seven_b, "launch": {**launch, "config": "zero2"}}))


def test_sharded_bytes_per_parameter():
    assert Sharding().states_bytes(True, False) == 16
    assert Sharding(4, 2).states_bytes(True, False) == 4 + 3
    assert Sharding(4, 3).states_bytes(True, True) == 18 / 4
    assert Sharding(4, 2).states_bytes(False, False) == 2 and Sharding(4, 3).states_bytes(False, False) == 0.5


@pytest.mark.parametrize(("started", "device", "expected"), [
    (None, "cuda:1", "1"), ("4,5,6", "cuda:2", "6"), ("all", "cuda:3", "3"),
])
def test_an_embedding_worker_gets_the_nodes_gpu_after_the_run_narrowed_itself(monkeypatch, started, device,
                                                                                expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")  # the preflight narrowed the run to its trainer's GPU
    if started is None:
        monkeypatch.setenv(NODE_GPUS_ENV, "")
        monkeypatch.delenv(NODE_GPUS_ENV)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES")  # never narrowed: cuda:k is GPU k
    else:
        monkeypatch.setenv(NODE_GPUS_ENV, started)
    assert pin_child_to(device) == "cuda:0"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == expected
    assert pin_child_to("cpu") == "cpu"


def test_an_embedding_device_the_run_was_not_started_with_is_refused(monkeypatch):
    monkeypatch.setenv(NODE_GPUS_ENV, "4,5")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4")
    with pytest.raises(ValueError, match=r"cuda:2: the run was started seeing 2 GPU"):
        pin_child_to("cuda:2")
