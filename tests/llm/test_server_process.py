"""``prorag.llm.server_process`` and a server that needs a key: ready once ``/v1/models`` answers with it."""

from __future__ import annotations

import sys

import pytest

from prorag.llm.registry import BUNDLED_TINY_LLAMA
from prorag.llm.server_process import free_port, served_models, start_server

KEY = "sk-test-server-process-0123456789"


@pytest.mark.integration
def test_a_keyed_server_is_ready_when_it_lists_the_model_to_the_key(tmp_path):
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    command = [sys.executable, "-m", "prorag.serving", "--model", BUNDLED_TINY_LLAMA, "--served-model-name", "keyed",
               "--host", "127.0.0.1", "--port", base_url.rsplit(":", 1)[1].removesuffix("/v1")]
    server = start_server(command, base_url, tmp_path / "serve.log", served_name="keyed", api_key=KEY,
                          env={"PRORAG_SERVE_API_KEY": KEY}, startup_timeout=120)
    try:
        assert served_models(base_url) == []  # without the key: 401, nothing listed
        assert served_models(base_url, api_key=KEY) == ["keyed"]
    finally:
        server.stop()
