"""Fixtures of the server tests: the tiny model served on a loopback port for the whole module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi import FastAPI

from prorag.llm.registry import BUNDLED_TINY_LLAMA
from prorag.llm.transformers_backend import TransformersGenerator
from prorag.serving import create_app, serve_in_thread

MODEL_NAME = "tiny"


@pytest.fixture(scope="module")
def tiny_generator(one_torch_thread: None) -> TransformersGenerator:
    return TransformersGenerator(BUNDLED_TINY_LLAMA, batch_size=16)


@pytest.fixture(scope="module")
def app(tiny_generator) -> FastAPI:
    return create_app(tiny_generator, MODEL_NAME, max_batch_size=16, batch_wait_ms=20, max_tokens_limit=64,
                      max_n=4)


@pytest.fixture(scope="module")
def base_url(app) -> Iterator[str]:
    url, stop = serve_in_thread(app)
    yield url
    stop()

