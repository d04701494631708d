"""The registered pipelines as kedro-viz and ``kedro run`` see them: layers that never go backwards, a namespace per
stage, kind and method tags, and README commands that name registered pipelines, nodes, namespaces and tags."""

from __future__ import annotations

import re
import subprocess
import warnings
from pathlib import Path

import pytest
from kedro.pipeline import Pipeline

from prorag.config_loader import CONFIG_LOADER_ARGS
from prorag.config_loader import ProjectConfigLoader as OmegaConfigLoader
from prorag.pipeline_registry import register_pipelines
from prorag.pipelines import tags

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


DOCS_OWNED_ELSEWHERE = ("methods.md", "scaling.md", "serving.md")
"""Docs other engineers maintain: their pipelines and make targets are checked, their file paths are reported."""


def _documents(root: Path) -> dict[str, str]:
    paths = [root / "README.md", root / "Makefile", *sorted((root / "docs").glob("*.md")), root / "conf" / "README.md",
             *sorted((root / "experiments").glob("*.py")), *sorted((root / "experiments").glob("*.yml"))]
    return {str(path.relative_to(root)): path.read_text(encoding="utf-8") for path in paths}


def _markdown(root: Path) -> dict[str, str]:
    return {name: text for name, text in _documents(root).items() if name.endswith(".md")}


def test_every_pipeline_the_readme_docs_and_experiments_name_is_registered(pipelines, project_root):
    named: dict[str, set[str]] = {}
    for document, text in _documents(project_root).items():
        text = re.sub(r"^```text\n.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)  # shown output, typos on purpose
        found = set(re.findall(r"--pipelines?[= ]([A-Za-z_]\w*)", text))
        found |= set(re.findall(r"pipeline_names=\[\"(\w+)\"", text))
        found |= set(re.findall(r"^\s*pipelines: (\w+)", text, flags=re.MULTILINE))
        if document.endswith(".md"):  # the first column of a pipeline table
            found |= {name for cell in re.findall(r"^\| (`\w+`(?:, `\w+`)*) \|", text, flags=re.MULTILINE)
                      for name in re.findall(r"`(\w+)`", cell)} & _pipeline_table_names(text)
        named[document] = found
    assert len(named["README.md"]) >= 12
    unknown = {document: sorted(found - set(pipelines)) for document, found in named.items() if found - set(pipelines)}
    assert not unknown


def _pipeline_table_names(text: str) -> set[str]:
    """First-column names of the tables whose header starts with ``| pipeline |``."""
    names: set[str] = set()
    for table in re.findall(r"^\| pipeline \|.*?(?=^[^|]|\Z)", text, flags=re.MULTILINE | re.DOTALL):
        for cell in re.findall(r"^\| ([^|]+) \|", table, flags=re.MULTILINE):
            names |= set(re.findall(r"`(\w+)`", cell))
    return names


def test_the_readme_lists_every_training_pipeline(pipelines, project_root):
    readme = (project_root / "README.md").read_text(encoding="utf-8")
    training = {name for name in pipelines if name.startswith("train")}
    assert training <= _pipeline_table_names(readme)
    assert _pipeline_table_names(readme) <= set(pipelines)


def test_no_document_uses_the_deprecated_pipeline_option(project_root):
    """Kedro 1.7 deprecates ``--pipeline``; everything the project owns says ``--pipelines``."""
    owned = {name: text for name, text in _documents(project_root).items()
             if not name.endswith(DOCS_OWNED_ELSEWHERE)}
    sources = [*(project_root / "src").rglob("*.py"), *(project_root / "conf").rglob("*.yml"),
               *(project_root / "notebooks").glob("*.ipynb"), *(project_root / "benchmarks").glob("*.py")]
    owned |= {str(path.relative_to(project_root)): path.read_text(encoding="utf-8") for path in sources
              if "compare" not in path.name and "compare" not in path.parent.name and path.name != "catalog.yml"}
    assert {name for name, text in owned.items() if re.search(r"--pipeline[= ]", text)} == set()


def test_make_targets_the_docs_name_exist(project_root):
    makefile = (project_root / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([\w-]+):", makefile, flags=re.MULTILINE))
    named = {target for text in _markdown(project_root).values()
             for target in re.findall(r"(?<![\w/.])make ([a-z][\w-]*)", text)}
    assert {"train", "test", "mlflow-ui", "viz"} <= named
    assert named - targets == set()


PATH_ROOTS = ("conf/", "src/", "tests/", "docs/", "data/", "benchmarks/", "experiments/", "notebooks/", "requirements/")


def _named_paths(text: str) -> set[str]:
    """Repository paths a document names in code spans: ``conf/base/x.yml``, ``src/prorag/...``; a placeholder
    (``<version>``, ``…``, ``*``, ``{a,b}``) ends the checked part of the path, which is then a prefix."""
    found = set()
    for span in re.findall(r"`([^`\n]+)`", text):
        for token in span.split():
            token = token.strip("()[],;:'\"")
            if token.startswith(PATH_ROOTS):
                found.add(re.split(r"[<…*{]", token)[0])
    return found


GENERATED = ("data/runs", "data/02_intermediate", "data/03_primary", "data/04_feature", "data/05_model_input",
             "data/06_models", "data/07_model_output", "data/08_reporting")
"""Folders runs write into: a file named there need not exist yet (the catalog layers are checked elsewhere)."""


def _exists(root: Path, path: str) -> bool:
    if path.startswith(GENERATED):
        return True
    if (root / path).exists() or (path and any(root.glob(path + "*"))):
        return True  # a path, or the prefix before a placeholder (conf/base/parameters_<pipeline>.yml)
    ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=root, check=False)
    return ignored.returncode == 0  # a file the user creates and git ignores (conf/local/credentials.yml)


def test_every_repository_path_the_readme_and_docs_name_exists(project_root):
    missing = {document: sorted(path for path in _named_paths(text) if not _exists(project_root, path))
               for document, text in _markdown(project_root).items() if not document.endswith(DOCS_OWNED_ELSEWHERE)}
    assert not {document: paths for document, paths in missing.items() if paths}


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def test_every_link_between_documents_resolves(project_root):
    broken = []
    for document, text in _markdown(project_root).items():
        base = (project_root / document).parent
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"https?://", target):
                continue
            path, _, anchor = target.partition("#")
            file = (base / path) if path else project_root / document
            if not file.exists():
                broken.append(f"{document}: {target}")
            elif anchor and anchor not in {_slug(line.lstrip("#")) for line in
                                           file.read_text(encoding="utf-8").splitlines() if line.startswith("#")}:
                broken.append(f"{document}: {target} (no such heading)")
    assert not broken


README_LIMIT = 15_000


def test_the_readme_fits_the_job(project_root):
    readme = (project_root / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode("utf-8")) <= README_LIMIT
    assert "2601.21912" in readme  # not the ProRAG paper's code
    for heading in ("## The two commands", "## What the first run shows", "## Methods side by side"):
        assert heading in readme


_NUMBER = re.compile(r"(?<![\w.\-/@])[−+-]?\d+(?:[.,]\d+)*(?:\s?%|x\b)?(?![\w/])")
_NOT_A_MEASUREMENT = re.compile(
    r"`[^`]*`"                      # commands, keys, paths, file names
    r"|\]\([^)]*\)"                # link targets
    r"|arXiv \d+\.\d+"              # the ProRAG paper's id
    r"|Python \d+\.\d+\+?"           # requirements
    r"|\beq\. \d+|λp = 0|http://\S+"  # equation numbers, the Search-R1 setting, local URLs
)


def _blocks(text: str) -> list[str]:
    """Paragraphs and tables (fenced code removed); a ``source:`` line right after a table belongs to it."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return [block for block in re.split(r"\n\s*\n", text) if block.strip()]


def test_every_number_in_the_readme_has_a_source(project_root):
    """The convention: a table or paragraph that states a measured number carries a ``source:`` line naming the
    command that produced it (a registered pipeline's ``kedro run``, a make target, a script under benchmarks/,
    experiments/ or scripts/)."""
    readme = (project_root / "README.md").read_text(encoding="utf-8")
    blocks = _blocks(readme)
    unsourced = []
    for index, block in enumerate(blocks):
        if block.lstrip().startswith(("#", "source:")):
            continue
        numbers = _NUMBER.findall(_NOT_A_MEASUREMENT.sub(" ", block))
        following = blocks[index + 1] if index + 1 < len(blocks) else ""
        source = next((line for line in (block + "\n" + following).splitlines() if line.startswith("source:")), None)
        if numbers and source is None:
            unsourced.append((numbers, block[:120]))
        if source is not None:
            assert re.search(r"`(kedro run --pipelines=\w+|make [\w-]+|\.venv/bin/python (benchmarks|experiments|"
                             r"scripts)/\w+\.py)", source), source
    assert not unsourced
    assert sum(line.startswith("source:") for line in readme.splitlines()) >= 1


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


def test_reasonrag_stage_pipelines_run_alone_explore_with_and_continue_the_recipe_s_cold_start(pipelines):
    """``reasonrag_data`` and ``dpo`` alone do what ``train_reasonrag`` does with them (recipe sft_mcts_dpo): the
    MCTS explores with the cold-start adapter and DPO continues it (the base SmolLM2 alone finds no pair)."""
    from prorag.recipes.mcts_dpo import cold_start_adapter

    for stage in ("reasonrag_data", "dpo"):
        assert "reasonrag_sft_adapter" in pipelines[stage].inputs(), stage
        alone = {node.name: sorted(node.inputs) for node in pipelines[stage].nodes}
        within = {node.name: sorted(node.inputs) for node in pipelines["train_reasonrag"].nodes if node.name in alone}
        assert alone == within, stage
    assert cold_start_adapter("reasonrag", {"recipe": "mcts_dpo"}) is None


def test_conf_is_read_once_for_the_validation_hook_and_the_pipelines(monkeypatch, tmp_path):
    """One ``kedro run`` builds its pipelines from one read of conf/base + conf/local: the validation hook's
    method check and the registry share it (issue 45, item 5); a changed file is read afresh."""
    import shutil

    from prorag import config_loader, pipeline_registry

    shutil.copytree(Path(__file__).resolve().parents[1] / "conf", tmp_path / "conf")
    reads: list[str] = []
    original = config_loader.ProjectConfigLoader.__getitem__

    def counted(self: config_loader.ProjectConfigLoader, key: str) -> dict:
        if key == "parameters":
            reads.append(str(self.conf_source))
        return original(self, key)

    monkeypatch.setattr(config_loader.ProjectConfigLoader, "__getitem__", counted)
    monkeypatch.chdir(tmp_path)
    first = config_loader.configured_methods(tmp_path)  # what the validation hook reads
    first["hiprag"]["recipe"] = "changed by a caller"
    built = pipeline_registry.register_pipelines()
    assert reads == [str(tmp_path / "conf")] and "train_hiprag" in built
    assert config_loader.configured_methods(tmp_path)["hiprag"]["recipe"] == "sft_rl"  # a copy each time
    (tmp_path / "conf" / "local" / "parameters_methods.yml").write_text(
        "methods:\n  extra:\n    recipe: rl_from_sft\n    adapter: extra_adapter\n", encoding="utf-8")
    assert "extra" in config_loader.configured_methods(tmp_path) and len(reads) == 2


def test_a_recipe_s_own_stages_run_alone_train_the_first_method_with_it_whatever_its_name(monkeypatch, tmp_path):
    """The stage pipelines of a recipe's own loop (``Recipe.own_stages``) belong to the first method with that
    recipe, not to a method named ``reasonrag`` or ``tearag``: renamed, ReasonRAG's ``reasonrag_data`` still
    explores with its cold start and reads its parameters, and TeaRAG's top-level block gets its agent."""
    import shutil

    import yaml

    from prorag import pipeline_registry
    from prorag.config_loader import CONFIG_LOADER_ARGS, ProjectConfigLoader

    shutil.copytree(Path(__file__).resolve().parents[1] / "conf", tmp_path / "conf")
    methods_file = tmp_path / "conf" / "base" / "parameters_methods.yml"
    conf = yaml.safe_load(methods_file.read_text())
    renamed = {("my_mcts" if name == "reasonrag" else "my_tea" if name == "tearag" else name): entry
               for name, entry in conf["methods"].items()}
    renamed["my_tea"]["agent"] = {**renamed["my_tea"].get("agent", {}), "step_budget": 2}
    methods_file.write_text(yaml.safe_dump({**conf, "methods": renamed}))
    methods = pipeline_registry.configured_methods(tmp_path)
    monkeypatch.setattr(pipeline_registry, "configured_methods", lambda: methods)
    pipelines = pipeline_registry.register_pipelines()
    assert "my_mcts_sft_adapter" in pipelines["reasonrag_data"].inputs()
    mcts = next(node for node in pipelines["reasonrag_data"].nodes if node.name.endswith("run_reasonrag_mcts"))
    assert "params:methods.my_mcts.value" in mcts.inputs
    assert any("params:methods.my_tea." in name for name in pipelines["tearag"].inputs())
    loader = ProjectConfigLoader(str(tmp_path / "conf"), **CONFIG_LOADER_ARGS)
    assert loader["parameters"]["tearag"]["agent"]["step_budget"] == 2  # the top-level block: my_tea's agent
