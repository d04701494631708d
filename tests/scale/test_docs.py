"""Items 11 and 17 of issue 28: docs/scaling.md says what conf/gpu does — the model it trains, full-parameter or
LoRA, the batch, the pipeline, the ports and GPUs of its placement, the CUDA 13 driver — and what has run on a GPU."""

from __future__ import annotations

from .conftest import ROOT, gpu_parameters

DOC = (ROOT / "docs" / "scaling.md").read_text()


def test_the_scaling_guide_matches_conf_gpu():
    parameters = gpu_parameters()
    assert parameters["policy"]["model"].split("/")[-1] in DOC
    assert parameters["rl"]["lora"] is False and "full-parameter" in DOC
    trainer = parameters["rl"]["trainer"]
    batch = trainer["per_device_train_batch_size"] * trainer["gradient_accumulation_steps"]
    assert f"{batch:,}" in DOC and "train_rl_instruct" in DOC  # rl.init: instruct needs no SFT stage
    for name, server in parameters["placement"]["servers"].items():
        assert f"| {server['port']} |" in DOC, name
    assert f"CUDA_VISIBLE_DEVICES={parameters['placement']['trainer_gpu']}" in DOC
    assert "continues the SFT adapter" not in DOC


def test_the_guide_names_the_install_the_driver_and_what_ran_on_a_gpu():
    assert "make gpu-setup" in DOC and "R580" in DOC and "CUDA 13" in DOC
    assert "What has run on a GPU, and what has not" in DOC
    header = (ROOT / "requirements" / "gpu.txt").read_text().split("\n\n")[0]
    assert "R580" in header
