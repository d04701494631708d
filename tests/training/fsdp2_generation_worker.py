"""One rank of ``test_fsdp2_generation.py`` (started by ``torch.distributed.run`` with 2 gloo processes on CPU).

The tiny random Llama with a LoRA adapter, each decoder layer and the root wrapped with FSDP2 (``fully_shard``, what
accelerate's ``fsdp2`` config does on GPUs), then twice: generation inside
:func:`prorag.training.trl_grpo.fsdp2_full_parameters` with the generator the GRPO rollouts use
(``TransformersGenerator(synced_gpus=False)``), rank 0 making one call and rank 1 three (as multi-turn rollouts differ
in turns), then one training step. Every collective (all-gather, all-reduce, broadcast) is counted per phase; the
rank writes ``rank_<r>.json`` into the folder given as its argument.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def main(output: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from prorag.llm import BUNDLED_TINY_LLAMA
    from prorag.llm.generation import SamplingParams
    from prorag.llm.registry import load_causal_lm
    from prorag.llm.transformers_backend import TransformersGenerator
    from prorag.training.trl_grpo import fsdp2_full_parameters

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    gathers = {"count": 0}

    def counted(collective):
        def call(*args, **kwargs):
            gathers["count"] += 1
            return collective(*args, **kwargs)

        return call

    for name in ("all_gather_single", "all_gather", "all_gather_into_tensor", "all_reduce", "broadcast"):
        setattr(dist, name, counted(getattr(dist, name)))
    torch.manual_seed(0)
    model, tokenizer = load_causal_lm(BUNDLED_TINY_LLAMA)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                             target_modules=["q_proj", "v_proj"]))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    layers = model.base_model.model.model.layers
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD([parameter for parameter in model.parameters() if parameter.requires_grad], lr=0.5)
    forwards = {"count": 0}
    inner = model.base_model.model  # what PeftModel.generate runs: one forward pass per new token
    inner.register_forward_pre_hook(lambda *_: forwards.__setitem__("count", forwards["count"] + 1))
    report: dict[str, object] = {"rank": rank, "rounds": []}
    batch = torch.tensor([[5, 6, 7, 8, 9, 10]])
    for _ in range(2):
        gathers["count"], forwards["count"] = 0, 0
        with fsdp2_full_parameters(model):
            unshard_gathers = gathers["count"]
            generator = TransformersGenerator((model, tokenizer), batch_size=1, prefix_cache_mb=0,
                                              synced_gpus=False)
            calls = 1 + 2 * rank  # rank 0: one call of at most 2 tokens; rank 1: three calls (>= 3 forward passes)
            with torch.no_grad():
                for call in range(calls):
                    generator.generate([f"turn {call} of rank {rank}:"], SamplingParams(max_new_tokens=2))
        generation = {"gathers": gathers["count"] - unshard_gathers, "forwards": forwards["count"], "calls": calls,
                      "unshard_gathers": unshard_gathers}
        weight = layers[0].self_attn.o_proj.weight
        generation["sharded_after"] = weight.to_local().numel() < weight.numel()
        gathers["count"] = 0
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        report["rounds"].append({**generation, "loss": float(loss), "training_gathers": gathers["count"]})
    (output / f"rank_{rank}.json").write_text(json.dumps(report), encoding="utf-8")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
