import re
import tomllib
from importlib.metadata import version

import yaml


def _pyproject(project_root):
    return tomllib.loads((project_root / "pyproject.toml").read_text())


def test_legacy_kedro_yml_agrees_with_pyproject(project_root):
    legacy = yaml.safe_load((project_root / ".kedro.yml").read_text())
    kedro = _pyproject(project_root)["tool"]["kedro"]
    assert legacy["project_name"] == kedro["project_name"]
    assert legacy["package_name"] == kedro["package_name"]
    assert legacy["source_dir"] == kedro["source_dir"]
    assert "pyproject.toml" in (project_root / ".kedro.yml").read_text().splitlines()[1]


def test_installed_versions_match_the_pins(project_root):
    project = _pyproject(project_root)["project"]
    pins = project["dependencies"] + project["optional-dependencies"]["dev"]
    checked = 0
    for requirement in pins:
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)(\[[^\]]+\])?==([^;\s]+)", requirement)
        if match is None:
            continue
        name, _, pinned = match.groups()
        assert version(name).split("+")[0] == pinned, f"{name} {version(name)} installed, {pinned} pinned"
        checked += 1
    assert checked >= 20


def test_the_gpu_stack_is_the_lock_not_an_extra(project_root):
    """`.[gpu]` cannot resolve (vllm 0.30 needs fastapi<0.137) and would put faiss-gpu beside faiss-cpu; the GPU
    stack is requirements/gpu.txt (tests/scale/test_gpu_lock.py checks it)."""
    project = _pyproject(project_root)["project"]
    assert "gpu" not in project.get("optional-dependencies", {})
    assert not any(dep.startswith("vllm") for dep in project["dependencies"])
    assert (project_root / "requirements" / "gpu.txt").is_file()


def test_telemetry_is_off(project_root):
    assert yaml.safe_load((project_root / ".telemetry").read_text()) == {"consent": False}


# A feature named in the README or the package description exists as code (issue 11, item 9): the module that
# implements it must be importable. Other helpers add a feature here with the change that makes it run.
CLAIMS = {
    r"\bMCTS\b|Monte Carlo tree": "prorag.training.mcts",
    r"\bSPRE\b|shortest-path reward": "prorag.rewards.spre",
    r"\bDPO\b": "prorag.training.dpo",
    r"triplet": "prorag.kg",
    r"\bPPR\b|PageRank": "prorag.kg.kag",
}


def test_readme_and_description_claim_only_what_exists(project_root):
    import importlib.util

    description = _pyproject(project_root)["project"]["description"]
    for text, where in ((project_root.joinpath("README.md").read_text(encoding="utf-8"), "README.md"),
                        (description, "pyproject description")):
        for pattern, module in CLAIMS.items():
            if re.search(pattern, text, flags=re.IGNORECASE):
                assert importlib.util.find_spec(module) is not None, f"{where} claims {pattern!r}; {module} missing"
    assert "ReasonRAG" not in description and "TeaRAG" not in description
