"""A trained adapter as an MLflow model in MLflow's own transformers flavour (``tracking.model_flavor:
transformers``): the policy with the adapter merged in, loaded back in a fresh process that never imports prorag
(issue 46, item 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import mlflow
import pytest

from prorag.llm.registry import BUNDLED_TINY_LLAMA, cache_dir
from prorag.tracking.adapter_model import log_merged_model

# Loads the logged model with mlflow and transformers only, and reports what it generated and whether prorag, PEFT
# or the machine's model cache were needed.
LOAD = textwrap.dedent("""
    import json, sys
    import mlflow, mlflow.transformers

    uri = sys.argv[1]
    pipe = mlflow.transformers.load_model(uri)
    out = pipe("The capital of France is", max_new_tokens=4, do_sample=False)[0]["generated_text"]
    pyfunc = mlflow.pyfunc.load_model(uri).predict(["The capital of France is"], params={"max_new_tokens": 4})
    print(json.dumps({"text": out, "pyfunc": [str(text) for text in pyfunc],
                      "prorag": any(name.split(".")[0] == "prorag" for name in sys.modules),
                      "peft": "peft" in sys.modules}))
""")


@pytest.fixture(scope="module")
def trained_adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA adapter on the tiny random Llama whose weights are not zero, so merging changes the model."""
    import torch
    from peft import LoraConfig, get_peft_model

    from prorag.llm.registry import load_causal_lm

    torch.manual_seed(0)
    model, _ = load_causal_lm(BUNDLED_TINY_LLAMA)
    peft_model = get_peft_model(model, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                                                  task_type="CAUSAL_LM", init_lora_weights=False))
    folder = tmp_path_factory.mktemp("trained") / "adapter"
    peft_model.save_pretrained(str(folder))
    return folder


@pytest.mark.integration  # a fresh store, a merge and a second interpreter: ~20 s here
def test_the_merged_policy_loads_with_mlflow_s_transformers_flavour_without_prorag(
        tmp_path: Path, mlflow_uri: str, trained_adapter: Path) -> None:
    with mlflow.start_run() as run:
        pass
    info = log_merged_model(trained_adapter, base_model=BUNDLED_TINY_LLAMA, run_id=run.info.run_id,
                            name="sft_adapter", registered_model_name="prorag-sft_adapter")
    assert info is not None and info.flavors.keys() >= {"transformers", "python_function"}
    assert info.metadata == {"base_model": BUNDLED_TINY_LLAMA, "adapter": "merged"}
    version = mlflow.MlflowClient().get_model_version("prorag-sft_adapter", "1")
    assert version.run_id == run.info.run_id

    # a fresh interpreter that has neither prorag nor the machine's model cache on its paths
    environment = {**os.environ, "PRORAG_CACHE_DIR": str(tmp_path / "no_cache"), "HF_HUB_OFFLINE": "1",
                   "PYTHONPATH": ""}
    completed = subprocess.run([sys.executable, "-c", LOAD, "models:/prorag-sft_adapter/1"], cwd=tmp_path,
                               env=environment, capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr[-2000:]
    loaded = json.loads(completed.stdout.strip().splitlines()[-1])
    assert loaded["prorag"] is False and loaded["peft"] is False
    assert loaded["text"].startswith("The capital of France is") and len(loaded["pyfunc"]) == 1
    # the base is recorded by its portable name (the plumbing model has no hub name), never this machine's cache
    mlmodel = (Path(mlflow.artifacts.download_artifacts(info.model_uri)) / "MLmodel").read_text(encoding="utf-8")
    assert f"source_model_name: {BUNDLED_TINY_LLAMA}" in mlmodel
    assert str(cache_dir()) not in mlmodel

    # the merged weights are the adapter's: the logged model differs from the base
    import torch

    from prorag.llm.registry import load_causal_lm

    merged = mlflow.transformers.load_model("models:/prorag-sft_adapter/1", return_type="components")["model"]
    base, _ = load_causal_lm(BUNDLED_TINY_LLAMA)
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged.state_dict()[name], base.state_dict()[name])


@pytest.mark.integration
def test_a_merged_policy_over_the_size_limit_is_not_logged(mlflow_uri: str, trained_adapter: Path) -> None:
    with mlflow.start_run() as run:
        pass
    assert log_merged_model(trained_adapter, base_model=BUNDLED_TINY_LLAMA, run_id=run.info.run_id,
                            name="sft_adapter", max_mb=0.001) is None
    assert mlflow.MlflowClient().list_artifacts(run.info.run_id) == []


@pytest.mark.integration
@pytest.mark.parametrize(("max_mb", "flavors"), [(500.0, {"transformers", "python_function"}),
                                                 (0.001, {"python_function"})])
def test_the_hook_logs_the_flavour_tracking_asks_for(mlflow_uri: str, trained_adapter: Path, max_mb: float,
                                                     flavors: set[str], caplog: pytest.LogCaptureFixture) -> None:
    """``tracking.model_flavor: transformers``: the merged policy; over ``max_artifact_mb``, the pyfunc adapter
    model instead, saying so."""
    from prorag.hooks.mlflow_tracking import MlflowTrackingHook
    from prorag.tracking.mlflow_utils import TrackingParams

    hook = MlflowTrackingHook()
    hook._settings = TrackingParams(model_flavor="transformers", max_artifact_mb=max_mb)
    hook._parameters = {"policy": {"model": BUNDLED_TINY_LLAMA, "dtype": "float32", "mixed_precision": "bf16"}}
    hook._child_tags = {"kedro.session_id": "s"}
    with mlflow.start_run() as run:
        pass
    hook._log_adapter("sft_adapter", trained_adapter, run.info.run_id)
    [model] = mlflow.search_logged_models(filter_string=f"source_run_id = '{run.info.run_id}'", output_format="list")
    loaded = mlflow.models.get_model_info(f"models:/{model.model_id}")
    assert set(loaded.flavors) == flavors
    assert ("larger than tracking.max_artifact_mb" in caplog.text) is (max_mb < 1)
    if "transformers" not in flavors:  # the adapter model generates in the precision the policy was evaluated in
        generator = mlflow.pyfunc.load_model(f"models:/{model.model_id}").unwrap_python_model().generator
        assert generator.mixed_precision == "bf16"


@pytest.mark.integration
@pytest.mark.parametrize("written", ["no", False])  # YAML reads a bare no as false
def test_the_adapter_model_loads_in_full_precision_by_default(mlflow_uri: str, trained_adapter: Path,
                                                              written: object) -> None:
    from prorag.tracking.adapter_model import log_adapter_model

    with mlflow.start_run() as run:
        pass
    info = log_adapter_model(trained_adapter, base_model=BUNDLED_TINY_LLAMA, run_id=run.info.run_id,
                             name="sft_adapter", mixed_precision=written)  # type: ignore[arg-type]
    generator = mlflow.pyfunc.load_model(info.model_uri).unwrap_python_model().generator
    assert generator.mixed_precision == "no"
