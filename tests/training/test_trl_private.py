"""TRL's fused LM head scoring only labelled positions on the CPU: the same log-probabilities, fewer rows."""

from __future__ import annotations

import pytest
import torch
import trl.trainer.utils as trl_trainer_utils
from trl.kernels import chunked_logprob

from prorag.llm.registry import BUNDLED_TINY_LLAMA, load_causal_lm
from prorag.training.trl_private import score_labelled_positions_only


def fused_log_probs(model, input_ids, labels, rows: list[int]) -> tuple[torch.Tensor, list[int]]:
    rows.clear()
    with torch.no_grad():
        log_probs = model(input_ids=input_ids, labels=labels, fused_lm_head=True).log_probs
    return log_probs, list(rows)


def test_the_cpu_scores_only_labelled_positions_with_the_same_log_probabilities(one_torch_thread, monkeypatch):
    model, _ = load_causal_lm(BUNDLED_TINY_LLAMA)
    trl_trainer_utils.add_fused_lm_head(model, outputs=("log_probs",))
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, 1000, (2, 40), generator=generator)
    labels = torch.full_like(input_ids, -100)
    labels[0, 30:] = input_ids[0, 30:]  # a completion after a prompt: 10 + 5 labelled tokens
    labels[1, 35:] = input_ids[1, 35:]
    # TRL's own choice (an earlier training call in this process may have installed ours); restored after the test
    monkeypatch.setattr(trl_trainer_utils, "_use_triton", chunked_logprob._use_triton)
    rows: list[int] = []  # the positions each call projects onto the vocabulary
    apply = chunked_logprob.ChunkedLogProbFunction.apply

    def counting(hidden, *args):
        rows.append(hidden.shape[0])
        return apply(hidden, *args)

    monkeypatch.setattr(trl_trainer_utils._ChunkedLogProbFunction, "apply", counting)
    every, every_rows = fused_log_probs(model, input_ids, labels, rows)
    score_labelled_positions_only()
    score_labelled_positions_only()  # idempotent: one wrapper
    assert not getattr(chunked_logprob._use_triton, "scores_labelled_positions_on_cpu", False)
    labelled, labelled_rows = fused_log_probs(model, input_ids, labels, rows)
    assert every_rows == [2 * 39] and labelled_rows == [10 + 5]  # every shifted position vs the labelled ones
    mask = labels[:, 1:] != -100
    assert torch.allclose(labelled[mask], every[mask], atol=1e-5)
    assert torch.count_nonzero(labelled[~mask]) == 0
    assert pytest.approx(float(labelled.sum()), rel=1e-5) == float(every.sum())
