"""One greedy decoding step that feeds each row 1 or several tokens over a long past: what prompt-lookup drafts cost.

SmolLM2 (9 query heads over 3 KV heads) in float32 over a ``StaticCache`` filled with ``--past`` positions; each step
feeds every row ``fed`` tokens through a 4-D mask, as :meth:`TransformersGenerator._decode_greedy` does, through
transformers' SDPA path (which repeats the KV heads for several masked query tokens) and through the packed
grouped-query attention prorag runs those steps with. Ratios are against one token a step, per batch size.

    .venv/bin/python benchmarks/decode_step.py --rows 8 16 --fed 1 4 6
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from transformers import StaticCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prorag.llm.registry import BUNDLED_SMOLLM2, load_causal_lm
from prorag.llm.transformers_backend import _grouped_query_attention
from report import ROOT, Row, write_report  # benchmarks/report.py


def step_seconds(model: torch.nn.Module, rows: int, fed: int, past: int, repeats: int, *, packed: bool) -> float:
    """The median seconds of a step feeding ``fed`` tokens to each of ``rows`` rows after ``past`` positions."""
    cache = StaticCache(config=model.config, max_cache_len=past + fed)
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        model(input_ids=torch.randint(0, 40_000, (rows, past), generator=generator), past_key_values=cache,
              cache_position=torch.arange(past), use_cache=True, logits_to_keep=1)
        positions = torch.arange(past, past + fed)
        columns = torch.arange(past + fed)
        mask = (columns[None, :] <= positions[:, None])[None, None].expand(rows, 1, fed, past + fed)
        ids = torch.randint(0, 40_000, (rows, fed), generator=generator)
        times = []
        for _ in range(repeats):
            for layer in cache.layers:  # the same slots every repeat
                layer.cumulative_length.fill_(past)
            start = time.perf_counter()
            with _grouped_query_attention(model) if packed else contextlib.nullcontext():
                model(input_ids=ids, attention_mask=mask, position_ids=positions[None].expand(rows, fed),
                      past_key_values=cache, cache_position=positions, use_cache=True, logits_to_keep=fed)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--fed", type=int, nargs="+", default=[1, 4, 6], help="tokens fed per row (1 + drafts)")
    parser.add_argument("--past", type=int, default=2000, help="positions of past per row")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output-dir", type=Path, default=ROOT / "data" / "08_reporting")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, _ = load_causal_lm(BUNDLED_SMOLLM2)
    rows_out: list[Row] = []
    for rows in args.rows:
        baseline = None
        for fed in args.fed:
            for packed in ([False] if fed == 1 else [False, True]):
                seconds = step_seconds(model, rows, fed, args.past, args.repeats, packed=packed)
                baseline = baseline or seconds
                label = f"{fed} token{'s' if fed > 1 else ''} a row" + (
                    "" if fed == 1 else (", packed GQA (prorag)" if packed else ", transformers' SDPA (repeat_kv)"))
                rows_out.append(Row(f"{rows} rows, {args.past} past", label, rows * fed, "token", seconds,
                                    f"{seconds / baseline:.2f}x the 1-token step",
                                    f"{seconds / (rows * fed) * 1000:.1f} ms a fed token"))
    write_report(rows_out, name="decode_step", heading="One decoding step: tokens fed per row",
                 title="SmolLM2 float32 decoding step, 1 vs several tokens a row",
                 command=" ".join(["python benchmarks/decode_step.py", *sys.argv[1:]]), output_dir=args.output_dir,
                 console=Console())


if __name__ == "__main__":
    main()
