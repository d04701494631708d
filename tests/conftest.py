"""Shared fixtures: offline, telemetry off, a throw-away MLflow store, and isolated copies of the project."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from prorag.data import Passage, Question, load_questions
from prorag.retrieval import BM25Retriever, PassageStore
from prorag.testing import ScriptedModel

PROJECT_ROOT = Path(__file__).resolve().parents[1]

os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PRORAG_CACHE_DIR", str(PROJECT_ROOT / ".cache" / "prorag"))


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """One intra-op torch thread for a test module: faster and steadier for small models on a shared 2-core
    machine; the previous setting is restored afterwards."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def questions() -> list[Question]:
    """The rollout tests' questions: the first 4 of the bundled HotpotQA file."""
    return load_questions(PROJECT_ROOT / "data" / "01_raw" / "qa" / "hotpotqa.jsonl")[:4]


@pytest.fixture(scope="module")
def retriever():
    """A BM25 retriever over the first 50 passages of the bundled HotpotQA corpus (the rollout tests' world)."""
    with (PROJECT_ROOT / "data" / "01_raw" / "corpus" / "hotpotqa.jsonl").open(encoding="utf-8") as handle:
        passages = [Passage.from_dict(json.loads(line)) for line in itertools.islice(handle, 50)]
    return BM25Retriever.build(PassageStore(passages))


@pytest.fixture
def project_root() -> Path:
    return PROJECT_ROOT


@pytest.fixture
def mlflow_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh SQLite MLflow store for one test, exported as ``MLFLOW_TRACKING_URI``.

    MLflow keeps the tracking URI and the active experiment as process globals (a Kedro run in an earlier
    test sets both), so they are pointed at the fresh store here and cleared afterwards. The experiments the
    store creates keep their artifacts under ``tmp_path``, not in ``./mlruns`` of the working directory (MLflow's
    default artifact root for a SQLite store): the root an MLflow server process hands its stores, which MLflow
    reads from the environment (so a ``kedro run`` subprocess of the test gets it too).
    """
    import mlflow
    from mlflow.tracking._tracking_service.utils import _SERVER_ARTIFACT_ROOT_ENV_VAR

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv(_SERVER_ARTIFACT_ROOT_ENV_VAR, (tmp_path / "mlartifacts").as_uri())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("Default")
    yield uri
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


@pytest.fixture
def project_copy(tmp_path: Path) -> Iterator[Path]:
    """The project's configuration and metadata in a temporary folder, with the raw data linked in.

    Kedro runs in it write their versioned outputs there instead of into the working tree.
    """
    root = tmp_path / "project"
    root.mkdir()
    for name in ("pyproject.toml", ".kedro.yml", ".telemetry"):
        shutil.copy2(PROJECT_ROOT / name, root / name)
    shutil.copytree(PROJECT_ROOT / "conf", root / "conf", ignore=shutil.ignore_patterns("credentials.yml"))
    (root / "src").mkdir()  # the package itself is imported from the installed (editable) project
    (root / "data").mkdir()
    (root / "data" / "01_raw").symlink_to(PROJECT_ROOT / "data" / "01_raw")
    previous = Path.cwd()
    os.chdir(root)
    try:
        yield root
    finally:
        os.chdir(previous)


class ScriptedJudgeModel(ScriptedModel):
    """A judge model to serve on loopback.

    Equivalence: True when the two statements are equal ignoring case, False otherwise. Step verification:
    True when the conclusion mentions Paris. Answer check: YES when the prediction is among the references.
    Any material containing "garble" gets a reply without a verdict.
    """

    def reply(self, prompt: str) -> str:
        user = prompt.rsplit("<|user|>\n", 1)[-1]
        if "garble" in user:
            return "Hmm, hard to say. Possibly?"
        if (match := re.search(r"Statement 1: (.*)\nStatement 2: (.*)\n<\|assistant", prompt)) is not None:
            same = match.group(1).lower() == match.group(2).lower()
            return f"Both statements name the same fact.\n<answer> {same} </answer>"
        if (conclusions := re.findall(r"<conclusion>(.*?)</conclusion>", user)):
            return f"<answer>{'Paris' in conclusions[-1]}</answer>"
        if (match := re.search(r"Prediction: (.*)\nReference Answers: (.*)\n", user)) is not None:
            return "YES" if f"'{match.group(1)}'" in match.group(2) else "NO."
        return "unexpected prompt"


@pytest.fixture(scope="module")
def scripted_judge_model() -> ScriptedJudgeModel:
    """A judge model to serve with ``prorag.serving.create_app`` on loopback (see :class:`ScriptedJudgeModel`)."""
    return ScriptedJudgeModel()
