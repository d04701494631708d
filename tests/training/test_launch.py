"""The launcher (:mod:`prorag.training.launch`): settings and commands, then real 2-process gloo launches on the tiny
random Llama (marker ``distributed``): SFT, DPO and GRPO train with world size 2 and rank 0 reporting; a rank that
raises fails the launch with its own traceback and keeps the checkpoints; ``kill -9`` of the launcher, then the same
launch, resumes from the last checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prorag.training.config import SFTSettings
from prorag.training.launch import (
    FAULT_ENV,
    LaunchError,
    LaunchSettings,
    check_stage,
    launch_command,
    launch_dpo,
    launch_sft,
    srun_command,
)

TINY = "bundled:tiny-random-llama"
EXAMPLES = [{"input_ids": list(range(10 + i, 40 + i)), "labels": [-100] * 10 + list(range(20 + i, 40 + i))}
            for i in range(8)]
PAIRS = [{"prompt": f"Question {i}: what is {i} plus {i}?", "chosen": f" The answer is {2 * i}.",
          "rejected": f" I think it is {2 * i + 1}, maybe."} for i in range(8)]


def _launch(tmp_path: Path, **overrides: object) -> LaunchSettings:
    return LaunchSettings(**{"mode": "accelerate", "processes_per_machine": 2, "root": str(tmp_path / "launches"),
                             "threads_per_process": 1, **overrides})


def _sft(steps: int = 3) -> SFTSettings:
    return SFTSettings(max_steps=steps, per_device_train_batch_size=1, save_steps=1, lora_r=4, lora_alpha=8)


# ------------------------------------------------------------------------------------------ settings and commands


def test_in_process_is_the_default():
    assert not LaunchSettings().enabled


def test_several_machines_need_a_rendezvous():
    with pytest.raises(ValueError, match="main_process_ip"):
        LaunchSettings(mode="accelerate", num_machines=2, main_process_port=29500)
    with pytest.raises(ValueError, match=r"fixed launch\.main_process_port"):
        LaunchSettings(mode="accelerate", num_machines=2, main_process_ip="10.0.0.1")
    with pytest.raises(ValueError, match="neither a shipped accelerate config"):
        LaunchSettings(mode="accelerate", config="zero4")


def test_the_command_is_accelerate_s_own_launcher_with_a_shipped_config(tmp_path):
    settings = LaunchSettings(mode="accelerate", processes_per_machine=8, num_machines=2, machine_rank=1,
                              config="zero3", gpu_ids=[0, 1, 2, 3, 4, 5, 6, 7], main_process_ip="10.0.0.1",
                              main_process_port=29500)
    command = launch_command(settings, tmp_path, mixed_precision="bf16")
    assert command[1:3] == ["-m", "accelerate.commands.launch"]
    options = dict(zip(command[3:-3:2], command[4:-3:2], strict=True))
    assert Path(options["--config_file"]).name == "zero3.yaml" and Path(options["--config_file"]).is_file()
    assert options["--num_processes"] == "16" and options["--num_machines"] == "2"  # accelerate counts all machines
    assert options["--machine_rank"] == "1" and options["--main_process_ip"] == "10.0.0.1"
    assert options["--gpu_ids"] == "0,1,2,3,4,5,6,7" and options["--mixed_precision"] == "bf16"
    assert command[-3:] == ["-m", "prorag.launch_worker", str(tmp_path)]

    srun = srun_command(settings.model_copy(update={"srun": True, "main_process_ip": None}), tmp_path)
    assert srun[:5] == ["srun", "--nodes=2", "--ntasks-per-node=1", "bash", "-c"]
    assert "--machine_rank $SLURM_NODEID" in srun[5] and "--main_process_ip $MASTER_ADDR" in srun[5]


def test_fsdp1_with_in_process_rollouts_and_vllm_colocate_are_refused_fsdp2_is_accepted(tmp_path):
    fsdp2 = LaunchSettings(mode="accelerate", processes_per_machine=2, config="fsdp2")
    check_stage("grpo", fsdp2)  # FSDP2: the rollout gathers the full parameters around generation
    fsdp1_config = tmp_path / "fsdp1.yaml"
    fsdp1_config.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n")
    fsdp1 = fsdp2.model_copy(update={"config": str(fsdp1_config)})
    with pytest.raises(ValueError, match=r"is FSDP1 .*would hang\. Use launch\.config fsdp2 .*zero3 .*vLLM server"):
        check_stage("grpo", fsdp1)
    check_stage("grpo", fsdp1, policy_server=True)  # generation on the vLLM server: fine
    check_stage("sft", fsdp1)
    check_stage("grpo", fsdp2.model_copy(update={"config": "zero3"}))
    with pytest.raises(ValueError, match="colocate mode is not supported"):
        check_stage("grpo", fsdp2, vllm_mode="colocate")


# ------------------------------------------------------------------------------------------ 2 gloo processes


@pytest.mark.integration
@pytest.mark.distributed
def test_sft_trains_on_two_gloo_processes_and_checkpoints(tmp_path):
    result = launch_sft(TINY, EXAMPLES, _sft(), _launch(tmp_path))
    assert (result.world_size, result.backend, result.distributed_type) == (2, "gloo", "MULTI_CPU")
    assert result.global_step == 3 and result.resumed_from is None
    assert (result.adapter / "adapter_model.safetensors").is_file()
    assert [entry["step"] for entry in result.log_history if "loss" in entry] == [1, 2, 3]
    run = result.bundle / "run"
    assert json.loads((run / "COMPLETED").read_text())["global_step"] == 3
    assert sorted(path.name for path in (run / "checkpoints").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    bundle = json.loads((result.bundle / "bundle.json").read_text())
    assert bundle["format"] == 1 and bundle["stage"] == "sft" and bundle["launch"]["processes_per_machine"] == 2


@pytest.mark.integration
@pytest.mark.distributed
def test_a_rank_that_raises_fails_the_launch_with_its_traceback_and_keeps_the_checkpoints(tmp_path, monkeypatch):
    from prorag.training.dpo import DPOTrainingConfig

    config = DPOTrainingConfig(max_steps=3, per_device_train_batch_size=1, gradient_accumulation_steps=1,
                               learning_rate=1e-3, warmup_ratio=0.0, save_steps=1, lora_r=4, lora_alpha=8)
    launch = _launch(tmp_path)
    monkeypatch.setenv(FAULT_ENV, "rank=1,step=2,action=raise")
    with pytest.raises(LaunchError) as failed:
        launch_dpo(TINY, PAIRS, config, launch, metrics_prefix=None)
    assert failed.value.rank == 1
    assert "rank 1 of 2 failed" in str(failed.value)
    assert "RuntimeError: fault injected on rank 1 at step 2" in str(failed.value)
    assert 'launch_worker.py", line' in failed.value.rank_traceback  # the rank's own traceback
    checkpoints = failed.value.bundle / "run" / "checkpoints"
    assert (checkpoints / "checkpoint-1" / "trainer_state.json").is_file()  # saved before the failure: kept

    monkeypatch.delenv(FAULT_ENV)
    result = launch_dpo(TINY, PAIRS, config, launch, metrics_prefix=None)  # the same launch again: resumes
    assert result.bundle == failed.value.bundle
    assert Path(result.resumed_from or "").name == "checkpoint-1"
    # the restored history of step 1, then steps 2 and 3 trained by this attempt: no step is trained twice
    assert [entry["step"] for entry in result.log_history if "loss" in entry] == [1, 2, 3]
    assert result.global_step == 3


LAUNCHER = """
import sys
from prorag.training.config import SFTSettings
from prorag.training.launch import LaunchSettings, launch_sft
examples = {examples!r}
launch = LaunchSettings(mode="accelerate", processes_per_machine=2, root={root!r}, threads_per_process=1)
result = launch_sft({model!r}, examples, SFTSettings(max_steps=4, per_device_train_batch_size=1, save_steps=1,
                                                     lora_r=4, lora_alpha=8), launch)
print("RESUMED_FROM", result.resumed_from, "STEPS", [e["step"] for e in result.log_history if "loss" in e])
"""


def _ranks_of(bundle_root: Path) -> list[int]:
    """Process ids whose command line names the bundle root (the launch's workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(bundle_root) in command and "launch_worker" in command:
                found.append(int(entry.name))
    return found


@pytest.mark.integration
@pytest.mark.distributed
def test_kill_9_of_the_launcher_then_the_same_launch_resumes(tmp_path):
    root = tmp_path / "launches"
    script = LAUNCHER.format(examples=EXAMPLES, root=str(root), model=TINY)
    env = {**os.environ, FAULT_ENV: "rank=0,step=2,action=sleep:120"}  # a window to kill it in, after checkpoint-1
    launcher = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    checkpoint = None
    while time.monotonic() < deadline and checkpoint is None:
        time.sleep(1)
        checkpoint = next(iter(root.glob("sft-*/run/checkpoints/checkpoint-1/trainer_state.json")), None)
    assert checkpoint is not None, "no checkpoint within 4 minutes"
    time.sleep(2)  # rank 0 is asleep at the end of step 2
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 60
    while _ranks_of(root) and time.monotonic() < deadline:
        time.sleep(1)
    assert not _ranks_of(root), "the ranks outlived the killed launcher"
    assert not (checkpoint.parents[2] / "COMPLETED").exists()

    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                               env={key: value for key, value in os.environ.items() if key != FAULT_ENV})
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    line = next(line for line in completed.stdout.splitlines() if line.startswith("RESUMED_FROM"))
    resumed, steps = line.split(" STEPS ")
    assert resumed.endswith("checkpoint-1")
    assert json.loads(steps) == [1, 2, 3, 4]  # step 1 restored from the checkpoint, then the steps continue


# ------------------------------------------------------------------------------------------ GRPO bundle: the index


@pytest.fixture(scope="module")
def saved_index(tmp_path_factory):
    """A small hashing-embedder index saved to a directory (what the catalog's versioned retrieval_index holds)."""
    from prorag.data.records import Passage
    from prorag.retrieval.index import build_retrieval_index

    passages = [Passage(f"p{i}", title, text) for i, (title, text) in enumerate([
        ("Hamlet", "Hamlet is a tragedy written by William Shakespeare."),
        ("Lima", "Lima is the capital of Peru."),
        ("Jupiter", "Jupiter is the largest planet of the Solar System."),
        ("Faust", "Faust is a tragic play by Johann Wolfgang von Goethe.")])]
    index = build_retrieval_index(passages, embedder_spec="hashing:32", show_progress=False)
    return index, index.save(tmp_path_factory.mktemp("index") / "retrieval_index")


def _grpo_bundle(tmp_path: Path, index, *, retrieval_url: str | None = None, reward: str = "search_r1",
                 judge_for_metrics: bool = False) -> Path:
    from prorag.data.records import Question
    from prorag.specs import RetrieverSpec, TrainedAgentSpec
    from prorag.training.config import GRPOSettings
    from prorag.training.launch import grpo_bundle

    return grpo_bundle(TINY, [Question("q1", "Who wrote Hamlet?", ("Shakespeare",), "hotpotqa")], index,
                       _launch(tmp_path), trainer=GRPOSettings(max_steps=1),
                       retriever=RetrieverSpec(kind="bm25", retrieval_url=retrieval_url),
                       agent=TrainedAgentSpec(name="agent", protocol="hiprag"), reward={"kind": reward},
                       start_adapter=None, full_parameters=False, generation_batch_size=2,
                       judge_for_metrics=judge_for_metrics, policy_server=None)


def test_the_grpo_bundle_references_a_loaded_index_in_place_instead_of_copying_it(tmp_path, saved_index):
    from prorag.launch_worker import grpo_index
    from prorag.retrieval.index import load_index_dir

    built, directory = saved_index
    loaded = load_index_dir(directory)
    assert loaded.source_dir == directory.resolve() and loaded.view().source_dir == directory.resolve()
    bundle = _grpo_bundle(tmp_path, loaded.view())
    assert not (bundle / "inputs" / "index").exists()  # no copy
    worker = json.loads((bundle / "bundle.json").read_text())["worker"]
    assert worker["index"] == {"mode": "path", "path": str(directory.resolve())}
    index = grpo_index(worker, bundle)  # what every rank does
    assert index.source_dir == directory.resolve()
    assert index.retriever("bm25").search(["capital of Peru"], 1)[0][0].passage.id == "p1"

    copied = _grpo_bundle(tmp_path / "memory", built)  # built in memory: no directory to point at, so one copy
    worker = json.loads((copied / "bundle.json").read_text())["worker"]
    assert worker["index"] == {"mode": "copy"} and (copied / "inputs" / "index" / "index_meta.json").is_file()
    assert len(grpo_index(worker, copied)) == 4
    missing = {"index": {"mode": "path", "path": str(tmp_path / "gone")}}
    with pytest.raises(FileNotFoundError, match=r"worker\.index\.path .*gone is not a directory"):
        grpo_index(missing, copied)


def test_with_a_retrieval_server_the_grpo_ranks_load_no_index_and_retrieve_over_http(tmp_path, saved_index):
    from prorag.assembly import build_grpo_rollouts
    from prorag.launch_worker import grpo_index
    from prorag.retrieval.index import load_index_dir
    from prorag.retrieval.server import BackgroundServer, create_app
    from prorag.specs import RetrieverSpec, TrainedAgentSpec
    from prorag.training.config import GRPOSettings

    _, directory = saved_index
    index = load_index_dir(directory)
    with BackgroundServer(create_app(index.retriever("bm25"))) as server:
        bundle = _grpo_bundle(tmp_path, index.view(), retrieval_url=server.url)
        worker = json.loads((bundle / "bundle.json").read_text())["worker"]
        assert worker["index"] == {"mode": "server", "retrieval_url": server.url}
        assert not (bundle / "inputs" / "index").exists() and grpo_index(worker, bundle) is None
        from prorag.data.records import Question

        rollout = build_grpo_rollouts(  # what a rank builds from the bundle (launch_worker._stage_grpo)
            [Question("q1", "Who wrote Hamlet?", ("Shakespeare",), "hotpotqa")], None,
            retriever=RetrieverSpec.model_validate(worker["retriever"]),
            agent=TrainedAgentSpec.model_validate(worker["agent"]), reward=worker["reward"],
            trainer=GRPOSettings(max_steps=1), generation_batch_size=2, judge_for_metrics=False, policy_server=None)
        assert rollout.retriever.search(["capital of Peru"], 1)[0][0].passage.id == "p1"
    # a reward whose judges ground on the index (hiprag's detection) still needs it: referenced in place
    judged = _grpo_bundle(tmp_path / "judged", index.view(), retrieval_url="http://127.0.0.1:9", reward="hiprag")
    assert json.loads((judged / "bundle.json").read_text())["worker"]["index"]["mode"] == "path"


# ------------------------------------------------------------------------------------------ 1 vs 2 processes


def _outputs(result) -> dict[str, object]:
    """What a launch leaves: adapter files and config, checkpoint names and files, steps, the loss per step."""
    adapter = result.adapter
    checkpoints = sorted((result.bundle / "run" / "checkpoints").glob("checkpoint-*"))
    config = json.loads((adapter / "adapter_config.json").read_text())
    return {"adapter_files": sorted(path.name for path in adapter.iterdir()),
            "adapter_config": (config["r"], config["lora_alpha"], sorted(config["target_modules"]),
                               config["base_model_name_or_path"]),
            "checkpoints": [path.name for path in checkpoints],
            "checkpoint_files": sorted(path.name for path in checkpoints[-1].iterdir()
                                       if "rng_state" not in path.name),  # one RNG state file per rank
            "global_step": result.global_step}


@pytest.mark.integration
@pytest.mark.distributed
@pytest.mark.parametrize("stage", ["sft", "dpo"])
def test_two_processes_produce_what_one_process_does_for_the_same_global_batch(tmp_path, stage):
    """The same global batch (2 sequences / pairs per step) on 1 process (2 per device) and on 2 processes (1 per
    device, DDP over gloo): the same adapter and checkpoint files, the same optimizer steps, and losses that agree
    (every example has the same length, LoRA dropout is off, so only float summation order differs)."""
    from prorag.training.dpo import DPOTrainingConfig

    results = {}
    for processes in (1, 2):
        per_device = 2 // processes
        launch = _launch(tmp_path / f"p{processes}", processes_per_machine=processes)
        if stage == "sft":
            settings = SFTSettings(max_steps=3, per_device_train_batch_size=per_device, save_steps=1, lora_r=4,
                                   lora_alpha=8, lora_dropout=0.0, learning_rate=1e-3)
            results[processes] = launch_sft(TINY, EXAMPLES, settings, launch)
        else:
            config = DPOTrainingConfig(max_steps=3, per_device_train_batch_size=per_device,
                                       gradient_accumulation_steps=1, learning_rate=1e-3, warmup_ratio=0.0,
                                       save_steps=1, lora_r=4, lora_alpha=8)
            results[processes] = launch_dpo(TINY, PAIRS, config, launch)
    one, two = results[1], results[2]
    assert (one.world_size, two.world_size) == (1, 2)
    assert _outputs(one) == _outputs(two)
    assert _outputs(two)["global_step"] == 3
    losses = {processes: [entry["loss"] for entry in result.log_history if "loss" in entry]
              for processes, result in results.items()}
    assert len(losses[1]) == len(losses[2]) == 3
    assert losses[1] == pytest.approx(losses[2], rel=1e-3), losses
