"""Train every method of the ``methods`` map, then compare them: one command (``make train-all``).

    python scripts/train_all.py                     # every method, then compare, on conf/base (+ conf/local)
    python scripts/train_all.py --env cpu_long      # another env
    python scripts/train_all.py --methods hiprag search_r1 --dry-run

Each pipeline is its own ``kedro run`` (``train_<method>`` in dependency order: a recipe that continues the SFT
adapter — ``rl_from_sft``, Search-R1 — after the recipe that trains it), so every run is tracked, versioned and
resumable as usual, and ``compare`` then evaluates the adapters these runs saved (each arm's latest version). The
runs cannot be one Kedro pipeline: the methods' recipes reuse the stage pipelines under the same dataset names.

A method whose run fails does not stop the others: its log's tail is shown, ``compare`` lists its arm as skipped
with the reason, and the command exits 1 naming it (``--stop-on-failure`` stops at the first failing run instead).
Every run's output goes to ``data/08_reporting/train_all/<started>/<pipeline>.log``; the wall time of each run goes
to ``timings.md`` beside them, and the comparison table (``data/08_reporting/comparison.md``) is printed at the end.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline_runs import kedro_command, run_all, timings_table

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "data" / "08_reporting"
SECOND_RECIPES = ("rl_from_sft",)
"""Recipes that continue what another recipe trains (the latest ``sft_adapter``): they run after the others."""


def plan(methods: Mapping[str, Mapping[str, Any]], only: Sequence[str] | None = None) -> list[str]:
    """``train_<method>`` of every selected method, the recipes of :data:`SECOND_RECIPES` last, then ``compare``."""
    names = list(methods)
    if only:
        unknown = sorted(set(only) - set(names))
        if unknown:
            raise SystemExit(f"--methods {' '.join(unknown)}: not in the methods map ({', '.join(names)})")
        names = [name for name in names if name in only]
    first = [name for name in names if methods[name].get("recipe") not in SECOND_RECIPES]
    second = [name for name in names if methods[name].get("recipe") in SECOND_RECIPES]
    return [f"train_{name}" for name in first + second] + ["compare"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default=None, help="the Kedro env of every run (default: local)")
    parser.add_argument("--methods", nargs="+", default=None, help="a subset of the methods map (default: all)")
    parser.add_argument("--dry-run", action="store_true", help="print the runs in order and stop")
    parser.add_argument("--stop-on-failure", action="store_true", help="run nothing after a failing run")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "src"))
    from prorag.config_loader import configured_methods

    pipelines = plan(configured_methods(ROOT), args.methods)
    if args.dry_run:
        print("\n".join(" ".join(kedro_command(pipeline, args.env)) for pipeline in pipelines))
        return 0
    log_dir = REPORTS / "train_all" / datetime.now(UTC).strftime("%Y-%m-%dT%H.%M.%SZ")
    began = time.monotonic()
    results = run_all(pipelines, lambda pipeline: kedro_command(pipeline, args.env), log_dir, cwd=ROOT,
                      stop_on_failure=args.stop_on_failure)
    total = time.monotonic() - began
    table = timings_table(results, total)
    (log_dir / "timings.md").write_text(table, encoding="utf-8")
    print(f"\n{table}\nlogs and timings: {log_dir.relative_to(ROOT)}")
    failed = [pipeline for pipeline, _, status in results if status != 0]
    comparison = sorted((REPORTS / "comparison.md").glob("*/comparison.md"))
    if comparison and "compare" not in failed and results[-1][0] == "compare":
        print(f"\n{comparison[-1].relative_to(ROOT)}:\n{comparison[-1].read_text(encoding='utf-8')}")
    if failed:
        print(f"failed: {', '.join(failed)} (their logs are in {log_dir.relative_to(ROOT)})")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
