"""The shared specs are strict: no coercion, bounds on every number, protocols checked against the registry."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from prorag.pipelines.rl.params import RLParams
from prorag.pipelines.rollout.params import RolloutParams
from prorag.protocol.registry import register_protocol, unregister_protocol
from prorag.protocol.search_r1 import SearchR1Adapter
from prorag.rewards.hiprag import HiPRAGSettings
from prorag.rewards.multistage import MultistageSettings
from prorag.specs import AgentSpec, JudgeSpec, PolicySpec, RetrieverSpec, SamplingSpec
from prorag.training.config import GRPOSettings, SFTSettings


@pytest.mark.parametrize(("spec", "values", "field"), [
    (RetrieverSpec, {"top_k": True}, "top_k"),            # true is not 1
    (RetrieverSpec, {"top_k": 0}, "top_k"),
    (RetrieverSpec, {"top_k": "3"}, "top_k"),             # no string coercion
    (RetrieverSpec, {"retrieval_url": "ftp://x"}, "retrieval_url"),
    (PolicySpec, {"batch_size": 2.0}, "batch_size"),      # a float is not an int
    (JudgeSpec, {"max_retries": -1}, "max_retries"),
    (JudgeSpec, {"temperature": -0.5}, "temperature"),
    (HiPRAGSettings, {"lambda_f": 1.5}, "lambda_f"),
    (MultistageSettings, {"stage_switch_step": False}, "stage_switch_step"),
    (AgentSpec, {"few_shot": 1}, "few_shot"),             # an int is not a bool
    (AgentSpec, {"step_budget": 0}, "step_budget"),
    (SamplingSpec, {"top_p": 0.0}, "top_p"),
    (SamplingSpec, {"seed": -1}, "seed"),
    (SFTSettings, {"max_steps": -2}, "max_steps"),
    (SFTSettings, {"target_modules": []}, "target_modules"),
    (GRPOSettings, {"num_generations": 1}, "num_generations"),
    (GRPOSettings, {"save_total_limit": 0}, "save_total_limit"),
])
def test_bad_values_are_rejected_naming_the_field(spec, values, field):
    with pytest.raises(ValidationError, match=field):
        spec(**values)


def test_floats_accept_ints_and_nested_blocks_accept_mappings():
    assert HiPRAGSettings(lambda_p=1).lambda_p == 1.0  # an int is a valid float (YAML writes 1 for 1.0)
    params = RLParams(retriever={"kind": "bm25", "top_k": 5}, trainer={"learning_rate": 1.0e-5})
    assert params.retriever.top_k == 5 and params.trainer.learning_rate == 1.0e-5
    with pytest.raises(ValidationError, match=r"samples"):
        RolloutParams(methods=[{"name": "d", "kind": "direct"}], samples=True)


def test_a_registered_protocol_is_accepted_by_name():
    with pytest.raises(ValidationError, match="unknown protocol 'mine'"):
        AgentSpec(protocol="mine")
    register_protocol("mine", SearchR1Adapter)
    try:
        assert AgentSpec(protocol="mine").protocol == "mine"
    finally:
        unregister_protocol("mine")
