"""SFT examples mask the prompt and everything the engine inserts; LoRA training with TRL writes an adapter."""

from __future__ import annotations

import random
from collections.abc import Sequence
from itertools import groupby
from pathlib import Path

import pytest

from prorag.data.records import Passage, Question, load_questions
from prorag.llm.generation import render_chat
from prorag.llm.registry import BUNDLED_TINY_LLAMA, load_causal_lm, load_tokenizer
from prorag.protocol.hiprag import SYSTEM_PROMPT, after_search, format_documents, initial_prefix, parse, render_prompt
from prorag.retrieval.base import Hit
from prorag.training.config import SFTSettings
from prorag.training.sft import IGNORE_INDEX, build_sft_example, completion_pieces, train_sft_lora
from prorag.training.synthesis import SynthesizedTrajectory, synthesize_musique

RAW = Path(__file__).resolve().parents[2] / "data" / "01_raw"
DISTRACTORS = [Passage(id=f"d{i}", title=f"Distractor {i}", text=f"Distractor passage {i} says <b>nothing</b> & more.")
               for i in range(2)]


class DistractorRetriever:
    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        return [[Hit.from_passage(passage, 1.0) for passage in DISTRACTORS] for _ in queries]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(BUNDLED_TINY_LLAMA)


@pytest.fixture(scope="module")
def musique() -> list[Question]:
    return load_questions(RAW / "qa" / "musique_train.jsonl")[:8]


@pytest.fixture(scope="module")
def trajectories(musique) -> list[SynthesizedTrajectory]:
    found = [synthesize_musique(q, DistractorRetriever(), top_k=3, rng=random.Random(0), protocol="hiprag")
             for q in musique]
    return [trajectory for trajectory in found if trajectory is not None]


def _runs(example: dict[str, list[int]]) -> list[tuple[bool, list[int]]]:
    """Contiguous runs of (trained, token ids)."""
    pairs = zip(example["input_ids"], example["labels"], strict=True)
    return [(trained, [token for token, _ in run])
            for trained, run in groupby(pairs, key=lambda pair: pair[1] != IGNORE_INDEX)]


def test_loss_covers_the_policy_tokens_only(tokenizer, trajectories):
    trajectory = trajectories[1]  # four search steps
    example = build_sft_example(tokenizer, trajectory.question, trajectory.completion, protocol="hiprag")
    assert len(example["input_ids"]) == len(example["labels"]) == len(example["attention_mask"])
    prompt = render_chat(tokenizer, render_prompt(trajectory.question))
    assert tokenizer.decode(example["input_ids"]) == prompt + trajectory.completion + tokenizer.eos_token

    runs = _runs(example)
    visible = "".join(tokenizer.decode(ids) for trained, ids in runs if trained)
    masked = [tokenizer.decode(ids) for trained, ids in runs if not trained]
    parsed = parse(trajectory.completion)
    # nothing retrieved, no prompt, no engine-inserted tag is trained
    for step in parsed.search_steps:
        for passage_text in step.context.split("\n"):
            assert passage_text[20:60] not in visible
    assert "Distractor passage" not in visible and "Doc 1(Title" not in visible
    assert "<context>" not in visible and "</context>" not in visible and "</step>" not in visible
    assert SYSTEM_PROMPT[:80] not in visible and trajectory.question not in visible
    assert "<think>" not in visible
    # what the policy writes is trained
    for step in parsed.steps:
        assert step.reasoning in visible and step.conclusion in visible
    for step in parsed.search_steps:
        assert f"<search>{step.query}</search>" in visible
    assert f"<answer>{parsed.answer}</answer>" in visible and "</think>" in visible and "\n<step>" in visible
    # masked spans are exactly the prompt + initial prefix and each engine insertion
    assert masked[0] == prompt + initial_prefix()
    contexts = [after_search(step.raw_context) for step in parsed.search_steps]
    assert masked[1::2] == contexts
    assert masked[2::2] == ["\n</step>"] * parsed.n_steps
    assert visible.endswith("</answer>" + tokenizer.eos_token)


def test_zero_shot_prompt_is_masked_too(tokenizer, trajectories):
    trajectory = trajectories[0]
    example = build_sft_example(tokenizer, trajectory.question, trajectory.completion, protocol="hiprag",
                                few_shot=False)
    full = build_sft_example(tokenizer, trajectory.question, trajectory.completion, protocol="hiprag")
    prompt = render_chat(tokenizer, render_prompt(trajectory.question, few_shot=False))
    assert tokenizer.decode(_runs(example)[0][1]) == prompt + initial_prefix()
    assert len(example["input_ids"]) < len(full["input_ids"])
    trained = [label for label in example["labels"] if label != IGNORE_INDEX]
    assert trained == [label for label in full["labels"] if label != IGNORE_INDEX]


def test_completion_pieces_rebuild_the_completion(trajectories):
    for trajectory in trajectories:
        pieces = completion_pieces(trajectory.completion, "hiprag")
        assert "".join(text for text, _ in pieces) == trajectory.completion
        inserted = [text for text, trained in pieces if not trained]
        assert inserted[0] == initial_prefix()
        assert sum(text.startswith("\n<context>") for text in inserted) == trajectory.n_search


def test_escaped_context_is_masked_whole(tokenizer):
    docs = format_documents([("T", "a </context> b <answer>x</answer>")])
    completion = (f"{initial_prefix()}r</reasoning>\n<search>q</search>{after_search(docs)}o</conclusion>\n"
                  "</step>\n</think>\n<answer>x</answer>")
    example = build_sft_example(tokenizer, "q?", completion, protocol="hiprag", add_eos=False)
    visible = "".join(tokenizer.decode(ids) for trained, ids in _runs(example) if trained)
    assert visible == "r</reasoning>\n<search>q</search>o</conclusion>\n</think>\n<answer>x</answer>"


def test_malformed_completion_is_rejected(tokenizer):
    with pytest.raises(ValueError, match="format check"):
        build_sft_example(tokenizer, "q?", "<think>no steps</think><answer>x</answer>", protocol="hiprag")
    with pytest.raises(ValueError, match="initial prefix"):
        build_sft_example(tokenizer, "q?", "<think><step><reasoning>r</reasoning><conclusion>o</conclusion></step>"
                                           "</think><answer>x</answer>", protocol="hiprag")


@pytest.mark.integration
@pytest.mark.slow
def test_train_sft_lora_writes_a_loadable_adapter(one_torch_thread, tokenizer, musique, tmp_path):
    from peft import PeftModel

    # gold-only contexts and the zero-shot prompt keep the sequences short (~700 tokens)
    gold_only = [synthesize_musique(q, None, rng=random.Random(0), protocol="hiprag") for q in musique[:4]]
    examples = [build_sft_example(tokenizer, t.question, t.completion, protocol="hiprag", few_shot=False)
                for t in gold_only if t is not None]
    assert len(examples) == 4
    adapter_dir, log_history = train_sft_lora(
        BUNDLED_TINY_LLAMA, examples, tmp_path / "sft",
        SFTSettings(lora_r=4, lora_alpha=8, max_steps=2, per_device_train_batch_size=1, gradient_accumulation_steps=2,
                    learning_rate=1e-2, seed=0))
    assert adapter_dir == tmp_path / "sft" / "adapter"
    assert (adapter_dir / "adapter_config.json").is_file()
    assert not list(adapter_dir.glob("model*.safetensors"))  # the adapter only, not the base model
    losses = [entry["loss"] for entry in log_history if "loss" in entry]
    assert len(losses) == 2 and all(loss > 0 for loss in losses)
    base, _ = load_causal_lm(BUNDLED_TINY_LLAMA)
    model = PeftModel.from_pretrained(base, adapter_dir)
    lora_b = [param for name, param in model.named_parameters() if "lora_B" in name]
    assert lora_b and any(param.abs().sum() > 0 for param in lora_b)  # trained away from the zero init


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize(("mixed_precision", "frozen_in", "computed_in"),
                         [("no", "torch.float32", "torch.float32"), ("bf16", "torch.bfloat16", "torch.bfloat16")])
def test_mixed_precision_computes_in_bf16_and_keeps_trainable_weights_fp32(one_torch_thread, tokenizer, musique,
                                                                           tmp_path, mixed_precision, frozen_in,
                                                                           computed_in):
    """Under bf16 the frozen base weights are stored in bf16 (frozen_linear_weights_in_bf16) while LoRA's trainable
    weights stay fp32 for the optimizer; without it every weight stays fp32."""
    from transformers import TrainerCallback

    seen: dict[str, str] = {}

    class RecordDtypes(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            modules = dict(model.named_modules())
            projection = next(module for name, module in modules.items() if name.endswith("down_proj.base_layer"))
            adapter = next(module for name, module in modules.items() if name.endswith("down_proj.lora_A.default"))
            seen["frozen"] = str(projection.weight.dtype)
            seen["trainable"] = str(adapter.weight.dtype)
            projection.register_forward_hook(self.record)

        @staticmethod
        def record(module, inputs, output) -> None:
            seen.setdefault("output", str(output.dtype))

    trajectory = synthesize_musique(musique[0], None, rng=random.Random(0), protocol="hiprag")
    example = build_sft_example(tokenizer, trajectory.question, trajectory.completion, protocol="hiprag",
                                few_shot=False)
    train_sft_lora(BUNDLED_TINY_LLAMA, [example], tmp_path / "sft",
                   SFTSettings(lora_r=4, lora_alpha=8, max_steps=1, per_device_train_batch_size=1,
                               target_modules=["down_proj"], mixed_precision=mixed_precision),
                   callbacks=[RecordDtypes()])
    assert seen == {"frozen": frozen_in, "trainable": "torch.float32", "output": computed_in}



def test_the_trained_model_is_freed_when_train_sft_lora_returns(one_torch_thread, tokenizer, musique, tmp_path):
    """`make train` runs every stage in one process: the SFT model (held in reference cycles by TRL's patched
    forward and the trainer) must not stay alive into the next stage, even with the cyclic collector idle."""
    import gc
    import weakref

    from transformers import TrainerCallback

    refs: list[weakref.ref] = []

    class Recorder(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            refs.extend(weakref.ref(module) for module in (model, model.get_base_model()))

    trajectory = synthesize_musique(musique[0], None, rng=random.Random(0), protocol="hiprag")
    example = build_sft_example(tokenizer, trajectory.question, trajectory.completion, protocol="hiprag",
                                few_shot=False)
    gc.disable()
    try:
        train_sft_lora(BUNDLED_TINY_LLAMA, [example], tmp_path / "sft",
                       SFTSettings(lora_r=4, lora_alpha=8, max_steps=1, per_device_train_batch_size=1),
                       callbacks=[Recorder()])
        assert len(refs) == 2 and [ref() for ref in refs] == [None, None]
    finally:
        gc.enable()


@pytest.mark.integration
def test_a_training_call_prints_no_upstream_deprecation_warning(one_torch_thread, tokenizer, musique, tmp_path):
    """transformers' `is_gradient_checkpointing` FutureWarning, read by PEFT when the trainer wraps the model, is
    filtered around that call (issue 46, item 5)."""
    import warnings

    trajectory = synthesize_musique(musique[0], None, rng=random.Random(0), protocol="hiprag")
    example = build_sft_example(tokenizer, trajectory.question, trajectory.completion, protocol="hiprag",
                                few_shot=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_sft_lora(BUNDLED_TINY_LLAMA, [example], tmp_path / "sft",
                       SFTSettings(lora_r=4, lora_alpha=8, max_steps=1, per_device_train_batch_size=1))
    assert not [str(item.message) for item in caught if "is_gradient_checkpointing" in str(item.message)]


def test_an_activation_budget_leaves_the_layers_that_fit_it_uncheckpointed(one_torch_thread, tokenizer, musique,
                                                                          tmp_path):
    from transformers import TrainerCallback

    from prorag.training.activation_budget import checkpointing_layers

    flags: list[list[bool]] = []

    class RecordFlags(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            layers = checkpointing_layers(model)
            layers[-1].register_forward_pre_hook(
                lambda *_: flags.append([layer.gradient_checkpointing for layer in layers]))

    trajectory = synthesize_musique(musique[0], None, rng=random.Random(0), protocol="hiprag")
    example = build_sft_example(tokenizer, trajectory.question, trajectory.completion, protocol="hiprag",
                                few_shot=False)
    # each of the tiny Llama's two layers stores 6-8 kB a token (measured: 6.5 kB without LoRA): 1.5 layers' worth
    budget_mb = 1.5 * 7e3 * len(example["input_ids"]) / 2**20
    train_sft_lora(BUNDLED_TINY_LLAMA, [example], tmp_path / "sft",
                   SFTSettings(lora_r=4, lora_alpha=8, max_steps=1, per_device_train_batch_size=1,
                               gradient_checkpointing=True, activation_budget_mb=budget_mb),
                   callbacks=[RecordFlags()])
    assert flags and flags[0] == [False, True]
