"""GPU check (issue 43 item 5): conf/gpu's memory and throughput claims on one H100/H200, in one call of minutes.

Phases (each under its own time budget and try/except: a failing one is reported and the next one runs):

1. ``grpo_3b_reference_bf16`` — conf/gpu's full-parameter GRPO micro-batch at the Qwen2.5-3B shape (random
   weights): fp32 master weights, bf16 autocast, gradient checkpointing, 4 sequences of 7,040 tokens (1,024 of
   prompt), the reference in bf16 as shipped (``prorag.training.trl_grpo.reference_dtype``);
2. ``grpo_3b_reference_fp32`` — the same with TRL's default reference dtype (the policy's: fp32), before the N2 fix;
3. ``zero3_save_resume`` — a 1-process DeepSpeed ZeRO-3 step, save, load into a fresh engine, weights compared
   (skipped, with the reason, where deepspeed is not installed: the lent image has none);
4. ``e5_embedding`` — an E5-base-v2-shaped BertModel (random weights): passages/s at batch 256 × 256 tokens in fp16
   and fp32, and the hours that gives for wiki-18's 21M passages;
5. ``lora_7b_sft`` — a LoRA SFT step at the Qwen2.5-7B shape: r 16 on every linear layer, bf16 base, gradient
   checkpointing, 4 sequences of 2,048 tokens.

The GRPO step is emulated in plain torch (TRL is not on the lent image, which has no package index): per
micro-batch, the reference's and the policy's no-grad log-probs (TRL's ``ref_per_token_logps`` and, under vLLM's
importance-sampling correction, ``old_per_token_logps``), then the policy's forward and backward with GRPO's clipped
loss and KL term, through a tiled LM head like TRL's (:data:`prorag.scale.memory.FUSED_HEAD_TILE`); a warm-up
micro-batch steps the optimizer first, so the measured one runs beside AdamW's moments and accumulated gradients,
as every micro-batch of a 640-step accumulation does. Each phase's peak ``torch.cuda.max_memory_allocated`` is
compared with :func:`prorag.scale.memory.estimate` for the same shapes.

Not checked (each needs more than this machine): vLLM, TRL's own trainer, faiss-gpu, NCCL between ranks, several
nodes. No weights, tokenizer or network are needed: every model is built from its public config values.

    python benchmarks/gpu_check.py --out $OUT                  # on the device (about 5 minutes)
    python benchmarks/gpu_check.py --dry-run --out /tmp/check   # CPU, tiny configs, same code path (what CI runs)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gpu_smoke import environment, write_report
from prorag.scale.memory import FUSED_HEAD_TILE, GIB, ModelShape, TrainerLoad, estimate

QWEN25_3B = {"model_type": "qwen2", "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
             "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936,
             "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}
QWEN25_7B = {**QWEN25_3B, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
             "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False}
E5_BASE_V2 = {"model_type": "bert", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
              "intermediate_size": 3072, "vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2}
"""Public ``config.json`` values of Qwen/Qwen2.5-3B-Instruct, Qwen/Qwen2.5-7B-Instruct and intfloat/e5-base-v2."""
TINY_QWEN = {**QWEN25_3B, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}
TINY_BERT = {**E5_BASE_V2, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 128, "vocab_size": 1000}
WIKI18_PASSAGES = 21_015_324
GRPO_BETA, GRPO_EPSILON = 0.001, 0.2  # conf/gpu/parameters_rl.yml


@dataclass(frozen=True)
class Sizes:
    """The shapes of one run: the GPU's (conf/gpu's; tests/scale/test_gpu_check.py holds them to conf/gpu) or the
    dry run's."""

    policy: dict[str, Any]
    lora_base: dict[str, Any]
    embedder: dict[str, Any]
    zero3_model: dict[str, Any]
    grpo: tuple[int, int, int]  # micro-batch, sequence, prompt tokens
    sft: tuple[int, int]  # micro-batch, sequence
    tile: tuple[int, int]  # tokens × vocabulary columns of the LM head's tile
    embed: tuple[int, int, int]  # batch, sequence, timed batches
    budgets: dict[str, int]  # seconds per phase


GPU = Sizes(QWEN25_3B, QWEN25_7B, E5_BASE_V2, {**TINY_QWEN, "hidden_size": 512, "num_hidden_layers": 4},
            (4, 7040, 1024), (4, 2048), FUSED_HEAD_TILE, (256, 256, 10),
            {"grpo_3b_reference_bf16": 100, "grpo_3b_reference_fp32": 100, "zero3_save_resume": 60,
             "e5_embedding": 60, "lora_7b_sft": 100})
DRY = Sizes(TINY_QWEN, TINY_QWEN, TINY_BERT, TINY_QWEN, (2, 96, 32), (2, 64), (48, 256), (8, 32, 2),
            dict.fromkeys(GPU.budgets, 60))
PHASES = tuple(GPU.budgets)


class ChunkedLogprob(torch.autograd.Function):
    """Log-probabilities of ``targets`` under ``hidden @ weight.T`` in fp32 tiles of tokens × vocabulary columns,
    never the whole logits (what TRL's fused LM head does); the backward recomputes each tile."""

    @staticmethod
    def forward(ctx: Any, hidden: Any, weight: Any, targets: Any, tile: tuple[int, int]) -> Any:
        kind = hidden.device.type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else hidden.dtype
        log_z = torch.empty(len(hidden), dtype=torch.float32, device=hidden.device)
        picked = torch.empty_like(log_z)
        for rows, h, w, start in _tiles(hidden, weight, tile, dtype):
            z = (h @ w.T).float()
            local = targets[rows] - start
            inside = (local >= 0) & (local < len(w))
            picked[rows] = torch.where(inside, z.gather(1, local.clamp(0, len(w) - 1)[:, None])[:, 0], picked[rows])
            top = z.amax(1, keepdim=True)
            tile_z = z.sub_(top).exp_().sum(1).log_().add_(top[:, 0])  # in place: one fp32 tile, as TRL's kernel
            log_z[rows] = tile_z if start == 0 else torch.logaddexp(log_z[rows], tile_z)
        ctx.save_for_backward(hidden, weight, targets, log_z)
        ctx.dtype, ctx.tile = dtype, tile
        return picked - log_z

    @staticmethod
    def backward(ctx: Any, grad: Any) -> tuple[Any, Any, None, None]:
        hidden, weight, targets, log_z = ctx.saved_tensors
        grad_hidden = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for rows, h, w, start in _tiles(hidden, weight, ctx.tile, ctx.dtype):
            g = grad[rows].float()
            dz = (h @ w.T).float().sub_(log_z[rows, None]).exp_().mul_(-g[:, None])
            local = targets[rows] - start
            inside = ((local >= 0) & (local < len(w))).nonzero()[:, 0]
            dz[inside, local[inside]] += g[inside]
            grad_hidden[rows] += (dz.to(ctx.dtype) @ w).float()
            grad_weight[start:start + len(w)] += (dz.T.to(ctx.dtype) @ h).float()
        return grad_hidden.to(hidden.dtype), grad_weight.to(weight.dtype), None, None


def checkpointed(model: Any) -> None:
    """Non-reentrant activation checkpointing of every layer, as TRL and the SFT trainer set it."""
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.23
        model.activation_checkpointing_enable({"use_reentrant": False})
    else:  # the lent image's older transformers
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def gib(value: float) -> float:
    """GiB with 2 decimals, or 3 significant digits below 1 GiB (the dry run's tiny models)."""
    return round(value, 2) if value >= 1 else float(f"{value:.3g}")


def _tiles(hidden: Any, weight: Any, tile: tuple[int, int], dtype: Any) -> Iterator[tuple[slice, Any, Any, int]]:
    for first in range(0, len(hidden), tile[0]):
        rows = slice(first, first + tile[0])
        h = hidden[rows].to(dtype)
        for start in range(0, len(weight), tile[1]):
            yield rows, h, weight[start:start + tile[1]].to(dtype), start


class Meter:
    """Per named part of a phase: seconds and, on CUDA, the peak and final memory allocated (GiB)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda, self.parts = cuda, {}

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        started, entry = time.perf_counter(), {}
        try:
            yield
        except BaseException:
            entry["failed"] = True
            raise
        finally:
            if self.cuda:
                torch.cuda.synchronize()
                entry.update(peak_gib=round(torch.cuda.max_memory_allocated() / GIB, 2),
                             allocated_gib=round(torch.cuda.memory_allocated() / GIB, 2),
                             peak_reserved_gib=round(torch.cuda.max_memory_reserved() / GIB, 2))
            self.parts[name] = {"seconds": round(time.perf_counter() - started, 2), **entry}

    def peak(self, prefix: str = "") -> float | None:
        peaks = [part["peak_gib"] for name, part in self.parts.items() if name.startswith(prefix) and "peak_gib"
                 in part]
        return max(peaks) if peaks else None


class Check:
    """Runs the phases on one device (CUDA, or the CPU with :data:`DRY` sizes) and collects their records."""

    def __init__(self, *, dry_run: bool) -> None:
        self.cuda = torch.cuda.is_available() and not dry_run
        self.device = "cuda" if self.cuda else "cpu"
        self.sizes = GPU if self.cuda else DRY
        self.steps: list[dict[str, Any]] = []

    def run(self, name: str, phase: Callable[[Meter], dict[str, Any]]) -> None:
        budget = self.sizes.budgets[name]

        def over_budget(signum: int, frame: Any) -> None:
            raise TimeoutError(f"{name} ran past its {budget} s budget")

        meter = Meter(self.cuda)
        record: dict[str, Any] = {"step": name, "budget_s": budget}
        started = time.perf_counter()
        previous = signal.signal(signal.SIGALRM, over_budget)
        signal.alarm(budget)
        try:
            record.update(phase(meter))
            record.setdefault("status", "ok")
        except Exception as error:  # every phase is reported; the next one runs
            oom = isinstance(error, torch.cuda.OutOfMemoryError)
            failed = [part for part, entry in meter.parts.items() if entry.get("failed")]
            record.update(status="oom" if oom else "failed", error=f"{type(error).__name__}: {error}"[:1500],
                          failed_part=failed[0] if failed else None, traceback=traceback.format_exc()[-3000:])
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        record.update(seconds=round(time.perf_counter() - started, 2), parts=meter.parts)
        if self.cuda:
            record["peak_gpu_gib"] = meter.peak()
        self.steps.append(record)
        print(json.dumps({key: value for key, value in record.items() if key != "traceback"}), flush=True)
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------------------------------------ helpers

    def causal_lm(self, shape: dict[str, Any], dtype: Any) -> Any:
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.for_model(**shape)
        with torch.device(self.device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        model.config.use_cache = False
        return model.to(self.device)

    def autocast(self) -> Any:
        return torch.autocast(device_type=self.device, dtype=torch.bfloat16)

    def tokens(self, vocabulary: int, rows: int, columns: int) -> Any:
        generator = torch.Generator(device=self.device).manual_seed(0)
        return torch.randint(vocabulary, (rows, columns), device=self.device, generator=generator)

    @staticmethod
    def shape(model: Any, config: dict[str, Any]) -> ModelShape:
        parameters = float(sum(parameter.numel() for parameter in model.parameters()))
        return ModelShape(parameters, config["hidden_size"], config["num_hidden_layers"], config["vocab_size"])

    def compare(self, meter: Meter, prefix: str, load: TrainerLoad, shape: ModelShape,
                extra_gib: float = 0.0) -> dict[str, Any]:
        """The memory model's estimate (plus ``extra_gib`` it does not charge) against the measured peak."""
        found = estimate(load, shape)
        expected = found.total + extra_gib
        measured = meter.peak(prefix)
        result = {"parameters": shape.parameters, "estimate_gib": gib(expected),
                  "estimate_parts_gib": {key: gib(value) for key, value in found.parts.items()},
                  "measured_peak_gib": measured,
                  "measured_over_estimate": round(measured / expected, 3) if measured else None}
        print(f"{load.stage}: measured peak {measured} GiB, memory model {gib(expected)} GiB, ratio "
              f"{result['measured_over_estimate']}", flush=True)
        return result

    # ------------------------------------------------------------------------------------------------- phases

    def logprobs(self, model: Any, ids: Any, prompt: int) -> Any:
        hidden = model.model(input_ids=ids).last_hidden_state
        completion = hidden[:, prompt - 1:-1].reshape(-1, hidden.shape[-1])
        targets = ids[:, prompt:].reshape(-1)
        weight = model.get_output_embeddings().weight
        return ChunkedLogprob.apply(completion, weight, targets, self.sizes.tile).view(len(ids), -1)

    def grpo(self, meter: Meter, reference_dtype: Any) -> dict[str, Any]:
        config = self.sizes.policy
        micro_batch, sequence, prompt = self.sizes.grpo
        with meter.part("build"):
            policy = self.causal_lm(config, torch.float32).train()
            checkpointed(policy)
            reference = self.causal_lm(config, reference_dtype).eval().requires_grad_(False)
            optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6, fused=self.cuda)
        ids = self.tokens(config["vocab_size"], micro_batch, sequence)
        advantages = torch.randn(micro_batch, 1, device=self.device)
        for tag in ("warmup_", "step_"):
            with meter.part(f"{tag}reference_forward"), torch.no_grad(), self.autocast():
                reference_logps = self.logprobs(reference, ids, prompt)
            with meter.part(f"{tag}old_logps_forward"), torch.no_grad(), self.autocast():
                old = self.logprobs(policy, ids, prompt)
            with meter.part(f"{tag}policy_forward_backward"):
                with self.autocast():
                    logps = self.logprobs(policy, ids, prompt)
                ratio = torch.exp(logps - old)
                clipped = torch.clamp(ratio, 1 - GRPO_EPSILON, 1 + GRPO_EPSILON)
                delta = reference_logps - logps
                loss = (-torch.minimum(ratio * advantages, clipped * advantages)
                        + GRPO_BETA * (torch.exp(delta) - delta - 1)).mean()
                loss.backward()
            with meter.part(f"{tag}optimizer_step"):  # the warm-up creates AdamW's moments; gradients stay
                optimizer.step()
        load = TrainerLoad("rl", "rl.trainer.", "Qwen/Qwen2.5-3B-Instruct", True, True, micro_batch, sequence, True,
                           logits="fused")
        shape = self.shape(policy, config)
        # the memory model charges the shipped bf16 reference; TRL's default fp32 one is 2 B per parameter more
        extra = shape.parameters * 2 / GIB if reference_dtype == torch.float32 else 0.0
        return {"emulated": "plain torch (TRL is not on the lent image)", "reference_dtype": str(reference_dtype),
                "micro_batch": micro_batch, "sequence": sequence, "completion_tokens": sequence - prompt,
                "loss": round(loss.item(), 4), **self.compare(meter, "step_", load, shape, extra)}

    def grpo_3b_reference_bf16(self, meter: Meter) -> dict[str, Any]:
        return self.grpo(meter, torch.bfloat16)

    def grpo_3b_reference_fp32(self, meter: Meter) -> dict[str, Any]:
        return self.grpo(meter, torch.float32)

    def zero3_save_resume(self, meter: Meter) -> dict[str, Any]:
        if importlib.util.find_spec("deepspeed") is None:
            return {"status": "skipped", "why": "deepspeed is not installed here (the lent image has none and no "
                                                "package index; the GPU lock builds it from its sdist)"}
        import deepspeed

        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": os.environ.get("MASTER_PORT", "29533"),
                           "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"})
        deepspeed.init_distributed(dist_backend="nccl" if self.cuda else "gloo")
        config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                  "zero_optimization": {"stage": 3}, "bf16": {"enabled": self.cuda},
                  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
        ids = self.tokens(self.sizes.zero3_model["vocab_size"], 2, 64)

        def engine() -> Any:  # initialize partitions the (small) model's weights over the one rank
            model = self.causal_lm(self.sizes.zero3_model, torch.float32)
            return deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)[0]

        def weights(model: Any) -> dict[str, Any]:
            with deepspeed.zero.GatheredParameters(list(model.parameters())):
                return {name: value.detach().float().cpu().clone() for name, value in model.named_parameters()}

        folder = Path(tempfile.mkdtemp(prefix="prorag-gpu-check-zero3-"))
        with meter.part("train_and_save"):
            first = engine()
            for _ in range(2):
                first.backward(first(input_ids=ids, labels=ids).loss)
                first.step()
            first.save_checkpoint(str(folder), tag="step2")
            saved = weights(first.module)
        with meter.part("resume"):
            second = engine()
            second.load_checkpoint(str(folder), tag="step2")
            loaded = weights(second.module)
            for model in (first, second):  # one more step each: equal only if the optimizer's moments came back too
                model.backward(model(input_ids=ids, labels=ids).loss)
                model.step()
            stepped = [weights(model.module) for model in (first, second)]
        differing = [name for name, value in saved.items() if not torch.equal(value, loaded[name])]
        after_step = [name for name, value in stepped[0].items() if not torch.equal(value, stepped[1][name])]
        result = {"deepspeed": deepspeed.__version__, "tensors": len(saved), "differing_after_load": differing[:10],
                  "differing_after_one_more_step": after_step[:10]}
        if differing or after_step:
            result["status"] = "failed"
        return result

    def e5_embedding(self, meter: Meter) -> dict[str, Any]:
        from transformers import AutoConfig, BertModel

        batch, sequence, batches = self.sizes.embed
        ids = self.tokens(self.sizes.embedder["vocab_size"], batch, sequence)
        mask = torch.ones_like(ids)
        result: dict[str, Any] = {"batch": batch, "sequence": sequence}
        for dtype in (torch.float16, torch.float32):
            name = str(dtype).removeprefix("torch.")
            with torch.device(self.device):
                model = BertModel(AutoConfig.for_model(**self.sizes.embedder), add_pooling_layer=False)
            model = model.to(self.device, dtype).eval()
            with torch.inference_mode():
                for part in (f"{name}_warmup", name):
                    with meter.part(part):
                        started = time.perf_counter()
                        for _ in range(2 if part.endswith("warmup") else batches):
                            states = model(input_ids=ids, attention_mask=mask).last_hidden_state
                            pooled = (states * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)  # E5: mean
                            torch.nn.functional.normalize(pooled.float(), dim=-1)
                        if self.cuda:
                            torch.cuda.synchronize()
                        seconds = time.perf_counter() - started
            rate = batch * batches / seconds
            result[f"{name}_passages_per_s"] = round(rate, 1)
            result[f"{name}_wiki18_hours"] = round(WIKI18_PASSAGES / rate / 3600, 2)
            del model
        return result

    def lora_7b_sft(self, meter: Meter) -> dict[str, Any]:
        from peft import LoraConfig, get_peft_model

        config = self.sizes.lora_base
        micro_batch, sequence = self.sizes.sft
        with meter.part("build"):
            base = self.causal_lm(config, torch.bfloat16).train()
            checkpointed(base)
            model = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, task_type="CAUSAL_LM",
                                                    target_modules="all-linear"))
            trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
            optimizer = torch.optim.AdamW(trainable, lr=1e-4, fused=self.cuda)
        ids = self.tokens(config["vocab_size"], micro_batch, sequence)
        for tag in ("warmup_", "step_"):
            with meter.part(f"{tag}forward_backward"):
                with self.autocast():
                    loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
            with meter.part(f"{tag}optimizer_step"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        load = TrainerLoad("sft", "sft.", "Qwen/Qwen2.5-7B-Instruct", False, False, micro_batch, sequence, True)
        shape = self.shape(base, config)
        return {"lora_parameters": sum(parameter.numel() for parameter in trainable), "micro_batch": micro_batch,
                "sequence": sequence, "loss": round(loss.item(), 4),
                **self.compare(meter, "step_", load, shape)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT"), help="folder for report.json and report.md ($OUT)")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny configs, same code path (what CI runs)")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}")
    args = parser.parse_args(argv)
    if not args.out:
        parser.error("--out is required (or $OUT)")
    names = args.phases.split(",")
    if unknown := [name for name in names if name not in PHASES]:
        parser.error(f"unknown phase(s) {unknown} (known: {', '.join(PHASES)})")
    started = time.perf_counter()
    check = Check(dry_run=args.dry_run)
    info = environment(check.device, check="gpu_check", dry_run=args.dry_run)
    print(json.dumps(info), flush=True)
    for name in names:
        check.run(name, getattr(check, name))
    info["total_seconds"] = round(time.perf_counter() - started, 1)
    failed = write_report(Path(args.out), "GPU check", info, check.steps)
    print(f"total {info['total_seconds']} s; report: {Path(args.out) / 'report.md'}; failed: {failed or 'none'}",
          flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
