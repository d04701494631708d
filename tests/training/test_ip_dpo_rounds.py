"""One IP-DPO run end to end: batched engine (TeaRAG protocol) → rewards → pairs → DPO + SFT on the tiny model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prorag.data.records import Question
from prorag.llm.generation import Completion, SamplingParams, cut_at_stop, render_chat
from prorag.llm.registry import BUNDLED_TINY_LLAMA, load_tokenizer
from prorag.retrieval.base import Hit, check_search_args
from prorag.rewards.tearag import KnowledgeMatchingReward, KnowledgeMatchingSettings
from prorag.specs import SamplingSpec, TrainedAgentSpec
from prorag.training.dpo import DPOTrainingConfig
from prorag.training.ip_dpo import IPDPOSettings, PairRules, run_ip_dpo


class ParityPolicy:
    """Writes a TeaRAG path; in each batch, even positions answer right and odd positions write nonsense (so the
    samples of a question split into a chosen path and a format rejection)."""

    def __init__(self, tokenizer: Any, answers: dict[str, str]) -> None:
        self._tokenizer = tokenizer
        self.answers = answers

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def apply_chat_template(self, messages: Sequence[dict[str, Any]]) -> str:
        return render_chat(self._tokenizer, messages)

    def generate(self, prompts: Sequence[str | list[int]], params: SamplingParams) -> list[list[Completion]]:
        results = []
        for position, prompt in enumerate(prompts):
            text = self._tokenizer.decode(prompt) if not isinstance(prompt, str) else prompt
            question = next(q for q in self.answers if f"Question: {q}" in text)
            answer = self.answers[question]
            if text.endswith("<entities>"):
                script = f"{question.split()[-1]}</entities>\n<subquery>{question}</subquery>"
            elif text.endswith("<summary>"):
                script = f"The answer is {answer}.</summary>"
            elif position % 2 == 0:
                script = f"<answer>{answer}</answer>"
            else:
                script = "I do not know the format"
            cut, stop = cut_at_stop(script, params.stop)
            ids = self._tokenizer(cut, add_special_tokens=False)["input_ids"]
            finish = "stop"
            if stop is None:
                ids = [*ids, self._tokenizer.eos_token_id]
            results.append([Completion(text=cut, token_ids=ids, logprobs=None, finish_reason=finish, stop=stop,
                                       prompt_tokens=len(prompt))])
        return results


class OneDocRetriever:
    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        return [[Hit("d1", "Doc", f"About {query.splitlines()[0]}", 1.0)] for query in check_search_args(queries, k)]


def _tiny_adapter(path: Path) -> str:
    from peft import LoraConfig, get_peft_model

    from prorag.llm.registry import load_causal_lm

    model, _ = load_causal_lm(BUNDLED_TINY_LLAMA)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            task_type="CAUSAL_LM"))
    peft.save_pretrained(str(path))
    return str(path)


@pytest.mark.integration
@pytest.mark.slow
def test_one_round_samples_scores_pairs_and_trains(tmp_path: Path, one_torch_thread: None) -> None:
    tokenizer = load_tokenizer(BUNDLED_TINY_LLAMA)
    questions = [Question(id="q1", question="Who wrote Hamlet", golden_answers=("William Shakespeare",),
                          dataset="nq", source="nq"),
                 Question(id="q2", question="Where is Paris", golden_answers=("France",), dataset="nq", source="nq")]
    policy = ParityPolicy(tokenizer, {q.question: q.golden_answers[0] for q in questions})
    agent = TrainedAgentSpec(protocol="tearag", name="tearag_agent", step_budget=2, max_new_tokens_per_turn=64,
                             max_total_new_tokens=128)
    similarity = lambda evidence, texts: np.zeros((len(evidence), len(texts)))  # noqa: E731 (single-hop: unused)
    results = run_ip_dpo(
        BUNDLED_TINY_LLAMA, _tiny_adapter(tmp_path / "sft"), questions, OneDocRetriever(), agent,
        SamplingSpec(temperature=1.0), KnowledgeMatchingReward(KnowledgeMatchingSettings(), similarity),
        IPDPOSettings(rounds=2, samples_per_question=2, top_k=1, rules=PairRules()),
        DPOTrainingConfig(beta=0.1, sft_weight=1.0, learning_rate=1e-3, max_steps=1, gradient_accumulation_steps=1,
                          warmup_ratio=0.0, lr_scheduler_type="constant"),
        tmp_path / "rounds", generator_factory=lambda adapter: policy)
    assert [result.round for result in results] == [1, 2]
    first = results[0]
    # each question: sample 0 (even) is a one-step correct path (r_o = 1/1), sample 1 fails the format
    assert first.metrics["pairs_format"] == 2 and first.metrics["pairs_total"] == 2
    assert first.metrics["format_rate"] == 0.5 and first.metrics["mean_steps"] == 1.0
    assert first.adapter is not None and Path(first.adapter, "adapter_config.json").exists()
    assert any("loss" in entry for entry in first.log_history)
    pair = first.pairs[0]
    assert pair["chosen"]["completion"].endswith("</answer>") and pair["kind"] == "format"
    assert results[1].adapter is not None and results[1].adapter != first.adapter  # resampled, trained again
