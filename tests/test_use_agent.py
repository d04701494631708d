"""The trained agent outside the pipelines (issue 46, item 2): an adapter trained here records its base by a portable
name; ``prorag ask`` (a fresh process) runs the newest trained adapter of the catalog through the search loop with
the run's index; ``prorag serve --adapter`` serves it; ``prorag export`` writes the adapter or the merged model."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from kedro.io import Version

from prorag.console import main
from prorag.data import load_corpus, load_questions
from prorag.datasets import RetrievalIndexDataset
from prorag.llm.registry import (
    BUNDLED_SMOLLM2,
    BUNDLED_TINY_LLAMA,
    cache_dir,
    load_tokenizer,
    portable_name,
    resolve_model_path,
)
from prorag.llm.server_process import free_port, start_server
from prorag.pipelines.corpus_indexing.nodes import build_index, select_index_corpus
from prorag.pipelines.corpus_indexing.params import CorpusIndexingParams
from prorag.training.config import SFTSettings
from prorag.training.sft import build_sft_example, train_sft_lora
from prorag.training.synthesis import synthesize_musique

PROJECT_ROOT = Path(__file__).resolve().parents[1]
VERSION = "2026-01-01T00.00.00.000Z"
SMOLLM2_HUB = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_bundled_models_are_recorded_by_hub_name_and_resolve_back_offline(monkeypatch):
    monkeypatch.delenv("PRORAG_ALLOW_DOWNLOAD", raising=False)
    folder = cache_dir() / "models" / "smollm2-135m-instruct"
    assert portable_name(str(folder)) == portable_name(BUNDLED_SMOLLM2) == SMOLLM2_HUB
    assert portable_name(str(cache_dir() / "models" / "tiny-random-llama")) == BUNDLED_TINY_LLAMA  # no hub name
    assert portable_name("/some/other/model") == "/some/other/model"
    assert resolve_model_path(SMOLLM2_HUB) == resolve_model_path(BUNDLED_SMOLLM2)


def test_bare_prorag_prints_the_help(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: prorag") and "ask" in out and "export" in out


@pytest.fixture(scope="module")
def trained_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project copy with a retrieval index and an rl_adapter (tiny Llama, 2 SFT steps) saved as a run saves them."""
    project_root = PROJECT_ROOT
    root = tmp_path_factory.mktemp("trained") / "project"
    root.mkdir()
    for name in ("pyproject.toml", ".kedro.yml", ".telemetry"):
        if (project_root / name).exists():
            shutil.copy2(project_root / name, root / name)
    shutil.copytree(project_root / "conf", root / "conf", ignore=shutil.ignore_patterns("credentials.yml"))
    (root / "src").mkdir()
    raw = project_root / "data" / "01_raw"
    questions = [q.to_dict() for q in load_questions(raw / "qa" / "hotpotqa.jsonl")]
    passages = [p.to_dict() for p in load_corpus([raw / "corpus" / "hotpotqa.jsonl"])]
    params = CorpusIndexingParams(max_questions_per_source=2, max_background_passages=10)
    corpus, _ = select_index_corpus(passages, questions, params)
    RetrievalIndexDataset(filepath=str(root / "data" / "06_models" / "retrieval_index"),
                          version=Version(None, VERSION)).save(build_index(corpus, params))
    tokenizer = load_tokenizer(BUNDLED_TINY_LLAMA)
    musique = load_questions(raw / "qa" / "musique_train.jsonl")[:4]
    gold = [synthesize_musique(q, None, rng=random.Random(0), protocol="hiprag") for q in musique]
    examples = [build_sft_example(tokenizer, t.question, t.completion, protocol="hiprag", few_shot=False)
                for t in gold if t is not None]
    adapter, _ = train_sft_lora(BUNDLED_TINY_LLAMA, examples, root.parent / "sft",
                                SFTSettings(lora_r=4, lora_alpha=8, max_steps=2, per_device_train_batch_size=1,
                                            learning_rate=1e-2, seed=0))
    shutil.copytree(adapter, root / "data" / "06_models" / "rl_adapter" / VERSION / "rl_adapter")
    return root


@pytest.mark.integration
def test_a_trained_adapter_records_a_portable_base_and_its_tokenizer(trained_project):
    adapter = trained_project / "data" / "06_models" / "rl_adapter" / VERSION / "rl_adapter"
    config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    assert config["base_model_name_or_path"] == BUNDLED_TINY_LLAMA  # not this machine's cache folder
    assert str(cache_dir()) not in (adapter / "README.md").read_text(encoding="utf-8")
    assert (adapter / "tokenizer_config.json").is_file()


def _prorag(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "prorag.console", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "KEDRO_DISABLE_TELEMETRY": "1",
                                            "MLFLOW_TRACKING_URI": f"sqlite:///{cwd / 'mlflow.db'}"})


@pytest.mark.integration
def test_prorag_ask_runs_the_latest_adapter_with_the_run_s_index(trained_project):
    completed = _prorag("ask", "Who directed the film that won the 1998 Palme d'Or?", cwd=trained_project)
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = completed.stdout.splitlines()
    assert f"policy: rl_adapter@{VERSION}" in lines
    assert f"base model: {BUNDLED_TINY_LLAMA}" in lines
    assert f"index: retrieval_index@{VERSION}" in lines
    assert any(line.startswith("agent: hiprag_agent_rl (hiprag, at most ") for line in lines)
    assert "question: Who directed the film that won the 1998 Palme d'Or?" in lines
    assert lines[lines.index("question: Who directed the film that won the 1998 Palme d'Or?") + 1] == "--- policy ---"
    assert any(line.startswith("answer: ") for line in lines)
    assert any(" tokens generated, stop: " in line for line in lines)


@pytest.mark.integration
def test_prorag_ask_without_a_trained_adapter_says_what_to_run(project_copy):
    completed = _prorag("ask", "Who?", cwd=project_copy)
    assert completed.returncode == 1
    assert completed.stderr.strip().splitlines()[-1] == (
        "Error: rl_adapter: it has no saved version; train first (`kedro run --pipelines=train`) or pass a folder")


@pytest.mark.integration
def test_prorag_export_writes_the_adapter_and_the_merged_model(trained_project, tmp_path):
    from transformers import AutoModelForCausalLM

    assert _prorag("export", str(tmp_path / "adapter"), cwd=trained_project).returncode == 0
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] == \
        BUNDLED_TINY_LLAMA
    merged = _prorag("export", "--merge", str(tmp_path / "merged"), cwd=trained_project)
    assert merged.returncode == 0, merged.stderr[-3000:]
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")  # plain transformers, no prorag
    assert not any("lora" in name for name, _ in model.named_parameters())


@pytest.mark.integration
def test_prorag_serve_adapter_serves_the_trained_policy(trained_project, tmp_path):
    adapter = trained_project / "data" / "06_models" / "rl_adapter" / VERSION / "rl_adapter"
    port = free_port()
    server = start_server([sys.executable, "-m", "prorag.console", "serve", "--adapter", str(adapter), "--port",
                           str(port)], f"http://127.0.0.1:{port}/v1", tmp_path / "serve.log",
                          served_name="rl_adapter", startup_timeout=180)
    try:
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                           json={"model": "rl_adapter", "prompt": "Paris is", "max_tokens": 4})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 4
        assert "with the adapter" in server.log_tail()
    finally:
        server.stop()
