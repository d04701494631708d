"""``trainer_args`` (issue 34, item 5): any other field of the pinned TRL config passes through; a typo fails with
"did you mean", a field prorag sets names the parameter that sets it; ``report_to: mlflow`` logs TRL's metrics into
the active (stage) MLflow run."""

from __future__ import annotations

import random
from pathlib import Path

import mlflow
import pytest

from prorag.config import ParameterError, parse_parameters
from prorag.data.records import load_questions
from prorag.llm.registry import BUNDLED_TINY_LLAMA, load_tokenizer
from prorag.pipelines.dpo.params import DPOParams
from prorag.pipelines.rl.params import RLParams
from prorag.pipelines.sft.params import SftParams
from prorag.training.config import SFTSettings, trl_config_fields
from prorag.training.sft import build_sft_example, train_sft_lora
from prorag.training.synthesis import synthesize_musique

RAW = Path(__file__).resolve().parents[2] / "data" / "01_raw"


def test_an_unknown_field_fails_with_the_closest_trl_name():
    with pytest.raises(ParameterError, match=r"unknown TRL SFTConfig field 'weight_decy' in sft.trainer_args; "
                                             r"did you mean 'weight_decay'\?"):
        parse_parameters(SftParams, {"trainer_args": {"weight_decy": 0.1}}, "sft")
    # transformers 5 has no warmup_ratio: warmup_steps < 1 is the ratio
    with pytest.raises(ParameterError, match=r"'warmup_ratio' in sft.trainer_args; did you mean 'warmup_steps'"):
        parse_parameters(SftParams, {"trainer_args": {"warmup_ratio": 0.1}}, "sft")
    with pytest.raises(ParameterError, match=r"GRPOConfig field 'lr_schedular_type' in rl.backend.args; "
                                             r"did you mean 'lr_scheduler_type'"):
        parse_parameters(RLParams, {"backend": {"args": {"lr_schedular_type": "cosine"}}}, "rl")
    with pytest.raises(ParameterError, match=r"DPOConfig field 'report_too'.*did you mean 'report_to'"):
        parse_parameters(DPOParams, {"trainer": {"trainer_args": {"report_too": ["mlflow"]}}}, "dpo")


def test_a_trainer_args_error_names_the_key_without_echoing_the_block():
    """The message is the bad key and the hint (issue 46, item 5), not also pydantic's copy of the whole block."""
    with pytest.raises(ParameterError) as raised:
        parse_parameters(RLParams, {"trainer": {"loss_type": "grpo"},
                                    "backend": {"name": "trl", "args": {"lr_sheduler_type": "cosine"}}}, "rl")
    message = str(raised.value)
    assert message.endswith("unknown TRL GRPOConfig field 'lr_sheduler_type' in rl.backend.args; did you "
                            "mean 'lr_scheduler_type'?"), message
    assert "(got {" not in message and "loss_type" not in message
    with pytest.raises(ParameterError, match=r"parameter 'rl.trainer.learning_rate': .* \(got 'fast'\)"):
        parse_parameters(RLParams, {"trainer": {"learning_rate": "fast"}}, "rl")  # a scalar is still shown


def test_a_field_prorag_sets_names_the_parameter_that_sets_it():
    with pytest.raises(ParameterError, match=r"SFTConfig.learning_rate is set by sft.learning_rate"):
        parse_parameters(SftParams, {"trainer_args": {"learning_rate": 1e-3}}, "sft")
    with pytest.raises(ParameterError, match=r"GRPOConfig.use_vllm is set by rl.policy_server"):
        parse_parameters(RLParams, {"backend": {"args": {"use_vllm": True}}}, "rl")
    with pytest.raises(ParameterError, match=r"DPOConfig.output_dir is fixed by prorag"):
        parse_parameters(DPOParams, {"trainer": {"trainer_args": {"output_dir": "x"}}}, "dpo")


def test_the_fields_users_asked_for_pass_validation():
    for name in ("lr_scheduler_type", "warmup_steps", "report_to", "weight_decay", "max_grad_norm"):
        assert name in trl_config_fields("SFTConfig") and name in trl_config_fields("GRPOConfig")
    parsed = parse_parameters(RLParams, {"backend": {"args": {"lr_scheduler_type": "cosine", "warmup_steps": 0.1}}},
                              "rl")
    assert parsed.backend.args == {"lr_scheduler_type": "cosine", "warmup_steps": 0.1}


def test_rl_trainer_args_moved_to_the_backend_and_each_backend_checks_its_own():
    """``rl.trainer`` is prorag's GRPO settings; what passes through goes to ``rl.backend.args`` and is checked by
    the named backend (TRL's GRPOConfig fields for trl, its own fields for torch)."""
    with pytest.raises(ParameterError, match=r"rl.trainer.trainer_args moved to rl.backend.args"):
        parse_parameters(RLParams, {"trainer": {"trainer_args": {"lr_scheduler_type": "cosine"}}}, "rl")
    with pytest.raises(ParameterError, match=r"unknown trainer backend 'jax' in rl.backend.name"):
        parse_parameters(RLParams, {"backend": {"name": "jax"}}, "rl")
    with pytest.raises(ParameterError, match=r"rl.backend.args.max_grad_nrm"):
        parse_parameters(RLParams, {"backend": {"name": "torch", "args": {"max_grad_nrm": 1.0}}}, "rl")
    parsed = parse_parameters(RLParams, {"backend": {"name": "torch", "args": {"max_grad_norm": 0.5}}}, "rl")
    assert (parsed.backend.name, parsed.backend.args) == ("torch", {"max_grad_norm": 0.5})


@pytest.mark.integration
def test_trainer_args_reach_trl_and_report_to_mlflow_logs_into_the_active_run(one_torch_thread, mlflow_uri,
                                                                               tmp_path):
    tokenizer = load_tokenizer(BUNDLED_TINY_LLAMA)
    musique = load_questions(RAW / "qa" / "musique.jsonl")[:2]
    gold = [synthesize_musique(q, None, rng=random.Random(0), protocol="hiprag") for q in musique]
    examples = [build_sft_example(tokenizer, t.question, t.completion, protocol="hiprag", few_shot=False)
                for t in gold if t is not None]
    settings = SFTSettings(lora_r=4, lora_alpha=8, max_steps=2, per_device_train_batch_size=1, learning_rate=1e-2,
                           trainer_args={"lr_scheduler_type": "constant", "max_grad_norm": 0.5,
                                         "report_to": ["mlflow"]})
    with mlflow.start_run(run_name="sft") as run:  # the hook's stage run is the active run while a node runs
        _, log_history = train_sft_lora(BUNDLED_TINY_LLAMA, examples, tmp_path / "sft", settings)
        assert mlflow.active_run().info.run_id == run.info.run_id  # TRL did not end the project's run
    logged = mlflow.get_run(run.info.run_id).data
    assert logged.params["lr_scheduler_type"] == "constant" and logged.params["max_grad_norm"] == "0.5"
    assert "loss" in logged.metrics or "train_loss" in logged.metrics
    assert [entry["learning_rate"] for entry in log_history if "learning_rate" in entry] == [1e-2, 1e-2]
