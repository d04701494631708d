"""Inputs without a saved version: which registered pipeline to run first, on the real registry's shapes."""

from __future__ import annotations

import pytest

from prorag.pipeline_registry import register_pipelines
from prorag.tracking.missing_inputs import (
    MissingInputError,
    PipelineShape,
    check_inputs_have_versions,
    missing_input_line,
    producers,
)

RAW = {"raw_question_files", "raw_corpus_files"}


@pytest.fixture(scope="module")
def shapes() -> list[PipelineShape]:
    return [PipelineShape(name, frozenset(n for n in pipe.inputs() if not n.startswith("params:")),
                          frozenset(pipe.all_outputs()), len(pipe.nodes))
            for name, pipe in register_pipelines().items()]


def test_on_a_fresh_project_the_smallest_pipeline_that_can_run_comes_first(shapes):
    assert producers("sft_adapter", shapes, RAW.__contains__) == ["train_sft", "train"]
    assert producers("index_questions", shapes, RAW.__contains__)[0] == "index"


def test_a_smaller_pipeline_comes_first_once_its_inputs_exist(shapes):
    present = RAW | {"sft_trajectories"}
    assert producers("sft_adapter", shapes, present.__contains__) == ["sft", "train_sft", "train"]


def test_aliases_are_named_once(shapes):
    assert len({"train", "train_hiprag"} & set(producers("sft_adapter", shapes, lambda _: True))) == 1
    assert "__default__" not in producers("rl_adapter", shapes, lambda _: True)


def test_the_message_names_the_command_to_run():
    assert missing_input_line("sft_adapter", ["train_sft", "train"]) == (
        "sft_adapter has no version yet: run `kedro run --pipelines=train_sft` (or train) first")
    assert missing_input_line("x", []) == "x has no version yet, and no registered pipeline writes it"


def test_several_missing_inputs_are_reported_together(shapes):
    check_inputs_have_versions([], shapes, RAW.__contains__)  # nothing missing: no error
    with pytest.raises(MissingInputError) as error:
        check_inputs_have_versions(["sft_adapter", "retrieval_index"], shapes, RAW.__contains__)
    assert str(error.value).splitlines() == [
        "2 inputs of this run have no version yet:",
        "  retrieval_index has no version yet: run `kedro run --pipelines=index` "
        "(or train_sft, train) first",
        "  sft_adapter has no version yet: run `kedro run --pipelines=train_sft` (or train) first"]
