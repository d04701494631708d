import math

import pytest

from prorag.tracking import TrackingParams, default_tracking_uri, flatten, is_secret_key, metric_series, redact


def test_flatten_nested_mappings_and_models():
    flat = flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "t": TrackingParams(experiment_name="x")})
    assert flat == {"a.b": 1, "a.c.d": [1, 2], "t.experiment_name": "x", "t.enabled": True,
                    "t.log_artifacts": True, "t.system_metrics": True, "t.trace_samples": 5, "t.log_models": True,
                    "t.model_flavor": "pyfunc", "t.registered_model_prefix": "prorag-", "t.max_artifact_mb": 500.0,
                    "t.upload_large_models": False,
                    "t.input_datasets": ["questions", "passages", "index_questions", "index_passages",
                                         "rollout_questions", "rl_questions"]}


def test_redact_secret_looking_keys():
    assert redact({"judge.api_key": "sk-1", "judge.model": "m", "x.AUTH_TOKEN": "t"}) == {
        "judge.api_key": "***", "judge.model": "m", "x.AUTH_TOKEN": "***"}


@pytest.mark.parametrize("key", [
    "judge.api_key", "x.AUTH_TOKEN", "hf_token", "access_token", "bearer_token", "refresh-token", "token",
    "db.password", "passwd", "client_secret", "clientSecret", "aws.secret_access_key", "credentials",
    "gcp.credentials.private_key", "Authorization", "apiKey", "openai.accessKey"])
def test_secret_looking_keys_are_hidden(key):
    assert is_secret_key(key) and redact({key: "s3cr3t"}) == {key: "***"}


@pytest.mark.parametrize("key", [
    "rollout.agent.max_new_tokens", "rl.agent.max_total_new_tokens", "context_tokens", "max_tokens",
    "reward.reask_max_new_tokens", "tokenizer", "pad_token_id", "eos_token_ids", "token_budget",
    "judge.api_key_env", "max_completion_tokens", "secretary"])
def test_budgets_and_names_stay_visible(key):
    assert not is_secret_key(key) and redact({key: 96}) == {key: 96}


def test_url_userinfo_is_hidden_in_any_string_value():
    flat = {"judge.base_url": "http://user:secret@127.0.0.1:8000/v1", "store": "postgresql://me:pw@db/mlflow",
            "note": "see https://alice:hunter2@example.com/x and http://example.com/y", "plain": "http://h:80/v1",
            "mirrors": ["s3://KEY:SECRET@bucket/p", "file:///tmp/x"], "nested": {"u": "http://a:b@h", "token": "t"}}
    assert redact(flat) == {
        "judge.base_url": "http://***@127.0.0.1:8000/v1", "store": "postgresql://***@db/mlflow",
        "note": "see https://***@example.com/x and http://example.com/y", "plain": "http://h:80/v1",
        "mirrors": ["s3://***@bucket/p", "file:///tmp/x"], "nested": {"u": "http://***@h", "token": "***"}}


def test_metric_series_from_mapping_skips_non_numbers():
    data = {"hotpotqa": {"recall@5": 0.5, "name": "x", "flag": True, "bad": math.nan}, "n": 3}
    assert sorted(metric_series("retrieval_metrics", data)) == [
        ("retrieval.hotpotqa.recall@5".replace("@", "_"), 0.5, None), ("retrieval.n", 3.0, None)]


def test_metric_series_from_step_records_is_a_curve():
    data = [{"step": 1, "reward": 0.1}, {"step": 2, "reward": 0.3, "loss": {"policy": 2}}]
    assert list(metric_series("train_metrics", data)) == [
        ("train.reward", 0.1, 1), ("train.reward", 0.3, 2), ("train.loss.policy", 2.0, 2)]


def test_list_without_steps_is_not_logged():
    assert list(metric_series("x_metrics", [{"a": 1}])) == []


def test_tracking_uri_from_environment_or_project_sqlite(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert default_tracking_uri(tmp_path) == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert default_tracking_uri(tmp_path) == "http://127.0.0.1:5000"
