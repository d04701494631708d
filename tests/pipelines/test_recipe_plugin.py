"""A method with its own loop, as a plug-in: a :class:`~prorag.recipes.Recipe` in a package outside ``src/``
(``my_recipes.loop:OWN_LOOP``), named by dotted path in a ``methods`` entry, becomes ``train_<name>`` reading the
method's parameters — with no edit to the recipe registry, ``methods.py``, ``pipeline_registry.py`` or anything
under ``src/`` (issue 45, item 1)."""

from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from prorag import pipeline_registry
from prorag.config import ParameterError
from prorag.plugins import PluginError
from prorag.recipes import Recipe, UnknownRecipeError, get_recipe

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "my_recipes.loop:OWN_LOOP"
MODULE = '''
    from kedro.pipeline import Node, Pipeline, pipeline

    from prorag.recipes import Recipe


    def own_loop(questions, agent, rl):
        """The method's own training loop (here: what it would train on, and with which settings)."""
        return {"questions": len(questions), "protocol": agent["protocol"], "seed": rl["trainer"]["seed"]}


    def build(stages, name, method):
        loop = Pipeline([Node(own_loop, ["evaluated_questions", "params:agent", "params:rl"], method["adapter"],
                              name="own_loop")])
        return stages.evaluated + pipeline(loop, namespace=name, prefix_datasets_with_namespace=False)


    OWN_LOOP = Recipe(("rl",), build, description="a loop of its own over the shared rl block")
    OWN_TRAINER = Recipe(("own",), build, description="a loop with a trainer block of its own",
                         trainers={"own.trainer": "sft"})
    NOT_A_RECIPE = build
'''


@pytest.fixture
def my_recipes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``my_recipes`` written to a folder outside ``src/`` and put on ``sys.path`` (as ``PYTHONPATH`` would)."""
    package = tmp_path / "user_code" / "my_recipes"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "loop.py").write_text(textwrap.dedent(MODULE), encoding="utf-8")
    monkeypatch.syspath_prepend(str(package.parent))
    yield package
    for name in [name for name in sys.modules if name == "my_recipes" or name.startswith("my_recipes.")]:
        del sys.modules[name]


def _methods(tmp_path: Path, entry: dict) -> dict:
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    (tmp_path / "conf" / "local" / "parameters_methods.yml").write_text(yaml.safe_dump({"methods": {"own": entry}}))
    return pipeline_registry.configured_methods(tmp_path)


def test_nothing_under_src_names_the_plug_in_recipe():
    assert not [path for path in (ROOT / "src").rglob("*.py") if "my_recipes" in path.read_text(encoding="utf-8")]


def test_a_recipe_named_by_path_builds_train_name_from_its_entry(my_recipes, tmp_path, monkeypatch):
    methods = _methods(tmp_path, {"recipe": RECIPE, "adapter": "own_adapter", "agent": {"step_budget": 2},
                                  "stages": {"rl": {"trainer": {"seed": 7}}}})
    own = methods["own"]
    assert set(own["stages"]) == {"rl"} and own["stages"]["rl"]["trainer"]["seed"] == 7
    assert own["agent"]["step_budget"] == 2 and "value" not in own
    monkeypatch.setattr(pipeline_registry, "configured_methods", lambda: methods)
    pipelines = pipeline_registry.register_pipelines()
    loop = next(node for node in pipelines["train_own"].nodes if node.name == "own.own_loop")
    assert sorted(loop.inputs) == ["evaluated_questions", "params:methods.own.agent", "params:methods.own.stages.rl"]
    assert loop.outputs == ["own_adapter"]
    assert "rollout.select_rollout_questions" in {node.name for node in pipelines["train_own"].nodes}
    run = loop.run({"evaluated_questions": [{}, {}], "params:methods.own.agent": own["agent"],
                    "params:methods.own.stages.rl": own["stages"]["rl"]})
    assert run == {"own_adapter": {"questions": 2, "protocol": own["agent"]["protocol"], "seed": 7}}


def test_an_entry_s_stages_are_its_recipe_s(my_recipes, tmp_path):
    with pytest.raises(ParameterError, match=r"methods\.own\.stages: \['sft'\] are not stages of recipe "
                                             r"'my_recipes\.loop:OWN_LOOP' \(rl\)"):
        _methods(tmp_path, {"recipe": RECIPE, "adapter": "own_adapter", "stages": {"sft": {"max_steps": 1}}})


def test_a_recipe_that_is_not_one_is_named():
    assert isinstance(get_recipe("tearag"), Recipe)
    with pytest.raises(UnknownRecipeError, match=r"unknown recipe 'sft_rll'; did you mean 'sft_rl'\?"):
        get_recipe("sft_rll")
    with pytest.raises(PluginError, match=r"recipe 'no_such_package\.recipes:R': cannot import"):
        get_recipe("no_such_package.recipes:R")


def test_a_path_to_something_else_is_refused(my_recipes):
    with pytest.raises(PluginError, match=r"recipe 'my_recipes\.loop:NOT_A_RECIPE' names .* not a "
                                          r"prorag\.recipes\.Recipe"):
        get_recipe("my_recipes.loop:NOT_A_RECIPE")


def test_a_plug_in_recipe_s_trainer_block_gets_compute_and_the_gpu_preflight(my_recipes, tmp_path):
    """A trainer block only a plug-in recipe has (``methods.own.stages.own.trainer``, declared by
    :attr:`Recipe.trainers`) is given the shared ``compute`` keys like the built-in ones, and the GPU preflight
    estimates it and refuses it by its own knob; before, the preflight's table named the 5 built-in blocks only."""
    from prorag.config_loader import CONFIG_LOADER_ARGS, ProjectConfigLoader
    from prorag.methods import trainer_blocks
    from prorag.scale.memory import MemoryPlanError
    from prorag.scale.preflight import preflight, trainer_loads

    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    methods = tmp_path / "conf" / "base" / "parameters_methods.yml"
    shipped = yaml.safe_load(methods.read_text(encoding="utf-8"))
    entry = {"recipe": "my_recipes.loop:OWN_TRAINER", "adapter": "own_adapter",
             "stages": {"own": {"trainer": {"per_device_train_batch_size": 2, "max_length": 4096}}}}

    def parameters(env: str) -> dict:
        methods.write_text(yaml.safe_dump({"methods": {**shipped["methods"], "own": entry}}), encoding="utf-8")
        loader = ProjectConfigLoader(str(tmp_path / "conf"), **{**CONFIG_LOADER_ARGS, "default_run_env": env})
        return loader["parameters"]

    laptop = parameters("local")["methods"]["own"]["stages"]["own"]["trainer"]
    assert (laptop["dtype"], laptop["use_cpu"]) == ("float32", True)
    gpu = parameters("gpu")
    assert trainer_blocks(gpu)["own.trainer"] == "sft"
    assert gpu["methods"]["own"]["stages"]["own"]["trainer"]["use_cpu"] is False
    load = next(load for load in trainer_loads(gpu, trainer_blocks(gpu)) if load.stage == "own")
    assert (load.knob, load.micro_batch, load.sequence) == ("methods.own.stages.own.trainer.", 2, 4096)
    entry["stages"]["own"]["trainer"]["per_device_train_batch_size"] = 4096
    too_big = parameters("gpu")
    with pytest.raises(MemoryPlanError, match=r"methods\.own\.stages\.own\.trainer\.per_device_train_batch_size"):
        preflight(too_big, trainer_blocks(too_big))
