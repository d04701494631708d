"""Issue 43 N5: the shipped multi-node SLURM template runs the `--env gpu` preflight on its own settings before any
step (a dry run here: bash runs the template itself), with every server described by its URL, and the scheduler,
not Kedro, starts the training (``launch.mode: external``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prorag.scale.placement import PlacementError

from .conftest import ROOT, gpu_parameters, preflight

TEMPLATE = ROOT / "deploy" / "slurm" / "train_multinode.sbatch"


def _dry_run(**env: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    variables = {**os.environ, "PATH": path, "DRY_RUN": "1", "PRORAG_ROOT": str(ROOT), "SLURM_JOB_NUM_NODES": "2",
                 "MASTER_ADDR": "node-0", "SERVICES_HOST": "services-0", "SLURM_JOB_ID": "42",
                 "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
                 **env}
    return subprocess.run(["bash", str(TEMPLATE), "rl"], capture_output=True, text=True, env=variables, timeout=300,
                          cwd=ROOT)


@pytest.mark.integration
def test_the_multinode_template_passes_the_gpu_preflight():
    done = _dry_run()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "preflight passed" in done.stdout
    assert "rl: about" in done.stdout  # the memory plan per rank of 16 ZeRO-3 ranks
    params = done.stdout.split("dry run: --params ", 1)[1].strip()
    assert "launch.mode=external" in params and "launch.gpu_ids=0 1 2 3 4 5 6 7" in params
    assert "rl.policy_server.base_url=http://services-0:8001" in params and "127.0.0.1" not in params


def test_the_template_s_settings_without_its_servers_elsewhere_are_refused(eight_gpus):
    """What the template ran before (8 ranks per node, the servers of conf/gpu on the same node) cannot pass."""
    launch = {"mode": "external", "num_machines": 2, "processes_per_machine": 8, "config": "zero3",
              "main_process_port": 29500, "gpu_ids": "0 1 2 3 4 5 6 7"}
    with pytest.raises(PlacementError, match=r"GPU 0 is used by both servers\.policy\.gpus and launch\.gpu_ids"):
        preflight(gpu_parameters({"launch": launch}))
    with pytest.raises(PlacementError, match=r"launch\.gpu_ids is unset.*8 training processes"):
        preflight(gpu_parameters({"launch": {**launch, "gpu_ids": None}}))


def test_a_missing_services_host_is_named():
    done = _dry_run(SERVICES_HOST="")
    assert done.returncode != 0 and "SERVICES_HOST" in done.stderr
