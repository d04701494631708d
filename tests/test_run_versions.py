"""Inputs come from completed runs that belong together (issue 11, item 3); a killed run is marked killed.

The hooks are driven as a Kedro session drives them (catalog created with the session's save version, then
``before_pipeline_run``, saves, ``after_pipeline_run`` / ``on_pipeline_error``), on versioned JSONL datasets in a
temporary project.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import mlflow
import pytest
from kedro.io import DataCatalog, Version
from kedro.pipeline import Pipeline, node

from prorag.datasets import JSONLinesDataset
from prorag.hooks.run_versions import RUN_MANIFEST_DIR, RunVersionHook
from prorag.tracking.run_manifest import RunManifest, RunManifests, RunVersionError, choose_load_versions

A, B, C, D, E, F = (f"2026-01-0{day}T00.00.00.000Z" for day in range(1, 7))
INDEXING = Pipeline([node(lambda: None, inputs=None, outputs=["index_questions", "retrieval_index"],
                          name="build_index")])
ROLLOUT = Pipeline([node(lambda q, i: None, inputs=["index_questions", "retrieval_index"], outputs="trajectories",
                         name="roll_out")])
JUDGING = Pipeline([node(lambda t, q: None, inputs=["trajectories", "index_questions"], outputs="judged",
                         name="judge")])
NAMES = ("index_questions", "retrieval_index", "trajectories", "judged")


def catalog_for(root: Path, save_version: str, load_versions: dict[str, str] | None = None) -> DataCatalog:
    load_versions = load_versions or {}
    return DataCatalog({name: JSONLinesDataset(filepath=str(root / "data" / f"{name}.jsonl"),
                                               version=Version(load_versions.get(name), save_version))
                        for name in NAMES})


def run(root: Path, run_id: str, pipeline: Pipeline, saves: dict[str, list[dict]], *, fail: bool = False,
        load_versions: dict[str, str] | None = None) -> dict[str, list[dict]]:
    """One 'kedro run': the hook pins the inputs, the inputs are loaded, ``saves`` are saved (then it fails)."""
    catalog = catalog_for(root, run_id, load_versions)
    hook = RunVersionHook()
    hook.after_catalog_created(catalog)
    hook.before_pipeline_run({"run_id": run_id, "project_path": str(root), "load_versions": load_versions or {},
                              "pipeline_names": ["test"]}, pipeline, catalog)
    loaded = {name: catalog.load(name) for name in sorted(pipeline.inputs())}
    for name, data in saves.items():
        catalog.save(name, data)
        hook.after_dataset_saved(name)
    if fail:
        hook.on_pipeline_error()
    else:
        hook.after_pipeline_run()
    return loaded


def manifest(root: Path, run_id: str) -> dict:
    return json.loads((root / RUN_MANIFEST_DIR / f"{run_id}.json").read_text(encoding="utf-8"))


def test_a_failed_run_s_outputs_are_not_mixed_with_a_completed_run_s(tmp_path):
    run(tmp_path, A, INDEXING, {"index_questions": [{"q": "A"}], "retrieval_index": [{"index": "A"}]})
    run(tmp_path, B, INDEXING, {"index_questions": [{"q": "B"}]}, fail=True)  # died before saving the index
    assert manifest(tmp_path, A)["status"] == "completed" and manifest(tmp_path, B)["status"] == "failed"
    assert manifest(tmp_path, A)["saved"] == {"index_questions": A, "retrieval_index": A}
    loaded = run(tmp_path, C, ROLLOUT, {"trajectories": [{"t": "C"}]})
    # Kedro alone would load index_questions of the failed run B with the index of run A.
    assert loaded == {"index_questions": [{"q": "A"}], "retrieval_index": [{"index": "A"}]}
    assert manifest(tmp_path, C)["loaded"] == {"index_questions": A, "retrieval_index": A}


def test_inputs_whose_lineages_disagree_fail_naming_both_versions(tmp_path):
    run(tmp_path, A, INDEXING, {"index_questions": [{"q": "A"}], "retrieval_index": [{"index": "A"}]})
    run(tmp_path, D, ROLLOUT, {"trajectories": [{"t": "D"}]})  # rolled out over the index of A
    run(tmp_path, E, INDEXING, {"index_questions": [{"q": "E"}], "retrieval_index": [{"index": "E"}]})
    with pytest.raises(RunVersionError, match=rf"index_questions {E}.*trajectories {D} was made from index_questions "
                                              rf"{A}|trajectories {D} was made from index_questions {A}.*{E}"):
        run(tmp_path, F, JUDGING, {"judged": []})
    assert not (tmp_path / RUN_MANIFEST_DIR / f"{F}.json").exists()
    loaded = run(tmp_path, F, JUDGING, {"judged": []}, load_versions={"index_questions": A})  # the way out
    assert loaded["index_questions"] == [{"q": "A"}]


def test_consistent_runs_of_separate_pipelines_pass(tmp_path):
    run(tmp_path, A, INDEXING, {"index_questions": [{"q": "A"}], "retrieval_index": [{"index": "A"}]})
    run(tmp_path, D, ROLLOUT, {"trajectories": [{"t": "D"}]})
    loaded = run(tmp_path, F, JUDGING, {"judged": []})
    assert loaded == {"trajectories": [{"t": "D"}], "index_questions": [{"q": "A"}]}


def test_a_dataset_s_lineage_is_what_it_was_made_from_not_everything_its_run_loaded(tmp_path):
    """A run that rebuilt ``index_questions`` and, in another branch, judged old trajectories does not tie the new
    ``index_questions`` to those trajectories (every-pipeline's ``judge`` after ``rollout_kag`` failed so in CI)."""
    branches = Pipeline([*INDEXING.nodes, node(lambda t: None, inputs="trajectories", outputs="judged",
                                               name="judge_old")])
    run(tmp_path, A, INDEXING, {"index_questions": [{"q": "A"}], "retrieval_index": [{"index": "A"}]})
    run(tmp_path, B, ROLLOUT, {"trajectories": [{"t": "B"}]})
    run(tmp_path, C, branches, {"index_questions": [{"q": "C"}], "retrieval_index": [{"index": "C"}],
                                "judged": []})
    assert manifest(tmp_path, C)["loaded"] == {"trajectories": B}
    assert manifest(tmp_path, C)["sources"] == {"index_questions": [], "judged": ["trajectories"],
                                                "retrieval_index": []}
    run(tmp_path, D, ROLLOUT, {"trajectories": [{"t": "D"}]})  # over the index of C
    loaded = run(tmp_path, E, JUDGING, {"judged": []})
    assert loaded == {"trajectories": [{"t": "D"}], "index_questions": [{"q": "C"}]}
    assert RunManifests(tmp_path / RUN_MANIFEST_DIR).lineage("judged", C) == {
        "judged": C, "trajectories": B, "index_questions": A, "retrieval_index": A}  # B was rolled out over A


def test_a_manifest_without_sources_ties_its_outputs_to_everything_its_run_loaded(tmp_path):
    run(tmp_path, A, INDEXING, {"index_questions": [{"q": "A"}], "retrieval_index": [{"index": "A"}]})
    manifests = RunManifests(tmp_path / RUN_MANIFEST_DIR)
    manifests.write(RunManifest(run_id=B, status="completed", loaded={"index_questions": A, "trajectories": F},
                                saved={"retrieval_index": B}))
    assert RunManifests(tmp_path / RUN_MANIFEST_DIR).lineage("retrieval_index", B) == {
        "retrieval_index": B, "index_questions": A, "trajectories": F}


def test_only_runs_that_never_completed_is_an_error(tmp_path):
    run(tmp_path, B, INDEXING, {"index_questions": [{"q": "B"}], "retrieval_index": []}, fail=True)
    with pytest.raises(RunVersionError, match=rf"index_questions: no stored version comes from a completed run "
                                              rf"\({B} \(failed\)\)"):
        run(tmp_path, C, ROLLOUT, {})


def test_versions_saved_before_manifests_existed_still_load(tmp_path):
    manifests = RunManifests(tmp_path)
    assert choose_load_versions({"x": [B, A]}, manifests) == {"x": B}
    manifests.write(RunManifest(run_id=B, status="running"))
    assert choose_load_versions({"x": [B, A]}, RunManifests(tmp_path)) == {"x": A}


def test_a_pinned_version_that_is_not_stored_is_an_error_naming_the_stored_ones(tmp_path):
    manifests = RunManifests(tmp_path)
    assert choose_load_versions({"x": [B, A]}, manifests, {"x": A}) == {"x": A}
    with pytest.raises(RunVersionError, match=rf"--load-versions=x:{C}: x has no such version "
                                              rf"\(stored, newest first: {B}, {A}\)"):
        choose_load_versions({"x": [B, A]}, manifests, {"x": C})
    with pytest.raises(RunVersionError, match=r"\(stored, newest first: none\)"):
        choose_load_versions({"x": []}, manifests, {"x": C})


def test_a_pin_on_a_dataset_the_run_writes_is_refused_before_any_work(tmp_path):
    run(tmp_path, A, INDEXING, {"index_questions": [{"q": "A"}], "retrieval_index": [{"index": "A"}]})
    # Kedro would load the pinned index_questions of A in roll_out, beside this run's own retrieval_index (bug 7)
    with pytest.raises(RunVersionError, match=rf"^--load-versions=index_questions:{A}: index_questions is written "
                                              rf"by this run; --load-versions pins inputs only"):
        run(tmp_path, C, INDEXING + ROLLOUT, {"index_questions": [{"q": "C"}]},
            load_versions={"index_questions": A})
    assert not (tmp_path / RUN_MANIFEST_DIR / f"{C}.json").exists()
    assert not (tmp_path / "data" / "index_questions.jsonl" / C).exists()
    loaded = run(tmp_path, D, ROLLOUT, {"trajectories": []}, load_versions={"index_questions": A})  # an input: pinned
    assert loaded["index_questions"] == [{"q": "A"}] and manifest(tmp_path, D)["loaded"]["index_questions"] == A


KILLED_RUN = textwrap.dedent("""
    import os, signal, sys
    from kedro.io import DataCatalog
    from kedro.pipeline import Pipeline
    from prorag.hooks.mlflow_tracking import MlflowTrackingHook
    from prorag.hooks.run_versions import RunVersionHook
    catalog = DataCatalog({})
    params = {"run_id": sys.argv[1], "project_path": sys.argv[2], "pipeline_names": ["long"]}
    hooks = [MlflowTrackingHook(), RunVersionHook()]
    for hook in hooks:
        hook.after_catalog_created(catalog)
        hook.before_pipeline_run(params, Pipeline([]), catalog)
    print("running", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)  # what `kill <pid>` or a scheduler's time limit sends
    signal.pause()
""")


@pytest.mark.integration
def test_a_killed_run_is_marked_killed_in_mlflow_and_its_manifest(tmp_path, mlflow_uri):
    completed = subprocess.run([sys.executable, "-c", KILLED_RUN, A, str(tmp_path)], capture_output=True,
                               text=True, timeout=120, env={**os.environ, "MLFLOW_TRACKING_URI": mlflow_uri})
    assert "running" in completed.stdout, completed.stderr[-2000:]
    assert completed.returncode == 128 + signal.SIGTERM
    (killed,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    assert killed.info.status == "KILLED" and killed.data.tags["kedro.session_id"] == A
    assert manifest(tmp_path, A)["status"] == "killed"


def test_compare_s_adapters_are_pinned_one_by_one_and_missing_ones_say_why(tmp_path, caplog, monkeypatch):
    """The adapters compare takes as optional inputs (its node's ``**artifacts``) are pinned as plain inputs are:
    the newest version from a completed run, or ``--load-versions``; an adapter whose versions all come from failed
    runs, or that has none, loads as Missing with the reason (compare lists the arm as skipped), never as the
    failed run's adapter; a required input without a version still fails the run."""
    from prorag.datasets import OptionalVersionDataset
    from prorag.hooks.run_versions import optional_inputs
    from prorag.tracking.missing_inputs import Available, Missing

    adapters = ("sft_adapter", "dpo_adapter", "rl_adapter", "tearag_adapter")

    def catalog(run_id: str, load_versions: dict[str, str] | None = None) -> DataCatalog:
        base = catalog_for(tmp_path, run_id, load_versions)
        for name in adapters:
            base[name] = JSONLinesDataset(filepath=str(tmp_path / "data" / f"{name}.jsonl"),
                                          version=Version((load_versions or {}).get(name), run_id))
        return base

    def train(run_id: str, name: str, fail: bool = False) -> None:
        data = catalog(run_id)
        hook = RunVersionHook()
        hook.after_catalog_created(data)
        hook.before_pipeline_run({"run_id": run_id, "project_path": str(tmp_path), "pipeline_names": ["t"]},
                                 Pipeline([node(lambda: None, None, name, name="train")]), data)
        data.save(name, [{"adapter": run_id}])
        hook.after_dataset_saved(name)
        hook.on_pipeline_error() if fail else hook.after_pipeline_run()

    train(A, "sft_adapter")
    train(B, "sft_adapter", fail=True)  # newer, from a run that failed
    train(C, "dpo_adapter", fail=True)  # its only version is from a failed run
    train(D, "rl_adapter")
    train(E, "rl_adapter")

    def compare_rollouts(params: object, **artifacts: object) -> None:
        return None

    compare = Pipeline([node(compare_rollouts, {"params": "params:compare", **{name: name for name in adapters}},
                             "judged", name="compare")])
    assert optional_inputs(compare) == set(adapters)

    def compare_run(run_id: str, load_versions: dict[str, str] | None = None) -> dict:
        data = catalog(run_id, load_versions)
        hook = RunVersionHook()
        hook.after_catalog_created(data)
        hook.before_pipeline_run({"run_id": run_id, "project_path": str(tmp_path), "pipeline_names": ["compare"],
                                  "load_versions": load_versions or {}}, compare, data)
        assert all(isinstance(data.get(name), OptionalVersionDataset) for name in adapters)
        loaded = {name: data.load(name) for name in adapters}
        hook.after_pipeline_run()
        return loaded

    # no registered pipelines, whichever project another test of this worker configured
    monkeypatch.setattr("prorag.hooks.run_versions._registered_pipeline_shapes", lambda: [])
    loaded = compare_run(F)
    assert loaded["sft_adapter"] == Available([{"adapter": A}], A)
    assert loaded["rl_adapter"] == Available([{"adapter": E}], E)
    assert isinstance(loaded["dpo_adapter"], Missing)
    assert "dpo_adapter: no stored version comes from a completed run" in loaded["dpo_adapter"].reason
    assert f"{C} (failed)" in loaded["dpo_adapter"].reason and "--load-versions=dpo_adapter:" in \
        loaded["dpo_adapter"].reason
    assert loaded["tearag_adapter"] == Missing("tearag_adapter has no version yet, and no registered pipeline "
                                               "writes it")  # (the registered pipelines are named in a project)
    assert {name: version for name, version in manifest(tmp_path, F)["loaded"].items() if name in adapters} == \
        {"sft_adapter": A, "rl_adapter": E}
    assert not [record for record in caplog.records if record.getMessage().startswith("Replacing dataset")]
    pinned = compare_run("2026-01-07T00.00.00.000Z", {"rl_adapter": D, "dpo_adapter": C})
    assert pinned["rl_adapter"] == Available([{"adapter": D}], D)
    assert pinned["dpo_adapter"] == Available([{"adapter": C}], C)

    # the same adapter read by a node that needs it (rl from SFT) is required: without any version, the run fails
    required = compare + Pipeline([node(lambda adapter: None, "tearag_adapter", "rl_out", name="needs_it")])
    assert "tearag_adapter" not in optional_inputs(required)
    data = catalog("2026-01-08T00.00.00.000Z")
    hook = RunVersionHook()
    hook.after_catalog_created(data)
    with pytest.raises(RunVersionError, match="tearag_adapter has no version yet"):
        hook.before_pipeline_run({"run_id": "2026-01-08T00.00.00.000Z", "project_path": str(tmp_path),
                                  "pipeline_names": ["x"]}, required, data)
