"""The registered pipelines as kedro-viz and ``kedro run`` see them: layers that never go backwards, a namespace per
stage, kind and method tags, and README commands that name registered pipelines, nodes, namespaces and tags."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
from kedro.pipeline import Pipeline

from prorag.config_loader import ProjectConfigLoader as OmegaConfigLoader
from prorag.pipeline_registry import register_pipelines
from prorag.pipelines import tags
from prorag.settings import CONFIG_LOADER_ARGS

LAYERS = ("raw", "intermediate", "primary", "feature", "model_input", "models", "model_output", "reporting")
"""Kedro's data-engineering convention, in order."""
STAGES = ("data_preparation", "corpus_indexing", "rollout", "evaluation", "reward_judging", "sft_synthesis", "sft",
          "rl", "kg_extraction", "reasonrag_data", "dpo", "tearag")


@pytest.fixture(scope="module")
def pipelines() -> dict[str, Pipeline]:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # e.g. Kedro's "Namespace 'x' is interrupted by nodes ..."
        return register_pipelines()


@pytest.fixture(scope="module")
def catalog_config(request: pytest.FixtureRequest) -> dict[str, dict]:
    conf = Path(request.config.rootpath) / "conf"
    return dict(OmegaConfigLoader(str(conf), **CONFIG_LOADER_ARGS)["catalog"])


def _layer(catalog_config: dict[str, dict], dataset: str) -> str | None:
    entry = catalog_config.get(dataset)
    return ((entry or {}).get("metadata") or {}).get("kedro-viz", {}).get("layer")


def _layered_successors(pipeline: Pipeline, catalog_config: dict[str, dict], dataset: str) -> set[str]:
    """The nearest datasets with a layer that ``dataset`` feeds, through nodes and datasets without a layer (as
    kedro-viz orders layers)."""
    found: set[str] = set()
    pending, seen = [dataset], {dataset}
    while pending:
        current = pending.pop()
        for node in pipeline.nodes:
            if current not in node.inputs:
                continue
            for output in set(node.outputs) - seen:
                seen.add(output)
                (found.add if _layer(catalog_config, output) else pending.append)(output)
    return found


def test_every_persisted_dataset_has_a_conventional_layer(catalog_config):
    for name, entry in catalog_config.items():
        if name.startswith("_") or entry.get("type") == "MemoryDataset":
            continue
        assert _layer(catalog_config, name) in LAYERS, f"{name}: metadata.kedro-viz.layer"


def test_layers_never_go_backwards_along_any_registered_pipeline(pipelines, catalog_config):
    backwards = []
    for pipeline_name, pipeline in pipelines.items():
        for dataset in sorted(pipeline.all_inputs() | pipeline.all_outputs()):
            layer = _layer(catalog_config, dataset)
            if layer is None:
                continue
            for successor in sorted(_layered_successors(pipeline, catalog_config, dataset)):
                later = _layer(catalog_config, successor)
                if LAYERS.index(later) < LAYERS.index(layer):
                    backwards.append(f"{pipeline_name}: {dataset} ({layer}) -> {successor} ({later})")
    assert not backwards, "\n".join(backwards)


def test_the_graph_starts_at_the_raw_layer(pipelines, catalog_config):
    free = {name for name in pipelines["train"].inputs() if not name.startswith("params:")}
    assert {"raw_question_files", "raw_corpus_files"} <= free
    assert {_layer(catalog_config, name) for name in free} == {"raw"}


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_is_one_namespace_with_its_datasets_unprefixed(pipelines, stage):
    assert {node.namespace for node in pipelines[stage].nodes} == {stage}
    assert not {name for name in pipelines[stage].all_inputs() | pipelines[stage].all_outputs()
                if name.startswith(f"{stage}.")}


def test_every_node_is_namespaced_and_trained_policies_share_their_trainer_s(pipelines):
    for name, pipeline in pipelines.items():
        assert all(node.namespace for node in pipeline.nodes), name
    names = {node.name for node in pipelines["train"].nodes}
    assert {"sft.train_sft", "sft.run_policy_rollouts", "rl.train_rl", "rl.run_policy_rollouts",
            "evaluation.concat_trajectories"} <= names
    assert "dpo.run_policy_rollouts" in {node.name for node in pipelines["train_reasonrag"].nodes}


def test_every_node_has_one_kind_tag_and_method_tags_only(pipelines):
    for pipeline in pipelines.values():
        for node in pipeline.nodes:
            assert len(node.tags & tags.KINDS) == 1, node.name
            assert node.tags - tags.KINDS <= tags.METHODS, node.name


def test_method_tags_select_the_method_s_own_stages(pipelines):
    def tagged(pipeline: str, *wanted: str) -> set[str]:
        return {node.name for node in pipelines[pipeline].only_nodes_with_tags(*wanted).nodes}

    assert tagged("train", tags.HIPRAG) == tagged("train", tags.MULTISTAGE) == {
        "sft_synthesis.synthesize_sft_data", "sft.train_sft", "sft.run_policy_rollouts", "rl.select_rl_questions",
        "rl.train_rl", "rl.run_policy_rollouts"}
    assert tagged("train", tags.EVALUATION) == {"corpus_indexing.evaluate_retrieval", "evaluation.concat_trajectories",
                                                "evaluation.evaluate_trajectories", "evaluation.summarize_results",
                                                "reward_judging.judge_trajectories"}
    assert {node.namespace for node in pipelines["train_tearag"].only_nodes_with_tags(tags.TEARAG).nodes} == {
        "kg_extraction", "tearag"}
    assert {node.namespace for node in pipelines["train_reasonrag"].only_nodes_with_tags(tags.REASONRAG).nodes} == {
        "reasonrag_data", "dpo"}


def _documents(root: Path) -> dict[str, str]:
    paths = [root / "README.md", root / "Makefile", *sorted((root / "experiments").glob("*.py")),
             *sorted((root / "experiments").glob("*.yml"))]
    return {path.name: path.read_text(encoding="utf-8") for path in paths}


def test_every_pipeline_the_readme_and_experiments_name_is_registered(pipelines, project_root):
    named: dict[str, set[str]] = {}
    for document, text in _documents(project_root).items():
        found = set(re.findall(r"--pipeline[= ]([A-Za-z_]\w*)", text))
        found |= set(re.findall(r"pipeline_names=\[\"(\w+)\"", text))
        found |= set(re.findall(r"^\s*pipelines: (\w+)", text, flags=re.MULTILINE))
        if document == "README.md":  # the first column of the pipeline table
            found |= set(re.findall(r"^\| `(\w+)` \|", text, flags=re.MULTILINE))
        named[document] = found
    assert len(named["README.md"]) >= 10
    unknown = {document: sorted(found - set(pipelines)) for document, found in named.items() if found - set(pipelines)}
    assert not unknown


def test_readme_node_namespace_and_tag_options_resolve(pipelines, project_root):
    readme = (project_root / "README.md").read_text(encoding="utf-8")
    default = pipelines["__default__"]
    options = re.findall(r"--(nodes|to-nodes|from-nodes|namespaces|tags)=(\w[\w.,]*)", readme)
    assert {"to-nodes", "nodes", "namespaces", "tags"} <= {option for option, _ in options}
    for option, value in options:
        names = value.split(",")
        if option == "nodes":
            assert default.filter(node_names=names).nodes
        elif option == "to-nodes":
            assert default.filter(to_nodes=names).nodes
        elif option == "from-nodes":
            assert default.filter(from_nodes=names).nodes
        elif option == "namespaces":
            assert default.only_nodes_with_namespaces(names).nodes
        else:
            assert set(names) <= tags.KINDS | tags.METHODS
    to_sft = {node.name for node in default.filter(to_nodes=["sft.train_sft"]).nodes}
    assert "data_preparation.load_question_files" in to_sft and "rl.train_rl" not in to_sft


def test_a_methods_entry_is_a_training_pipeline(monkeypatch, tmp_path):
    """A fifth method declared in conf/local (a reward kind and a recipe) gets ``train_<name>``: the recipe's stages
    reading the method's parameters, its adapter saved under the entry's name."""
    import shutil

    import yaml

    from prorag import pipeline_registry

    shutil.copytree(Path(__file__).resolve().parents[1] / "conf", tmp_path / "conf")
    (tmp_path / "conf" / "local" / "parameters_methods.yml").write_text(yaml.safe_dump({"methods": {"info_gain": {
        "recipe": "rl_from_sft", "adapter": "info_gain_adapter", "reward": {"kind": "search_r1", "lambda_f": 0.1}}}}))
    methods = pipeline_registry.configured_methods(tmp_path)
    assert methods["info_gain"]["reward"]["lambda_f"] == 0.1 and methods["info_gain"]["agent"] == \
        methods["hiprag"]["agent"]
    monkeypatch.setattr(pipeline_registry, "configured_methods", lambda: methods)
    built = pipeline_registry.register_pipelines()["train_info_gain"]
    train = next(node for node in built.nodes if node.name.endswith("rl.train_rl"))
    assert {"params:methods.info_gain.reward", "params:methods.info_gain.agent",
            "params:methods.info_gain.stages.rl"} <= set(train.inputs)
    assert train.outputs[0] == "info_gain_adapter" and "sft_adapter" in train.inputs
