import pytest

import prorag.tracking  # noqa: F401  (registers the "tracking" namespace)
from prorag.config import ParameterError, StrictModel, parse_parameters, register_parameters, validate_parameters


@register_parameters("demo_namespace")
class DemoParams(StrictModel):
    k: int = 3
    files: tuple[str, ...] = ()


def test_parse_reports_unknown_nested_key_with_its_path():
    with pytest.raises(ParameterError, match=r"unknown parameter key 'demo_namespace\.kk'"):
        parse_parameters(DemoParams, {"kk": 4}, "demo_namespace")


def test_parse_reports_wrong_type_with_value():
    with pytest.raises(ParameterError, match=r"parameter 'demo_namespace\.k'.*'many'"):
        parse_parameters(DemoParams, {"k": "many"}, "demo_namespace")


def test_validate_reports_every_problem_at_once():
    with pytest.raises(ParameterError) as error:
        validate_parameters({"demo_namespace": {"kk": 1}, "nonsense": {}, "tracking": {"experiment_name": "x"}})
    message = str(error.value)
    assert "unknown parameter key 'nonsense'" in message
    assert "demo_namespace.kk" in message
    assert "tracking" not in message.split("known top-level keys:")[0]


def test_validate_accepts_models_already_instantiated():
    parsed = validate_parameters({"demo_namespace": DemoParams(k=5)})
    assert parsed["demo_namespace"] == DemoParams(k=5)


def test_a_namespace_cannot_have_two_owners():
    with pytest.raises(ValueError, match="already owned"):
        @register_parameters("demo_namespace")
        class Other(StrictModel):
            pass


def test_a_mistyped_key_suggests_the_closest_valid_one():
    from prorag.pipelines.parameter_schemas import all_parameter_schemas

    schemas = all_parameter_schemas()
    with pytest.raises(ParameterError, match=r"unknown parameter key 'reward\.lambda_pp'; did you mean "
                                             r"'reward\.lambda_p'\?"):
        validate_parameters({"reward": {"lambda_pp": 0.1}}, schemas)
    with pytest.raises(ParameterError, match=r"'rl\.trainer\.max_step'; did you mean 'rl\.trainer\.max_steps'\?"):
        validate_parameters({"rl": {"trainer": {"max_step": 3}}}, schemas)
    with pytest.raises(ParameterError, match=r"'rollout\.methods\.0\.nmae'; did you mean 'rollout\.methods\.0\.name'"):
        validate_parameters({"rollout": {"methods": [{"nmae": "direct"}]}}, schemas)
    with pytest.raises(ParameterError, match=r"unknown parameter key 'rewrd'; did you mean 'reward'\?"):
        validate_parameters({"rewrd": {}}, schemas)


def test_an_unknown_key_with_no_close_match_lists_the_valid_ones():
    with pytest.raises(ParameterError, match=r"'demo_namespace\.zzz' \(valid keys of 'demo_namespace': files, k\)"):
        parse_parameters(DemoParams, {"zzz": 1}, "demo_namespace")
