"""Generation under FSDP2 gathers the full parameters once (:func:`prorag.training.trl_grpo.fsdp2_full_parameters`):
2 gloo processes on CPU (``torch.distributed.run``; accelerate runs its ``fsdp2`` config as DDP on CPU, so the
worker wraps the model with ``fully_shard`` itself), ranks generating different numbers of turns, then training."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("fsdp2_generation_worker.py")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.integration
@pytest.mark.distributed
def test_ranks_generate_different_turns_under_fsdp2_without_a_collective_then_train(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    completed = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                                "--master_port", str(_free_port()), str(WORKER), str(tmp_path)],
                               env=env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-6000:]
    reports = [json.loads((tmp_path / f"rank_{rank}.json").read_text()) for rank in (0, 1)]
    for rank, report in enumerate(reports):
        for generation in report["rounds"]:
            assert generation["calls"] == 1 + 2 * rank
            assert generation["gathers"] == 0  # no collective while generating
            assert generation["unshard_gathers"] == 3  # one all-gather per FSDP module (2 layers + root), up front
            assert generation["sharded_after"]  # resharded on exit
            assert generation["training_gathers"] > 0  # the counter sees FSDP's per-pass gathers when they happen
    assert reports[0]["rounds"][0]["forwards"] <= 2 < 3 <= reports[1]["rounds"][0]["forwards"]  # passes differ
    losses = [[generation["loss"] for generation in report["rounds"]] for report in reports]
    assert losses[0] == losses[1]  # the ranks stayed in step: the same collectives, the same update
    assert losses[0][1] < losses[0][0]  # and the step trained the sharded LoRA parameters
