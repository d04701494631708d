"""GPU smoke test: the project's GPU paths on one CUDA device, with a report (docs/scaling.md, "What ran on a GPU").

Steps (each timed, with the peak GPU memory it allocated; a failing step is reported and the next one runs):

1. ``generate_kv_reuse`` — in-process generation (``TransformersGenerator``, bf16) of a two-turn rollout: the second
   turn extends the first, and the prefix KV cache must serve the first turn's tokens (``cached_tokens`` > 0);
2. ``sft_lora_bf16`` — LoRA SFT for a few steps (``train_sft_lora``, bf16 autocast, gradient checkpointing);
3. ``grpo_lora`` — two in-process GRPO steps over the multi-turn rollout engine (BM25, reference judge);
4. ``grpo_full_parameter`` — one full-parameter GRPO step: fp32 master weights, bf16 compute;
5. ``dpo_lora`` — DPO for a few steps (``train_dpo_lora``);
6. ``embedder`` — the bundled MiniLM embedder over the vendored passages on the GPU (passages per second);
7. ``faiss`` — IVF-PQ (M = 64) over those embeddings, cloned to the GPU with float16 lookup tables when the faiss
   installed has GPU support (faiss-gpu), else on the CPU (reported as such).

It needs only what the packing step brings (``scripts/gpu_smoke_pack.py``) beside torch, transformers, peft and
accelerate, and no network: the models are the bundled SmolLM2-135M (from its GGUF) and MiniLM.

    python benchmarks/gpu_smoke.py --out data/08_reporting/gpu_smoke          # on a GPU machine
    python benchmarks/gpu_smoke.py --dry-run --out /tmp/smoke                 # CPU: tiny model, few passages

``--dry-run`` runs every step on the CPU with the 2-layer random Llama and 200 passages: the CPU path that
tests/scale/test_gpu_smoke.py runs, so the script cannot rot between GPU sessions.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import itertools
import json
import platform
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RAW = ROOT / "data" / "01_raw"


def environment(device: str, **extra: Any) -> dict[str, Any]:
    """The date, device (its name, memory and capability on CUDA) and library versions a report starts with."""
    import torch

    info: dict[str, Any] = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                            "python": platform.python_version(), "torch": torch.__version__,
                            "torch_cuda": torch.version.cuda, "device": device, **extra}
    if device == "cuda":
        properties = torch.cuda.get_device_properties(0)
        info.update(gpu=properties.name, gpu_memory_gib=round(properties.total_memory / 2**30, 1),
                    capability=f"sm_{properties.major}{properties.minor}", visible_gpus=torch.cuda.device_count())
    for name in ("transformers", "trl", "peft", "accelerate", "deepspeed", "sentence_transformers", "faiss"):
        try:
            module = __import__(name)
            info[name] = getattr(module, "__version__", "?")
        except Exception:  # absent, or broken beside this torch: the report says None
            info[name] = None
    return info


def write_report(out: Path, title: str, environment: dict[str, Any], steps: list[dict[str, Any]]) -> list[str]:
    """``report.json`` and ``report.md`` (one table row per step) in ``out``; returns the failed steps' names."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps({"environment": environment, "steps": steps}, indent=2))
    lines = [f"# {title} — {environment['date']} — {environment.get('gpu', environment['device'])}", "",
             "| step | status | seconds | peak GPU GiB | details |", "| --- | --- | --- | --- | --- |"]
    for step in steps:
        details = {key: value for key, value in step.items()
                   if key not in {"step", "status", "seconds", "peak_gpu_gib", "traceback"}}
        lines.append(f"| {step['step']} | {step['status']} | {step['seconds']} | {step.get('peak_gpu_gib', '-')} | "
                     f"{json.dumps(details)} |")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return [step["step"] for step in steps if step["status"] == "failed"]


class Smoke:
    """Runs the steps on one device and collects the report."""

    def __init__(self, *, dry_run: bool, passages: int) -> None:
        import torch

        self.torch = torch
        self.cuda = torch.cuda.is_available() and not dry_run
        self.device = "cuda" if self.cuda else "cpu"
        self.dtype = "bfloat16" if self.cuda else "float32"
        from prorag.llm.registry import BUNDLED_SMOLLM2, BUNDLED_TINY_LLAMA

        self.model = BUNDLED_SMOLLM2 if self.cuda else BUNDLED_TINY_LLAMA
        self.passages = passages
        self.work = Path(tempfile.mkdtemp(prefix="prorag-gpu-smoke-"))
        self.steps: list[dict[str, Any]] = []

    def environment(self) -> dict[str, Any]:
        return environment(self.device, model=self.model)

    def run(self, name: str, step: Callable[[], dict[str, Any]]) -> None:
        torch = self.torch
        if self.cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        record: dict[str, Any] = {"step": name}
        try:
            record.update(step())
            record["status"] = record.get("status", "ok")
        except Exception as error:  # a smoke test reports every step
            record.update(status="failed", error=f"{type(error).__name__}: {error}",
                          traceback=traceback.format_exc()[-3000:])
        record["seconds"] = round(time.perf_counter() - started, 2)
        if self.cuda:
            record["peak_gpu_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        self.steps.append(record)
        print(json.dumps({key: value for key, value in record.items() if key != "traceback"}), flush=True)
        gc.collect()

    # ----------------------------------------------------------------------------------------------- steps

    def questions(self, count: int = 4) -> list[Any]:
        from prorag.data.records import load_questions

        return load_questions(RAW / "qa" / "hotpotqa.jsonl")[:count]

    def passage_list(self) -> list[Any]:
        from prorag.data.records import Passage

        with (RAW / "corpus" / "hotpotqa.jsonl").open(encoding="utf-8") as handle:
            return [Passage.from_dict(json.loads(line)) for line in itertools.islice(handle, self.passages)]

    def generate_kv_reuse(self) -> dict[str, Any]:
        from prorag.llm.generation import SamplingParams
        from prorag.llm.transformers_backend import TransformersGenerator

        generator = TransformersGenerator(self.model, dtype=self.dtype, device=self.device, batch_size=8)
        prompts = [f"Question {index}: who wrote the novel? Let us think step by step." for index in range(8)]
        first = generator.generate(prompts, SamplingParams(max_new_tokens=32))
        second_prompts = [prompt + completions[0].text + " Next step:" for prompt, completions in
                          zip(prompts, first, strict=True)]
        started = time.perf_counter()
        second = generator.generate(second_prompts, SamplingParams(max_new_tokens=32))
        turn_seconds = time.perf_counter() - started
        stats = generator.stats
        tokens = sum(len(completions[0].token_ids) for completions in second)
        result = {"cached_tokens": stats.cached_tokens, "prefill_tokens": stats.prefill_tokens,
                  "decode_tokens": stats.decode_tokens, "second_turn_tokens_per_s": round(tokens / turn_seconds, 1)}
        if stats.cached_tokens <= 0:
            result["status"] = "failed"
            result["error"] = "the second turn reused no KV from the first"
        return result

    def sft_lora_bf16(self) -> dict[str, Any]:
        from prorag.llm.registry import load_tokenizer
        from prorag.protocol.hiprag import after_search, format_documents, initial_prefix
        from prorag.training.config import SFTSettings
        from prorag.training.sft import build_sft_example, train_sft_lora

        tokenizer = load_tokenizer(self.model)
        examples = []
        for question in self.questions(8):
            docs = format_documents([("Title", "A passage about the question.")])
            answer = question.golden_answers[0]
            completion = (f"{initial_prefix()}I need a fact.</reasoning>\n<search>{question.question}</search>"
                          f"{after_search(docs)}It is {answer}.</conclusion>\n</step>\n</think>\n"
                          f"<answer>{answer}</answer>")
            examples.append(build_sft_example(tokenizer, question.question, completion, protocol="hiprag",
                                              few_shot=self.cuda))
        settings = SFTSettings(max_steps=3, per_device_train_batch_size=4, dtype=self.dtype,
                               gradient_checkpointing=True, use_cpu=not self.cuda)
        adapter, history = train_sft_lora(self.model, examples, self.work / "sft", settings)
        losses = [entry["loss"] for entry in history if "loss" in entry]
        return {"steps": len(losses), "loss_first": losses[0], "loss_last": losses[-1],
                "adapter": (adapter / "adapter_config.json").is_file()}

    def _rollout_function(self) -> Any:
        from prorag.judges import ReferenceJudge
        from prorag.retrieval.bm25 import BM25Retriever
        from prorag.retrieval.store import PassageStore
        from prorag.rewards.registry import build_reward
        from prorag.rewards.scoring import RolloutScorer
        from prorag.specs import AgentSpec
        from prorag.training.trl_grpo import AgentRolloutFunction

        retriever = BM25Retriever.build(PassageStore(self.passage_list()))
        judge = ReferenceJudge(retriever)
        scorer = RolloutScorer(build_reward({"kind": "hiprag"}), over_judge=judge, under_judge=judge)
        budget = 128 if self.cuda else 16  # the CPU dry run only proves the path
        agent = AgentSpec(step_budget=2, max_new_tokens_per_turn=budget // 2, max_total_new_tokens=budget,
                          few_shot=self.cuda)
        return AgentRolloutFunction(self.questions(), retriever, scorer, agent, seed=0, batch_size=8)

    def _grpo(self, *, full_parameters: bool, steps: int) -> dict[str, Any]:
        from prorag.training.config import GRPOSettings
        from prorag.training.trl_grpo import train_grpo_lora

        # full-parameter: bf16 compute over fp32 masters, on the CPU dry run too (autocast found a KV-cache dtype bug)
        dtype = "bfloat16" if full_parameters else self.dtype
        settings = GRPOSettings(max_steps=steps, per_device_train_batch_size=4, num_generations=2,
                                learning_rate=1e-6 if full_parameters else 1e-4, dtype=dtype,
                                use_cpu=not self.cuda, gradient_checkpointing=self.cuda, save_steps=steps,
                                beta=0.001 if full_parameters else 0.0)
        out = self.work / ("grpo_full" if full_parameters else "grpo")
        folder, history = train_grpo_lora(self.model, self.questions(), self._rollout_function(), out, settings,
                                          full_parameters=full_parameters)
        logged = [entry for entry in history if "loss" in entry]
        last = logged[-1] if logged else {}
        return {"steps": len(logged), "reward": last.get("reward"), "agent_format": last.get("agent/format_rate"),
                "saved": (folder / ("config.json" if full_parameters else "adapter_config.json")).is_file()}

    def grpo_lora(self) -> dict[str, Any]:
        return self._grpo(full_parameters=False, steps=2)

    def grpo_full_parameter(self) -> dict[str, Any]:
        return self._grpo(full_parameters=True, steps=1)

    def dpo_lora(self) -> dict[str, Any]:
        from prorag.training.dpo import DPOTrainingConfig, train_dpo_lora

        rows = [{"prompt": f"Question: {question.question}\nAnswer:", "chosen": f" {question.golden_answers[0]}",
                 "rejected": " I do not know."} for question in self.questions(8)]
        config = DPOTrainingConfig(max_steps=3, per_device_train_batch_size=2, dtype=self.dtype,
                                   use_cpu=not self.cuda, gradient_checkpointing=self.cuda)
        adapter, history = train_dpo_lora(self.model, rows, self.work / "dpo", config)
        losses = [entry["loss"] for entry in history if "loss" in entry]
        return {"steps": len(losses), "loss_last": losses[-1] if losses else None,
                "adapter": (adapter / "adapter_config.json").is_file()}

    def embedder(self) -> dict[str, Any]:
        from prorag.retrieval.embedder import load_embedder

        embedder = load_embedder(device=self.device, show_progress=False)
        passages = self.passage_list()
        embedder.encode_passages(passages[:64])  # warm-up
        if self.cuda:
            self.torch.cuda.synchronize()
        started = time.perf_counter()
        self.vectors = embedder.encode_passages(passages)
        if self.cuda:
            self.torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        return {"passages": len(passages), "dim": int(self.vectors.shape[1]),
                "passages_per_s": round(len(passages) / seconds, 1)}

    def faiss(self) -> dict[str, Any]:
        import numpy as np

        try:
            import faiss
        except ImportError:
            return {"status": "skipped", "why": "faiss is not installed (gpu_smoke_pack.py packs it only with --full)"}

        vectors = np.ascontiguousarray(getattr(self, "vectors", None), dtype="float32")
        if vectors.ndim != 2:
            raise RuntimeError("no embeddings (the embedder step failed)")
        dim = vectors.shape[1]
        nlist = max(1, min(64, len(vectors) // 39))
        index = faiss.index_factory(dim, f"IVF{nlist},PQ64x4" if len(vectors) < 256 * 39 else f"IVF{nlist},PQ64x8",
                                    faiss.METRIC_INNER_PRODUCT)
        index.train(vectors)
        index.add(vectors)
        gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
        where = "cpu"
        if gpus and self.cuda:
            options = faiss.GpuClonerOptions()
            options.useFloat16LookupTables = True  # PQ M = 64 needs it on every NVIDIA GPU (48 KiB shared memory)
            index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index, options)
            where = "gpu"
        index.nprobe = min(16, nlist) if hasattr(index, "nprobe") else None
        started = time.perf_counter()
        _, ids = index.search(vectors[:256], 10)
        seconds = time.perf_counter() - started
        recall_self = float(np.mean(ids[:, 0] == np.arange(len(ids))))
        result = {"index": "IVF-PQ M=64", "nlist": nlist, "on": where, "faiss_gpus": gpus,
                  "queries_per_s": round(len(ids) / seconds, 1), "top1_is_self": round(recall_self, 3)}
        if where == "cpu" and self.cuda:
            result["status"] = "cpu-only"  # faiss without GPU support: the GPU clone did not run
        return result


STEPS = ("generate_kv_reuse", "sft_lora_bf16", "grpo_lora", "grpo_full_parameter", "dpo_lora", "embedder", "faiss")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for report.json and report.md")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny model, few passages (what CI runs)")
    parser.add_argument("--passages", type=int, default=None, help="passages embedded (default 5000; 200 dry)")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated subset of {','.join(STEPS)}")
    args = parser.parse_args(argv)
    smoke = Smoke(dry_run=args.dry_run, passages=args.passages or (200 if args.dry_run else 5000))
    environment = smoke.environment()
    print(json.dumps(environment), flush=True)
    for name in args.steps.split(","):
        if name not in STEPS:
            parser.error(f"unknown step {name!r} (known: {', '.join(STEPS)})")
        smoke.run(name, getattr(smoke, name))
    out = Path(args.out)
    failed = write_report(out, "GPU smoke test", environment, smoke.steps)
    print(f"report: {out / 'report.md'}; failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
