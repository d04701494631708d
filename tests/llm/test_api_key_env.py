"""Keys go only where a parameter names them (issue 11, item 1): the project's OpenAI-compatible server on a
loopback port records the ``Authorization`` header of every request it receives."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator

import pytest
from fastapi import Request, Response

from prorag.judges.factory import build_judge
from prorag.llm.factory import build_generator
from prorag.llm.generation import SamplingParams
from prorag.llm.openai_backend import MissingApiKeyError, OpenAICompatibleGenerator
from prorag.llm.registry import BUNDLED_TINY_LLAMA
from prorag.serving import create_app, serve_in_thread
from prorag.training.trl_grpo import PolicyServer

PLANTED = "sk-planted-openai-key-must-never-leave"
NAMED = "PRORAG_TEST_NAMED_KEY"


@pytest.fixture(scope="module")
def recording_server(tiny_generator) -> Iterator[tuple[str, list[str]]]:
    app = create_app(tiny_generator, "tiny", max_tokens_limit=8)
    received: list[str] = []

    @app.middleware("http")
    async def record(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        received.append(request.headers.get("authorization", "<none>"))
        return await call_next(request)

    url, stop = serve_in_thread(app)
    yield url, received
    stop()


@pytest.fixture
def planted_openai_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", PLANTED)
    monkeypatch.delenv(NAMED, raising=False)


def test_judge_with_an_unset_named_variable_fails_before_any_request(recording_server, planted_openai_key):
    url, received = recording_server
    received.clear()
    with pytest.raises(MissingApiKeyError, match=NAMED):
        build_judge("llm", base_url=url, model="tiny", api_key_env=NAMED, max_retries=0)
    assert received == []


def test_judge_sends_only_the_named_key_or_none(recording_server, planted_openai_key, monkeypatch):
    url, received = recording_server
    monkeypatch.setenv(NAMED, "named-judge-key")
    received.clear()
    with build_judge("llm", base_url=url, model="tiny", api_key_env=NAMED, max_retries=0, timeout=30) as judge:
        (verdict,) = judge.equivalent([("a", "b")])
    with build_judge("llm", base_url=url, model="tiny", api_key_env=None, max_retries=0, timeout=30) as keyless:
        keyless.equivalent([("a", "b")])
    assert verdict.value is None  # the tiny random model is no judge; what matters is the header
    assert received == ["Bearer named-judge-key", "Bearer EMPTY"]
    assert not any(PLANTED in header for header in received)


def test_policy_generator_sends_only_the_named_key(recording_server, planted_openai_key, monkeypatch):
    url, received = recording_server
    with pytest.raises(MissingApiKeyError, match=NAMED):
        build_generator(BUNDLED_TINY_LLAMA, backend="openai", base_url=url, api_key_env=NAMED)
    monkeypatch.setenv(NAMED, "named-policy-key")
    received.clear()
    generator = build_generator(BUNDLED_TINY_LLAMA, backend="openai", base_url=url, api_key_env=NAMED)
    assert isinstance(generator, OpenAICompatibleGenerator)
    generator.model = "tiny"
    with generator:
        generator.generate(["hello"], SamplingParams(max_new_tokens=2, temperature=0.0))
    with OpenAICompatibleGenerator(url, "tiny") as no_key:  # no key given: the keyless placeholder, never $OPENAI
        no_key.generate(["hello"], SamplingParams(max_new_tokens=2, temperature=0.0))
    assert received == ["Bearer named-policy-key", "Bearer EMPTY"]


def test_rl_policy_server_key(recording_server, planted_openai_key, monkeypatch):
    url, _ = recording_server
    root = url.removesuffix("/v1")
    with pytest.raises(MissingApiKeyError, match=NAMED):
        PolicyServer(root, "tiny", api_key_env=NAMED)
    assert PolicyServer(root, "tiny").api_key() == "EMPTY"  # trl vllm-serve has no key: $OPENAI_API_KEY unused
    monkeypatch.setenv(NAMED, "named-server-key")
    assert PolicyServer(root, "tiny", api_key_env=NAMED).api_key() == "named-server-key"


def test_the_openai_key_goes_only_to_openai(recording_server, planted_openai_key):
    """Issue 32: the default ``api_key_env: OPENAI_API_KEY`` is paired with https://api.openai.com only; with any
    other base_url it fails before a request, so the OpenAI key never reaches a self-hosted or foreign server."""
    from prorag.llm.openai_backend import UnpairedApiKeyError, api_key_from_env

    url, received = recording_server
    received.clear()
    with pytest.raises(UnpairedApiKeyError, match=r"api\.openai\.com"):
        build_judge("llm", base_url=url, model="tiny", max_retries=0)  # api_key_env left at its default
    with pytest.raises(UnpairedApiKeyError):
        build_generator(BUNDLED_TINY_LLAMA, backend="openai", base_url=url)
    with pytest.raises(UnpairedApiKeyError):
        PolicyServer(url.removesuffix("/v1"), "tiny", api_key_env="OPENAI_API_KEY").api_key()
    with pytest.raises(UnpairedApiKeyError):  # plain http, or a look-alike host, is not OpenAI's API either
        api_key_from_env("OPENAI_API_KEY", endpoint="x", base_url="http://api.openai.com/v1")
    with pytest.raises(UnpairedApiKeyError):
        api_key_from_env("OPENAI_API_KEY", endpoint="x", base_url="https://api.openai.com.evil.example/v1")
    assert api_key_from_env("OPENAI_API_KEY", endpoint="x", base_url="https://api.openai.com/v1") == PLANTED
    assert received == []


def test_the_openai_key_of_a_policy_does_not_follow_its_trained_model_to_another_server(tmp_path, monkeypatch,
                                                                                         recording_server):
    """A full trained model goes to ``policy.trained_server``: the policy's key variable is paired again with that
    server, so OPENAI_API_KEY configured for api.openai.com never reaches a loopback server."""
    import prorag.llm.factory as factory
    from prorag.llm.openai_backend import UnpairedApiKeyError
    from prorag.llm.served import TrainedServerSpec

    url, received = recording_server
    before = len(received)
    monkeypatch.setenv("OPENAI_API_KEY", PLANTED)
    monkeypatch.setattr(factory, "_serves", lambda *args: False)  # api.openai.com does not serve a local folder
    folder = tmp_path / "rl_model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    with pytest.raises(UnpairedApiKeyError, match="the trained policy at"):
        build_generator(str(folder), backend="openai", base_url="https://api.openai.com/v1",
                        api_key_env="OPENAI_API_KEY", trained_server=TrainedServerSpec(base_url=url))
    assert len(received) == before
