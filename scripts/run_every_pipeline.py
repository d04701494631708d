"""Run every registered pipeline on a fresh copy of the project, in dependency order, on tiny slices (``make
every-pipeline``, run in CI after ``make test``).

    python scripts/run_every_pipeline.py                          # a fresh copy in a temporary folder
    python scripts/run_every_pipeline.py --workdir /tmp/every --report every_pipeline.md
    python scripts/run_every_pipeline.py --dry-run                # the runs in order, with their --params

The copy holds the git-tracked files only (a fresh clone's working tree: no data/ outputs, no mlflow.db). The
pipelines are the project's registry (``kedro registry list``), so a new pipeline is run without editing this
script; a pipeline with the same nodes as one listed before it (``train`` and ``__default__`` are
``train_hiprag``) is reported as that one's alias instead of being run twice. The
order comes from the pipelines' free inputs and outputs: a pipeline that needs a dataset another pipeline writes
(``rollout`` needs the ``retrieval_index`` that ``index`` writes; ``compare`` each method's adapter) runs after a
pipeline that writes it, in an order whose runs pass the run manifests' lineage check (:func:`run_order`). Each
run is one ``kedro run --pipelines=<name> --params <TINY>`` on the default env (conf/base + conf/local as shipped:
SmolLM2-135M), with :data:`TINY` as the ``--params`` overrides (few questions per dataset, one or two optimizer
steps, a small KG slice) and nothing else: every pipeline runs on the shipped defaults.

A failing run does not stop the others; its log's tail is shown and the command exits 1 naming it. Every run's log
goes to ``<workdir>/data/08_reporting/every_pipeline/<started>/<pipeline>.log``, the table of wall times and
statuses to ``every_pipeline.md`` beside them (and to ``--report``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Hashable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from pipeline_runs import Result, kedro_command, run_all, timings_table

ROOT = Path(__file__).resolve().parents[1]

TINY: dict[str, Any] = {
    # the index stays the shipped one (40 questions per file, 400 background passages, ~45 s): on 12 and 20, the
    # ReasonRAG explorer's MCTS repeated itself (14 duplicate samples) and found 1 pair, where it finds 15
    # evaluation: one question per dataset
    "rollout.questions.max_per_source": 1,
    "compare.questions.max_per_source": 1,
    "compare.bootstrap_resamples": 200,
    "compare.permutation_resamples": 199,
    # the knowledge graph: one question's passages per dataset and 2 other chunks
    "kg_extraction.chunks.max_questions_per_source": 1,
    "kg_extraction.chunks.max_background_chunks": 2,
    # training: one optimizer step of each trainer
    "sft.max_steps": 1,
    "sft.gradient_accumulation_steps": 1,
    # except ReasonRAG's cold-start explorer, kept at the shipped 16 steps x 4: MCTS needs an explorer that is
    # sometimes right (dpo fails when there is no pair to train on); 12 MCTS questions instead of 24
    "methods.reasonrag.stages.sft.max_steps": 16,
    "methods.reasonrag.stages.sft.gradient_accumulation_steps": 4,
    "reasonrag_data.questions.max_per_source": 6,
    "rl.questions.max_per_source": 2,
    "rl.trainer.max_steps": 1,
    "rl.trainer.num_generations": 2,
    "rl.trainer.per_device_train_batch_size": 2,
    "rl.trainer.gradient_accumulation_steps": 1,   # one generation batch of 1 question x 2 generations
    "rl.generation_batch_size": 2,
    "dpo.trainer.max_steps": 1,
    "tearag.sft_data.max_questions": 4,
    "tearag.sft.max_steps": 1,
    "tearag.questions.nq": 1,
    "tearag.questions.hotpotqa_bridge": 1,
    "tearag.questions.hotpotqa_comparison": 1,
    "tearag.questions.musique": 1,
    "tearag.ip_dpo.samples_per_question": 2,
    "tearag.ip_dpo.trainer.max_steps": 1,
}
"""The tiny slices, as ``kedro run --params`` overrides a user could pass (every key exists in conf/base)."""


SEARCH_LIMIT = 20_000
"""Orders :func:`run_order` tries before it gives up on one whose every run passes the lineage check."""


class PipelineLike(Protocol):
    """What the ordering reads of a Kedro ``Pipeline``."""

    @property
    def nodes(self) -> list[Any]: ...

    def inputs(self) -> set[str]: ...

    def all_outputs(self) -> set[str]: ...

    def to_outputs(self, *outputs: str) -> PipelineLike: ...


def params_option(overrides: Mapping[str, Any]) -> str:
    """``overrides`` as one ``--params`` value (``key=value`` pairs, comma-separated; no value may hold a comma)."""
    pairs = []
    for key, value in overrides.items():
        text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        if "," in text or "=" in key:
            raise ValueError(f"--params {key}={text}: a key or value holding ',' or '=' cannot be passed")
        pairs.append(f"{key}={text}")
    return ",".join(pairs)


def check_overrides(parameters: Mapping[str, Any], overrides: Mapping[str, Any]) -> None:
    """Every override names an existing parameter (a renamed parameter must not be silently added instead)."""
    missing = []
    for key in overrides:
        node: Any = parameters
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                missing.append(key)
                break
            node = node[part]
    if missing:
        raise SystemExit(f"{__file__}: TINY overrides {', '.join(missing)}: no such parameter in the project's conf")


def aliases(pipelines: Mapping[str, PipelineLike]) -> dict[str, str]:
    """Each pipeline with the same nodes as one registered before it -> that first one."""
    first: dict[frozenset[Any], str] = {}
    found: dict[str, str] = {}
    for name, pipeline in pipelines.items():
        key = frozenset(pipeline.nodes)
        if key in first:
            found[name] = first[key]
        else:
            first[key] = name
    return found


def needs(pipeline: PipelineLike) -> set[str]:
    """The datasets a pipeline reads but does not write itself (parameters left out)."""
    return {name for name in pipeline.inputs() if not name.startswith("params:") and name != "parameters"}


def run_order(pipelines: Mapping[str, PipelineLike], versioned: Collection[str] | None = None) -> list[str]:
    """Every pipeline once, each after a pipeline that writes each dataset it needs (a need no pipeline writes is a
    raw input), in an order whose runs pass the lineage check of the run manifests.

    A run loads the newest version of each versioned input, and the versions must belong together: the lineage of
    a version is what its run loaded upstream of it, recursively (:mod:`prorag.tracking.run_manifest`). Composite
    pipelines (``train_*``) rewrite ``questions``, ``evaluated_questions`` and the index on the way, so a stage
    pipeline that reads an artifact of one run and a dataset of a later run fails: ``rl`` after ``train_rl`` rewrote
    ``evaluated_questions``, ``tearag`` with a ``knowledge_graph`` extracted before ``train_hiprag`` rewrote
    ``questions``. The order simulates those versions and lineages, and is searched depth first: at each step the
    ready pipelines whose loads would belong together, in registry order, those that leave every other such ready
    pipeline able to run first; a step where none can run backtracks. When no order passes (or
    :data:`SEARCH_LIMIT` orders were tried), each step takes the first such pipeline, or the first ready one (its
    run will say why). ``versioned`` names the versioned datasets (None: every dataset a pipeline writes). A need
    that only a pipeline waiting on the reader writes is an error naming it."""
    from prorag.hooks.run_versions import made_from, optional_inputs
    from prorag.tracking.run_manifest import lineage_conflicts

    names = list(pipelines)
    wanted = {name: needs(pipelines[name]) for name in names}
    writes = {name: set(pipelines[name].all_outputs()) for name in names}
    produced = set().union(*writes.values())
    tracked = produced if versioned is None else produced & set(versioned)
    optional = {name: optional_inputs(pipelines[name]) for name in names}  # type: ignore[arg-type]
    upstream = {name: {dataset: made_from(pipelines[name], dataset)  # type: ignore[arg-type]
                       for dataset in writes[name] & tracked} for name in names}
    # each dataset's version (the pipeline that wrote it: each runs once), and what that version was made from
    State = tuple[dict[str, str], dict[str, dict[str, str]]]

    def loads(name: str, state: Mapping[str, str]) -> list[str]:
        return sorted(dataset for dataset in wanted[name] & tracked if dataset in state)

    def belongs_together(name: str, now: State) -> bool:
        state, lines = now
        required = (dataset for dataset in loads(name, state) if dataset not in optional[name])
        # a dataset's own version comes first, as in RunManifests.lineage
        conflicts = lineage_conflicts({dataset: {**lines[dataset], dataset: state[dataset]} for dataset in required})
        return next(conflicts, None) is None

    def after(name: str, now: State) -> State:
        state, lines = dict(now[0]), dict(now[1])
        loaded = set(loads(name, now[0]))
        for dataset in writes[name] & tracked:  # as the run's manifest records it
            made_of: dict[str, str] = dict.fromkeys(upstream[name][dataset] & writes[name] & tracked, name)
            for source in upstream[name][dataset] & loaded:
                made_of.update({**now[1][source], source: now[0][source]})
            state[dataset], lines[dataset] = name, made_of
        return state, lines

    def ready(order: Sequence[str]) -> list[str]:
        written = set().union(*(writes[name] for name in order))
        return [name for name in names if name not in order and wanted[name] & produced <= written]

    def preferred(order: Sequence[str], now: State) -> list[str]:
        """The ready pipelines whose loads belong together, those that leave the other such ones runnable first."""
        runnable = [name for name in ready(order) if belongs_together(name, now)]
        keeps = [name for name in runnable if all(belongs_together(other, after(name, now))
                                                  for other in runnable if other != name)]
        return keeps + [name for name in runnable if name not in keeps]

    expansions = 0
    dead_ends: set[Hashable] = set()  # (pipelines run, state) from which no order passes

    def search(order: list[str], now: State) -> list[str] | None:  # depth first, in the preferred order
        nonlocal expansions
        if len(order) == len(names):
            return order
        key = (frozenset(order), tuple(sorted((dataset, writer, tuple(sorted(now[1][dataset].items())))
                                              for dataset, writer in now[0].items())))
        if key in dead_ends:
            return None
        for chosen in preferred(order, now):
            expansions += 1
            if expansions > SEARCH_LIMIT:
                return None
            found = search([*order, chosen], after(chosen, now))
            if found is not None:
                return found
        dead_ends.add(key)
        return None

    found = search([], ({}, {}))
    if found is not None:
        return found
    # no order passes the lineage check (or the search gave up): the preferred choice at each step, and the first
    # ready pipeline where none belongs together (its run will say why)
    order: list[str] = []
    now: State = ({}, {})
    while len(order) < len(names):
        candidates = ready(order)
        if not candidates:
            written = set().union(*(writes[name] for name in order))
            unmet = {name: sorted(wanted[name] & produced - written) for name in names if name not in order}
            raise SystemExit("no pipeline can run next: " + "; ".join(
                f"{name} needs {', '.join(datasets)}, which no pipeline before it writes"
                for name, datasets in unmet.items()))
        chosen = next(iter(preferred(order, now)), candidates[0])
        if not belongs_together(chosen, now):
            print(f"{chosen}: no order found in which its inputs come from runs that belong together; "
                  "its run will fail the lineage check", file=sys.stderr)
        now = after(chosen, now)
        order.append(chosen)
    return order


def plan(pipelines: Mapping[str, PipelineLike], versioned: Collection[str] | None = None
         ) -> tuple[list[str], dict[str, str]]:
    """The pipelines to run in order, and the aliases left out (alias -> the pipeline run instead)."""
    same = aliases(pipelines)
    kept = {name: pipeline for name, pipeline in pipelines.items() if name not in same}
    return run_order(kept, versioned), same


def select(pipelines: Mapping[str, PipelineLike], chosen: Sequence[str]) -> dict[str, PipelineLike]:
    """The ``chosen`` pipelines, in registry order; each dataset one of them needs that another registered pipeline
    writes must be written by a chosen one (a fresh project has no other source for it), but an optional input."""
    from prorag.hooks.run_versions import optional_inputs

    unknown = sorted(set(chosen) - set(pipelines))
    if unknown:
        raise SystemExit(f"--pipelines {' '.join(unknown)}: not registered ({', '.join(sorted(pipelines))})")
    kept = {name: pipeline for name, pipeline in pipelines.items() if name in chosen}
    produced = set().union(*(set(pipeline.all_outputs()) for pipeline in pipelines.values()))
    written = set().union(*(set(pipeline.all_outputs()) for pipeline in kept.values()))
    unmet = {name: sorted((needs(pipeline) - optional_inputs(pipeline)) & produced - written)  # type: ignore[arg-type]
             for name, pipeline in kept.items()}
    if any(unmet.values()):
        raise SystemExit("--pipelines: " + "; ".join(
            f"{name} needs {', '.join(datasets)}, which none of the chosen pipelines writes"
            for name, datasets in unmet.items() if datasets))
    return kept


def copy_project(source: Path, target: Path) -> int:
    """Copy the git-tracked files of ``source`` (their working-tree content) into ``target``; returns how many."""
    listing = subprocess.run(["git", "ls-files", "-z"], cwd=source, capture_output=True, check=False)
    if listing.returncode != 0:
        raise SystemExit(f"git ls-files in {source} failed (a git checkout is needed to know the tracked files): "
                         f"{listing.stderr.decode(errors='replace').strip()}")
    listed = listing.stdout
    copied = 0
    for relative in filter(None, listed.decode("utf-8").split("\0")):
        origin = source / relative
        if not origin.exists() and not origin.is_symlink():
            continue  # deleted in the working tree
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(origin, destination, follow_symlinks=False)
        copied += 1
    return copied


def load_project(workdir: Path) -> tuple[dict[str, Any], dict[str, Any], set[str]]:
    """The registry's pipelines (in registry order), the parameters and the versioned datasets of ``workdir``."""
    from kedro.framework.project import pipelines
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    bootstrap_project(workdir)
    with KedroSession.create(workdir) as session:
        loader = session.load_context().config_loader
        parameters = loader["parameters"]
        versioned = versioned_datasets(loader["catalog"])
    return dict(pipelines.items()), parameters, versioned


def versioned_datasets(catalog: Mapping[str, Any]) -> set[str]:
    """The catalog entries declared ``versioned: true``."""
    return {name for name, entry in catalog.items() if isinstance(entry, Mapping) and entry.get("versioned")}


def _prepare_workdir(workdir: Path | None, reuse: bool) -> Path:
    if workdir is None:
        return Path(tempfile.mkdtemp(prefix="prorag-every-pipeline-"))
    workdir = workdir.resolve()
    if workdir.exists() and any(workdir.iterdir()) and not reuse:
        raise SystemExit(f"--workdir {workdir} is not empty (a fresh project is wanted; --reuse to run there anyway)")
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=None, help="where the fresh copy goes (default: a temp dir)")
    parser.add_argument("--reuse", action="store_true", help="run in a non-empty --workdir (its data/ kept)")
    parser.add_argument("--report", type=Path, default=None, help="also write the table here")
    parser.add_argument("--pipelines", nargs="+", default=None,
                        help="only these, in dependency order among themselves (CI runs a selection: .ci/run)")
    parser.add_argument("--params", default=None, help="more --params overrides, after the tiny ones")
    parser.add_argument("--dry-run", action="store_true", help="print the runs in order and stop")
    args = parser.parse_args(argv)

    workdir = _prepare_workdir(args.workdir, args.reuse)
    copied = copy_project(ROOT, workdir)
    pipelines, parameters, versioned = load_project(workdir)
    check_overrides(parameters, TINY)
    if args.pipelines:
        pipelines = select(pipelines, args.pipelines)
    order, same = plan(pipelines, versioned)
    options = ",".join(filter(None, [params_option(TINY), args.params]))

    print(f"fresh project: {copied} tracked files in {workdir}")
    print("\n".join(f"{alias}: not run, the same nodes as {name}" for alias, name in same.items()))
    if args.dry_run:
        print("\n".join(" ".join(kedro_command(name, None, options)) for name in order))
        return 0
    log_dir = workdir / "data" / "08_reporting" / "every_pipeline" / datetime.now(UTC).strftime("%Y-%m-%dT%H.%M.%SZ")
    began = time.monotonic()
    results: list[Result] = run_all(order, lambda name: kedro_command(name, None, options), log_dir, cwd=workdir,
                                    env=_environment(workdir))
    table = timings_table(results, time.monotonic() - began,
                          {name: str(log_dir / f"{name}.log") for name, _, _ in results})
    notes = "".join(f"\n{alias}: the same nodes as {name} (not run again)" for alias, name in same.items())
    given = f",{args.params}" if args.params else ""
    text = f"{table}{notes}\n\n--params {params_option(TINY)}{given}\n"
    for path in filter(None, [log_dir / "every_pipeline.md", args.report]):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    print(f"\n{text}\ntable and logs: {log_dir}")
    failed = [name for name, _, status in results if status != 0]
    if failed:
        print(f"failed: {', '.join(failed)}")
        return 1
    return 0


def _environment(workdir: Path) -> dict[str, str]:
    """The runs' environment: the copy's own source first, and the models ``make models`` prepared in this checkout
    (``.cache/prorag``, as the Makefile's ``PRORAG_CACHE_DIR``) unless ``PRORAG_CACHE_DIR`` is set."""
    cache = ROOT / ".cache" / "prorag"
    extra = {"PRORAG_CACHE_DIR": str(cache)} if not os.environ.get("PRORAG_CACHE_DIR") and cache.is_dir() else {}
    return {**extra, "PYTHONPATH": str(workdir / "src")}


if __name__ == "__main__":
    sys.exit(main())
