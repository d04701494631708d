"""Several question files from the command line (issue 11, item 8): Kedro 1.7's ``--params`` splits on every
comma, so a list of several files goes through ``kedro run --config <file>`` or a conf env (docs/data.md,
"Questions and corpus"). Checked through Kedro's own CLI command and config loader; the session is replaced by a
recorder."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner
from kedro.framework.cli.project import run
from kedro.framework.session import KedroSession

from prorag.config_loader import CONFIG_LOADER_ARGS
from prorag.config_loader import ProjectConfigLoader as OmegaConfigLoader

TWO_FILES = ["data/01_raw/qa/hotpotqa.jsonl", "data/01_raw/qa/nq.jsonl"]


class RecordingSession:
    """Stands in for the Kedro session: records what the CLI would have run."""

    created: ClassVar[dict[str, Any]] = {}
    ran: ClassVar[dict[str, Any]] = {}

    def __enter__(self) -> RecordingSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass

    def run(self, **kwargs: Any) -> dict[str, Any]:
        type(self).ran = kwargs
        return {}


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> type[RecordingSession]:
    def create(**kwargs: Any) -> RecordingSession:
        RecordingSession.created = kwargs
        return RecordingSession()

    monkeypatch.setattr(KedroSession, "create", staticmethod(create))
    return RecordingSession


def parameters(conf: Path, *, env: str | None = None, runtime_params: dict[str, Any] | None = None) -> dict:
    loader = OmegaConfigLoader(str(conf), env=env, runtime_params=runtime_params, **CONFIG_LOADER_ARGS)
    return loader["parameters"]


def test_params_with_a_list_of_several_files_is_split_by_kedro(recorded):
    result = CliRunner().invoke(run, ["--params", f"data_preparation.question_files=[{','.join(TWO_FILES)}]"])
    assert result.exit_code != 0 and "must contain a key and a value" in result.output


def test_a_run_config_file_carries_a_list_of_several_files(recorded, project_copy, tmp_path):
    config = tmp_path / "my_run.yml"
    config.write_text("run:\n  pipelines: data_preparation\n  params:\n    data_preparation:\n"
                      f"      question_files: [{', '.join(TWO_FILES)}]\n", encoding="utf-8")
    result = CliRunner().invoke(run, ["--config", str(config)])
    assert result.exit_code == 0, result.output
    runtime_params = recorded.created["runtime_params"]
    assert runtime_params == {"data_preparation": {"question_files": TWO_FILES}}
    assert recorded.ran["pipeline_names"] == ["data_preparation"]
    merged = parameters(project_copy / "conf", runtime_params=runtime_params)["data_preparation"]
    assert merged["question_files"] == TWO_FILES
    assert len(merged["corpus_files"]) == 5  # the other keys of the namespace are kept


def test_a_conf_env_carries_a_list_of_several_files(project_copy):
    env = project_copy / "conf" / "mydata"
    env.mkdir()
    (env / "parameters_data_preparation.yml").write_text(
        "data_preparation:\n  question_files:\n" + "".join(f"    - {path}\n" for path in TWO_FILES),
        encoding="utf-8")
    merged = parameters(project_copy / "conf", env="mydata")["data_preparation"]
    assert merged["question_files"] == TWO_FILES and len(merged["corpus_files"]) == 5


def test_the_documented_run_config_example_works(recorded, project_root, tmp_path):
    readme = (project_root / "docs" / "data.md").read_text(encoding="utf-8")
    (example,) = [block for block in re.findall(r"```yaml\n(.*?)```", readme, flags=re.DOTALL) if "run:" in block]
    config = tmp_path / "my_run.yml"
    config.write_text(example, encoding="utf-8")
    result = CliRunner().invoke(run, ["--config", str(config)])
    assert result.exit_code == 0, result.output
    files = recorded.created["runtime_params"]["data_preparation"]["question_files"]
    assert len(files) == 2 and recorded.ran["pipeline_names"] == ["train"]
