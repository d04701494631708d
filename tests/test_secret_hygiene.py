"""A judge run leaves its API key nowhere (issue 11, "must show"): ``index`` + ``evaluate`` through a real Kedro
session, with LLM judges at a loopback ``prorag serve`` (the tiny random Llama, requiring the key) whose key is
planted in the environment variable the judges name; afterwards the MLflow store, its artifacts, every file the
run wrote and the run's log hold no byte of the key.

The policy is served too (keyless) by a scripted generator that writes a well-formed HiPRAG trajectory — one
search step, one non-search step — so that both judges are really asked."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project

from prorag.llm.generation import Completion, SamplingParams, cut_at_stop, render_chat
from prorag.llm.registry import BUNDLED_TINY_LLAMA, load_tokenizer
from prorag.llm.transformers_backend import TransformersGenerator
from prorag.protocol.hiprag import INSTRUCTIONS
from prorag.serving import create_app, serve_in_thread

PLANTED = "sk-PLANTED-judge-key-4f1d9c3b-do-not-leak"
KEY_ENV = "PRORAG_TEST_JUDGE_KEY"
SCRIPT = ("I should look up the first person.</reasoning>\n<search>Harvey Pekar birth date</search>"
          "Pekar was born in 1939.</conclusion>\n<step>\n<reasoning>I know the other one.</reasoning>\n"
          "<conclusion>Levertov was born in 1923.</conclusion>\n</think>\n<answer>Denise Levertov</answer>")


class ScriptedHiPRAGPolicy:
    """Writes :data:`SCRIPT` across the engine's turns (cut at the stop strings, per question); answers a
    re-asked search query (a prompt without the HiPRAG instructions) with one sentence."""

    def __init__(self) -> None:
        self._tokenizer = load_tokenizer(BUNDLED_TINY_LLAMA)
        self._cursor: dict[str, int] = {}

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def apply_chat_template(self, messages: Sequence[dict[str, Any]]) -> str:
        return render_chat(self._tokenizer, messages)

    def generate(self, prompts: Sequence[str | list[int]], params: SamplingParams) -> list[list[Completion]]:
        results = []
        for prompt in prompts:
            text = prompt if isinstance(prompt, str) else self._tokenizer.decode(list(prompt))
            if INSTRUCTIONS not in text:
                reply, stop = "Harvey Pekar was born in 1939.", None
            else:
                question = re.findall(r"Question: (.*)", text)[-1]
                position = self._cursor.get(question, 0)
                reply, stop = cut_at_stop(SCRIPT[position:], params.stop)
                self._cursor[question] = position + len(reply)
            ids = self._tokenizer(reply, add_special_tokens=False)["input_ids"]
            results.append([Completion(text=reply, token_ids=ids, logprobs=None, finish_reason="stop", stop=stop,
                                       prompt_tokens=len(text))] * params.n)
        return results


@pytest.fixture
def servers(one_torch_thread: None) -> Iterator[tuple[str, str, Any]]:
    judge_app = create_app(TransformersGenerator(BUNDLED_TINY_LLAMA, batch_size=8), "judge", api_key=PLANTED,
                           max_tokens_limit=1024)
    judge_url, stop_judge = serve_in_thread(judge_app)
    policy_url, stop_policy = serve_in_thread(create_app(ScriptedHiPRAGPolicy(), BUNDLED_TINY_LLAMA))
    yield judge_url, policy_url, judge_app.state.stats
    stop_policy()
    stop_judge()


@pytest.mark.integration
@pytest.mark.slow
def test_a_judge_run_leaves_no_trace_of_its_key(project_copy: Path, tmp_path: Path, mlflow_uri: str, servers,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    judge_url, policy_url, judge_stats = servers
    monkeypatch.setenv(KEY_ENV, PLANTED)
    judge = {"kind": "llm", "base_url": judge_url, "model": "judge", "api_key_env": KEY_ENV, "max_retries": 0,
             "timeout": 120, "cache_path": str(project_copy / "data" / "judge_cache.db")}
    runtime_params = {
        "data_preparation": {"question_files": ["data/01_raw/qa/hotpotqa.jsonl"],
                             "corpus_files": ["data/01_raw/corpus/hotpotqa.jsonl"], "max_questions_per_source": 2},
        "corpus_indexing": {"max_questions_per_source": 1, "max_background_passages": 5,
                            "evaluation": {"retrievers": ["bm25"], "ks": [1]}},
        "policy": {"model": BUNDLED_TINY_LLAMA, "backend": "openai", "base_url": policy_url, "api_key_env": None},
        "rollout": {"questions": {"sources": ["hotpotqa"], "max_per_source": 1},
                    "methods": [{"name": "hiprag_agent", "kind": "agent", "protocol": "hiprag", "step_budget": 3,
                                 "max_new_tokens_per_turn": 96, "max_total_new_tokens": 288, "few_shot": False}]},
        "reward": {"reask_max_new_tokens": 16, "over_search_judge": judge, "under_search_judge": judge},
    }
    log_path = tmp_path / "run.log"  # what conf/logging.yml's info.log gets in a CLI run
    handler = logging.FileHandler(log_path, encoding="utf-8")
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s - %(name)s - %(levelname)s - %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        bootstrap_project(project_copy)
        with KedroSession.create(project_path=project_copy, runtime_params=runtime_params) as session:
            session.run(pipeline_names=["index", "evaluate"])
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()

    assert judge_stats.requests >= 2 and judge_stats.rejected == 0  # both judges asked, with the right key
    assert "judge judge (equivalence)" in log_path.read_text(encoding="utf-8")
    written = [path for path in tmp_path.rglob("*") if path.is_file() and not path.is_symlink()]
    # the store and its artifacts (mlflow_uri roots them in tmp_path/mlartifacts) are among the files scanned
    assert any(path.name == "mlflow.db" for path in written) and any("mlartifacts" in path.parts for path in written)
    leaks = [str(path) for path in written if PLANTED.encode() in path.read_bytes()]
    assert leaks == []
