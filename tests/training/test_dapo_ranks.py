"""DAPO's uniform-group filter on real gloo ranks whose groups differ (issue 43 N3): every rank joins the recount's
collective, so a rank with nothing to drop no longer leaves the others waiting in it."""

from __future__ import annotations

import datetime
import os
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from prorag.llm.server_process import free_port
from prorag.training.trl_grpo import AgentGRPOTrainer

# rank 0: one informative group and one uniform group; rank 1: only uniform groups; rank 2: not whole groups
ADVANTAGES = [[0.7, -0.7, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.5, -0.5, 0.0]]


class _Gloo:
    """What the filter uses of ``accelerate.Accelerator``: ``gather`` (concatenating every rank's tensor)."""

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        parts = [torch.zeros_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, tensor)
        return torch.stack(parts)


class _Trainer:
    num_generations = 2
    accelerator = _Gloo()

    def log_metric(self, name: str, value: float, *, mode: str | None = None) -> None:
        pass


def _rank(rank: int, world: int, port: int, results: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=20))
    advantages = torch.tensor(ADVANTAGES[rank])
    output = {"advantages": advantages, "completion_mask": torch.ones(len(advantages), 3, dtype=torch.int)}
    try:
        AgentGRPOTrainer._drop_uniform_groups(_Trainer(), output)  # type: ignore[arg-type]
        results[rank] = (int(output["num_items_in_batch"]), output["completion_mask"].sum(dim=1).tolist())
    except Exception as error:
        results[rank] = repr(error)
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 3])
def test_ranks_with_different_groups_all_join_the_recount(world):
    """Before the fix rank 1 (all uniform) and rank 2 (not whole groups) returned early while rank 0 gathered:
    rank 0 timed out after 20 s."""
    context = mp.get_context("fork")  # the ranks run this module's function (spawn would re-import the test file)
    results = context.Manager().dict()
    port = free_port()
    ranks = [context.Process(target=_rank, args=(rank, world, port, results)) for rank in range(world)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=120)
        assert process.exitcode == 0
    kept = [[3, 3, 0, 0], [3, 3, 3, 3], [3, 3, 3]][:world]
    total = sum(sum(rows) for rows in kept)
    assert dict(results) == {rank: (total, kept[rank]) for rank in range(world)}
