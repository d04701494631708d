"""The trained agent outside the pipelines: ``prorag ask`` and ``prorag export`` (issue 46, item 2).

``ask`` runs a trained policy through its method's search loop (protocol, step budget, retriever) on a new
question, with the run's retrieval index, and returns the rollout; :func:`render_rollout` prints it step by step.
The policy is the newest version of the method's adapter saved by a *completed* run (as ``kedro run`` pins inputs),
or an adapter folder given by path; its base model is the one the adapter records (``base_model_name_or_path``,
resolved through :mod:`prorag.llm.registry`); the index is the one that adapter's run used (its manifest's lineage),
else the newest completed one. ``export`` writes an adapter with its portable base name, or the merged model (a
plain transformers folder). Part of the application: it reads the Kedro project's configuration and catalog.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project
from kedro.io import AbstractVersionedDataset, Version

from prorag.agent import Rollout, build_runner
from prorag.assembly import build_policy, build_retriever
from prorag.data import Question
from prorag.datasets.optional_version_dataset import stored_versions
from prorag.errors import UserError
from prorag.hooks.run_versions import RUN_MANIFEST_DIR
from prorag.llm.registry import adapter_base_model, make_adapter_portable, portable_name, save_merged
from prorag.pipeline_registry import DEFAULT_METHOD
from prorag.retrieval import RetrievalIndex
from prorag.specs import MethodSpec, PolicySpec, RetrieverSpec, SamplingSpec
from prorag.tracking.run_manifest import RunManifests

INDEX_DATASET = "retrieval_index"


class AgentUseError(UserError, ValueError):
    """What ``prorag ask`` / ``export`` need is missing (no trained adapter, no index, an unknown method)."""


@dataclass(frozen=True)
class TrainedPolicy:
    """An adapter folder, where it came from (``dataset@version`` or the path) and the base model it records."""

    folder: str
    source: str
    base_model: str
    version: str | None = None


class Project:
    """The Kedro project at ``path`` (configuration env ``env``): its resolved parameters and catalog; ``quiet``:
    only warnings of the log reach the terminal."""

    def __init__(self, path: Path, env: str | None = None, *, quiet: bool = True) -> None:
        self.path = path.resolve()
        if not (self.path / "conf" / "base").is_dir():
            raise AgentUseError(f"{self.path} is not a prorag project (no conf/base): run from the project root "
                                "or pass --project")
        bootstrap_project(self.path)
        with KedroSession.create(project_path=self.path, env=env) as session:
            if quiet:  # the session configured logging (conf/logging.yml: every INFO record on the terminal)
                for handler in logging.getLogger().handlers:
                    handler.setLevel(max(handler.level, logging.WARNING))
            context = session.load_context()
            self.params: dict[str, Any] = dict(context.params)
            self.catalog = context.catalog
        self.manifests = RunManifests(self.path / RUN_MANIFEST_DIR)

    def method(self, name: str) -> dict[str, Any]:
        """The resolved ``methods.<name>`` entry (agent, retriever, adapter dataset)."""
        methods = self.params.get("methods") or {}
        if name not in methods:
            raise AgentUseError(f"unknown method {name!r} (methods: {', '.join(sorted(methods))})")
        return methods[name]

    def latest(self, dataset: str) -> tuple[str, Any]:
        """The newest version of versioned ``dataset`` saved by a completed run, and its data."""
        stored = self._versioned(dataset)
        versions = stored_versions(stored)
        version = next((version for version in versions if self.manifests.usable(version)), None)
        if version is None:
            found = f"its versions come from runs that did not complete: {', '.join(versions[:3])}" if versions \
                else "it has no saved version"
            raise AgentUseError(f"{dataset}: {found}; train first (`kedro run --pipelines=train`) or pass a folder")
        return version, self.load(dataset, version)

    def load(self, dataset: str, version: str) -> Any:
        """Version ``version`` of versioned ``dataset``."""
        stored = self._versioned(dataset)
        return stored._copy(_version=Version(version, None)).load()  # type: ignore[attr-defined]

    def index_for(self, adapter: TrainedPolicy, dataset: str | None) -> tuple[str, RetrievalIndex]:
        """The retrieval index the adapter's run used (its manifest's lineage), else the newest completed one."""
        if dataset is not None and adapter.version is not None:
            used = self.manifests.lineage(dataset, adapter.version).get(INDEX_DATASET)
            if used is not None and used in stored_versions(self._versioned(INDEX_DATASET)):
                return used, self.load(INDEX_DATASET, used)
        return self.latest(INDEX_DATASET)

    def _versioned(self, dataset: str) -> AbstractVersionedDataset:
        if dataset not in self.catalog:
            raise AgentUseError(f"{dataset} is not in the catalog (conf/base/catalog.yml)")
        stored = self.catalog.get(dataset)
        if not isinstance(stored, AbstractVersionedDataset) or stored._version is None:
            raise AgentUseError(f"{dataset} is not a versioned dataset")
        return stored


def trained_policy(project: Project | None, method: str, adapter: str | None) -> tuple[TrainedPolicy, str | None]:
    """The adapter ``--adapter`` names, else the newest completed version of the method's adapter dataset; and
    that dataset (None for a folder given by path)."""
    if adapter is not None:
        folder = Path(adapter).expanduser()
        if not folder.is_dir():
            raise AgentUseError(f"--adapter {adapter}: no such folder")
        return TrainedPolicy(str(folder), str(folder), _base_model(folder)), None
    if project is None:
        raise AgentUseError("no --adapter and no project to take the latest adapter from")
    dataset = str(project.method(method)["adapter"])
    version, folder = project.latest(dataset)
    return TrainedPolicy(str(folder), f"{dataset}@{version}", _base_model(Path(folder)), version), dataset


def _base_model(folder: Path) -> str:
    if (folder / "adapter_config.json").is_file():
        return adapter_base_model(folder)
    if (folder / "config.json").is_file():  # a full model (full-parameter training, a merged export)
        return str(folder)
    raise AgentUseError(f"{folder} is neither a PEFT adapter (adapter_config.json) nor a model folder (config.json)")


def ask(question: str, *, project: Project, method: str = DEFAULT_METHOD, adapter: str | None = None,
        stage: str | None = None) -> tuple[Rollout, dict[str, str]]:
    """``question`` answered by the trained policy through ``method``'s search loop with the run's index; the
    rollout and what ran (policy, base model, index version, agent)."""
    entry = project.method(method)
    policy_source, dataset = trained_policy(project, method, adapter)
    retriever = RetrieverSpec.model_validate(entry.get("retriever") or project.params["rollout"]["retriever"])
    if retriever.kind.startswith("kag") and not retriever.retrieval_url:
        raise AgentUseError(f"method {method!r} retrieves with {retriever.kind!r} (the knowledge graph): "
                            "`prorag ask` searches the plain index; evaluate it with `kedro run --pipelines=compare`")
    index_version, index = project.index_for(policy_source, dataset)
    policy = PolicySpec.model_validate(project.params["policy"])
    policy = policy.model_copy(update={"model": policy_source.base_model}).with_trained(policy_source.folder)
    agent = dict(entry["agent"])
    name = f"{agent.pop('name')}_{stage or (dataset or 'adapter').removesuffix('_adapter')}"
    spec = MethodSpec(kind="agent", name=name, **agent)
    rollout_params = project.params.get("rollout") or {}
    sampling = SamplingSpec.model_validate({key: rollout_params[key] for key in ("temperature", "top_p", "seed")
                                            if key in rollout_params})
    runner = build_runner(spec, build_policy(policy), build_retriever(retriever, index), top_k=retriever.top_k,
                          sampling=sampling)
    (rollout,) = runner([Question(id="ask", question=question, golden_answers=(), dataset="ask")])
    return rollout, {"policy": policy_source.source, "base model": portable_name(policy_source.base_model),
                     "index": f"{INDEX_DATASET}@{index_version}",
                     "agent": f"{spec.name} ({spec.protocol}, at most {spec.step_budget} steps, "
                              f"{retriever.kind} top-{retriever.top_k})"}


def render_rollout(rollout: Rollout, ran: dict[str, str]) -> str:
    """The rollout as a reader follows it: what ran, what the policy wrote, each search's passages, the answer."""
    lines = [f"{key}: {value}" for key, value in ran.items()]
    lines.append(f"question: {rollout.question}")
    section = None
    for segment in rollout.segments:
        text = segment.text.strip()
        if not text:
            continue
        kind = "search results" if segment.kind == "context" else "policy"
        if kind != section:
            lines.append(f"--- {kind} ---")
            section = kind
        lines.append(text)
    lines.append("---")
    lines.append(f"answer: {rollout.answer if rollout.answer is not None else '(none)'}")
    lines.append(f"{rollout.retrieval_count} search(es) {rollout.queries}, {rollout.generated_tokens} tokens "
                 f"generated, stop: {rollout.stop_reason}, format {'ok' if rollout.format_ok else 'not followed'}")
    return "\n".join(lines)


def export(output: Path, *, project: Project | None, method: str = DEFAULT_METHOD, adapter: str | None = None,
           merge: bool = False) -> str:
    """Write the trained policy to ``output``: the adapter with its portable base name and the tokenizer, or with
    ``merge`` the base model with the adapter merged in (a plain transformers folder); returns what was written."""
    policy_source, _ = trained_policy(project, method, adapter)
    if output.exists() and any(output.iterdir()):
        raise AgentUseError(f"{output} exists and is not empty")
    if not merge:
        shutil.copytree(policy_source.folder, output, dirs_exist_ok=True)
        base = make_adapter_portable(output) or policy_source.base_model
        if not (output / "tokenizer_config.json").is_file():
            from prorag.llm.registry import load_tokenizer

            load_tokenizer(policy_source.base_model).save_pretrained(str(output))
        return f"adapter {policy_source.source} -> {output} (base model {base})"
    base = save_merged(policy_source.base_model, policy_source.folder, output)
    return f"merged {policy_source.source} into {base} -> {output}"
