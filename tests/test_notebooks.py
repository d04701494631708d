"""notebooks/explore_runs.ipynb runs top to bottom on the project's venv kernel, against a temporary copy of the project
holding a completed rollout run and a completed judge run of its trajectories (real rollout, verdict and evaluation
records made by the project's own code), a newer failed run that must be ignored, and a SQLite MLflow store with a
flat run and a run with nested child runs."""

from __future__ import annotations

import json
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import mlflow
import nbformat
import pytest
import yaml
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from kedro.io import AbstractDataset
from nbclient import NotebookClient

from prorag.agent import Rollout, record_policy
from prorag.agent.baselines import DirectAnswer
from prorag.agent.trajectory import Segment
from prorag.assembly import build_policy
from prorag.data import load_corpus, load_questions
from prorag.llm.generation import render_chat
from prorag.llm.registry import BUNDLED_TINY_LLAMA
from prorag.pipelines.evaluation.nodes import evaluate_trajectories
from prorag.pipelines.reward_judging.nodes import judge_trajectories
from prorag.pipelines.reward_judging.params import RewardJudgingParams
from prorag.protocol.registry import get_protocol
from prorag.retrieval import build_retrieval_index
from prorag.rewards.hiprag import HiPRAGSettings
from prorag.specs import PolicySpec
from prorag.tracking.mlflow_utils import metric_series
from prorag.tracking.run_manifest import RunManifest, RunManifests
from prorag.training.synthesis import synthesize_trajectories

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "explore_runs.ipynb"
COMPLETED_RUN = "2026-01-01T10.00.00.000Z"
JUDGE_RUN = "2026-01-01T11.00.00.000Z"  # judge: loaded COMPLETED_RUN's trajectories, saved the step verdicts
FAILED_RUN = "2026-01-02T10.00.00.000Z"  # newer, but failed: the notebook must not pick it

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _agent_rollouts(questions: list[Any], index: Any, tokenizer: Any) -> list[Rollout]:
    """Gold HiPRAG trajectories (sft synthesis, real retrieved contexts) as rollout records: the completion split
    into what the policy writes and what the engine inserts by the protocol's own label mask."""
    adapter = get_protocol("hiprag", few_shot=False)
    by_key = {question.key: question for question in questions}
    gold, _ = synthesize_trajectories(questions, index.retriever("dense"), top_k=2, protocol=adapter)

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    rollouts = []
    for item in gold:
        question = by_key[item.question_key]
        segments = [Segment(text, encode(text), "generated" if written else "context" if "<context>" in text else "tag")
                    for text, written in adapter.label_pieces(item.completion)]
        tokens = {kind: sum(len(s.token_ids) for s in segments if s.kind == kind) for kind in ("generated", "context",
                                                                                                "tag")}
        prompt = render_chat(tokenizer, adapter.messages(question.question))
        format_ok, n_steps = adapter.check_format(item.completion)
        rollouts.append(Rollout(
            question_key=question.key, question_id=question.id, dataset=question.dataset, question=question.question,
            golden_answers=question.golden_answers, method="hiprag_agent", protocol="hiprag", prompt=prompt,
            prompt_token_ids=encode(prompt), completion=item.completion, segments=segments,
            steps=adapter.steps(item.completion), format_ok=bool(format_ok), n_steps=n_steps,
            answer=adapter.extract_answer(item.completion), stop_reason="answer", retrieval_count=item.n_search,
            queries=list(item.queries), retrieved_ids=[list(ids) for ids in item.context_ids],
            generated_tokens=tokens["generated"], context_tokens=tokens["context"], tag_tokens=tokens["tag"],
            turns=sum(segment.kind == "generated" for segment in segments)))
    return rollouts


def _save(root: Path, name: str, data: Any, version: str) -> None:
    """Save through the dataset the copied catalog.yml declares, as a run with session id ``version`` would."""
    config = yaml.safe_load((root / "conf" / "base" / "catalog.yml").read_text(encoding="utf-8"))[name]
    config = {**config, "filepath": str(root / config["filepath"])}
    AbstractDataset.from_config(name, config, save_version=version).save(data)


def _make_runs(root: Path) -> None:
    raw = root / "data" / "01_raw"
    questions = load_questions(raw / "qa" / "hotpotqa.jsonl")[:3]
    wanted = {pid for q in questions for pid in (*q.supporting_passage_ids, *q.context_passage_ids)}
    index = build_retrieval_index([p for p in load_corpus([raw / "corpus" / "hotpotqa.jsonl"]) if p.id in wanted],
                                  "hashing:64", show_progress=False)
    policy = PolicySpec(model=BUNDLED_TINY_LLAMA, batch_size=4)
    generator = build_policy(policy)
    rollouts = [*DirectAnswer(generator, max_new_tokens=8).run(questions),
                *_agent_rollouts(questions, index, generator.tokenizer)]
    records = [rollout.to_dict() for rollout in record_policy(rollouts, policy)]
    verdicts, rewards, judge_metrics = judge_trajectories(records, index, RewardJudgingParams(), HiPRAGSettings(),
                                                          policy)
    table, evaluation_metrics = evaluate_trajectories(records)
    runs = {COMPLETED_RUN: {"trajectories": records, "evaluation_table": table},
            JUDGE_RUN: {"step_verdicts": verdicts, "trajectory_rewards": rewards}}
    manifests = RunManifests(root / "data" / "runs")
    for run_id, outputs in runs.items():
        for name, data in outputs.items():
            _save(root, name, data, run_id)
        manifests.write(RunManifest(run_id=run_id, status="completed", saved=dict.fromkeys(outputs, run_id),
                                    pipelines=["rollout+evaluation" if run_id == COMPLETED_RUN else "judge"],
                                    loaded={"trajectories": COMPLETED_RUN} if run_id == JUDGE_RUN else {}))
    _save(root, "trajectories", records[:1], FAILED_RUN)
    manifests.write(RunManifest(run_id=FAILED_RUN, status="failed", pipelines=["rollout"],
                                saved={"trajectories": FAILED_RUN}))

    mlflow.set_experiment("prorag")
    with mlflow.start_run(run_name=f"evaluate {COMPLETED_RUN}",
                          tags={"kedro.session_id": COMPLETED_RUN, "kedro.pipeline": "evaluate"}):
        for name, data in (("evaluation_metrics", evaluation_metrics), ("judge_metrics", judge_metrics)):
            for key, value, step in metric_series(name, data):
                mlflow.log_metric(key, value, step=step)
    # nested layout: a stage run with a training curve and a method run with the method-free keys
    with mlflow.start_run(run_name="train 2026-01-03T10.00.00.000Z", tags={"kedro.pipeline": "train"}):
        with mlflow.start_run(run_name="rl", nested=True, tags={"prorag.kind": "stage", "prorag.stage": "rl"}):
            for step, reward in enumerate((0.2, 0.5, 0.9)):
                mlflow.log_metric("rl.reward", reward, step=step)
        with mlflow.start_run(run_name="hiprag_agent_rl", nested=True,
                              tags={"prorag.kind": "method", "prorag.method": "hiprag_agent_rl"}):
            mlflow.log_metrics({"evaluation.macro.cem": 0.4, "evaluation.popqa.cem": 0.4, "judge.osr": 0.25})


def _kernel(tmp_path: Path) -> KernelManager:
    """A kernel on this interpreter (the project's venv), from a kernelspec of its own."""
    spec = tmp_path / "kernels" / "prorag-venv"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "prorag venv", "language": "python"}), encoding="utf-8")
    specs = KernelSpecManager(kernel_dirs=[str(spec.parent)], ensure_native_kernel=False)
    return KernelManager(kernel_name="prorag-venv", kernel_spec_manager=specs)


class _HTMLTable(HTMLParser):
    """The header and body rows of the first HTML table pandas renders (``to_html``): per row its header cells
    (the index levels shown) and its data cells."""

    def __init__(self) -> None:
        super().__init__()
        self.head: list[list[str]] = []
        self.body: list[tuple[list[str], list[str]]] = []
        self._section = ""
        self._cell: str | None = None
        self._row: tuple[list[str], list[str]] = ([], [])

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("thead", "tbody"):
            self._section = tag
        elif tag == "tr":
            self._row = ([], [])
        elif tag in ("th", "td"):
            self._cell = ""

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag: str) -> None:
        if tag in ("th", "td") and self._cell is not None:
            self._row[0 if tag == "th" else 1].append(self._cell.strip())
            self._cell = None
        elif tag == "tr":
            if self._section == "thead":
                self.head.append(self._row[0])
            else:
                self.body.append(self._row)


def _cem_column(html: str) -> dict[str, float]:
    """Method → the ``evaluation.macro.cem`` cell of the notebook's MLflow pivot (its HTML display: index levels
    run and method, one column per metric)."""
    table = _HTMLTable()
    table.feed(html)
    columns = table.head[0][2:]  # after the index levels' header cells
    position = columns.index("evaluation.macro.cem")
    return {headers[-1]: float(cells[position]) for headers, cells in table.body if cells[position] not in ("", "NaN")}


def _text(notebook: Any) -> str:
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            parts.extend(str(value) for key, value in output.get("data", {}).items() if key == "text/plain")
    return "\n".join(parts)


@pytest.mark.integration
def test_explore_runs_notebook_executes(project_copy: Path, mlflow_uri: str, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _make_runs(project_copy)
    monkeypatch.setenv("PRORAG_PROJECT_PATH", str(project_copy))
    for name in ("PRORAG_RUN_ID", "PRORAG_METHOD", "PRORAG_QUESTION"):
        monkeypatch.delenv(name, raising=False)
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, km=_kernel(tmp_path), timeout=180,
                   resources={"metadata": {"path": str(project_copy)}}).execute()

    text = _text(notebook)
    assert f"Trajectories of run {COMPLETED_RUN}: 6 from ['trajectories']" in text
    assert "step verdicts for 3 trajectories" in text
    assert "hiprag_agent · hotpotqa/" in text and "turn 1 · policy" in text and "inserted context" in text
    assert "4 MLflow runs, 2 of them nested" in text
    def result(marker: str, kind: str = "text/plain") -> str:  # the value a cell displays (rich's pretty printer
        return next(output["data"][kind] for cell in notebook.cells if marker in cell.source  # adds an empty one)
                    for output in cell.outputs if output["output_type"] == "execute_result")

    per_method = result("per_method.round")
    assert "hiprag_agent" in per_method and "direct" in per_method and "usr" in per_method
    comparison = result("comparison.round")
    for row in ("hiprag_agent", "direct", "hiprag_agent_rl"):  # from the flat run's keys and from the method run
        assert row in comparison
    # the CEM column is the key every method run and the flat layout carry (issue 46: it wanted evaluation.all.*)
    assert "evaluation.macro.cem" in comparison and "judge.osr" in comparison
    cem = _cem_column(result("comparison.round", "text/html"))
    assert set(cem) == {"direct", "hiprag_agent", "hiprag_agent_rl"} and cem["hiprag_agent_rl"] == 0.4
    assert all(0.0 <= value <= 1.0 for value in cem.values())  # a number for every method, none missing
    assert "no run logged" not in text  # the nested rl run's reward curve is found
