"""glibc's heap reuse for large tensors around every rollout (:func:`prorag.memory.reusing_freed_memory`), off vs
on, in one run.

The same ``kedro run --pipelines=train --nodes=<node>`` twice in ``--project`` (a project that has run ``make
train``, so the node's inputs exist): first with ``PRORAG_MALLOC_REUSE=0`` (glibc's default: every block above 32 MB
is mapped on its own and unmapped on ``free``), then with reuse on (the default): a preset of
``benchmarks/node_variants.py``, which reports node seconds, page faults, peak memory and identical completions.

    .venv/bin/python benchmarks/malloc_reuse.py --project /path/to/a/trained/clone
    .venv/bin/python benchmarks/malloc_reuse.py --node sft.train_sft --params sft.max_steps=4 --output ""
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from node_variants import Variant, measure  # benchmarks/node_variants.py
from report import ROOT  # benchmarks/report.py

VARIANTS = (Variant("glibc default (prorag default)", environment={"PRORAG_MALLOC_REUSE": "0"}),
            Variant("heap reuse (PRORAG_MALLOC_REUSE=1)", environment={"PRORAG_MALLOC_REUSE": "1"}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--project", type=Path, default=ROOT, help="a project that has run make train (default: .)")
    parser.add_argument("--node", default="sft.run_policy_rollouts", help="the node of `train` to run")
    parser.add_argument("--params", default="", help="kedro --params for both runs (e.g. sft.max_steps=4)")
    parser.add_argument("--output", default="data/07_model_output/sft_policy_trajectories.jsonl",
                        help="the node's versioned JSON-lines output to compare ('' for none)")
    parser.add_argument("--output-dir", type=Path, default=ROOT / "data" / "08_reporting")
    args = parser.parse_args(argv)
    measure(list(VARIANTS), project=args.project, node=args.node, params=args.params, output=args.output,
            name="malloc_reuse", output_dir=args.output_dir,
            title=f"{args.node}: node seconds, page faults, peak memory; reuse off vs on")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
