"""The judges' prompts and reply parsers.

Sources:

* :data:`OVER_SEARCH_PROMPT` — HiPRAG Figure 5 ("Prompt for Over-search Detection"), verbatim.
* :data:`UNDER_SEARCH_PROMPT` — HiPRAG Figure 6 ("Prompt for Under-search Detection"), verbatim. The paper's
  ``**…**`` emphasis is kept (it is markdown the judge reads well); the back-ticks around tags in our copy of
  the paper are its typesetting of code and are left out.
* :data:`ANSWER_JUDGE_TEMPLATE` — the multi-stage paper's "Instruction for Judge LLM" (Appendix B.4), verbatim
  in its words. The paper's text is flattened onto one line and its placeholders read "normalized prediction"
  and "normalized golden"; we put the blocks on separate lines and fill the placeholders with the
  SQuAD-normalized prediction and the list of normalized golden answers (a Python list literal).

The papers give the instructions but not how the judged material is laid out. We send the instruction as the
system message and the material as the user message:

* over-search: ``Statement 1: <o>`` and ``Statement 2: <o′>`` on two lines (:func:`equivalence_messages`);
* under-search: the step in the tags the instruction names, ``<reasoning>…</reasoning>`` and
  ``<conclusion>…</conclusion>``, alone (the paper's "single, isolated reasoning step"), or after the question the
  agent was answering (``under_search_input: step_and_question``) (:func:`step_messages`);
* answer check: the whole filled template as one user message (the paper's template is self-contained).

Reply parsing is strict: :func:`parse_boolean_answer` accepts only ``<answer>True</answer>`` /
``<answer>False</answer>`` (case-insensitive, white space tolerated, the last ``<answer>`` tag wins) and
:func:`parse_yes_no` only a reply that is the single word YES or NO; anything else is unknown (None).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from prorag.metrics.qa import normalize_answer

OVER_SEARCH_PROMPT: Final = (
    "You are an expert in Natural Language Understanding and Semantic Analysis. Your goal is to determine if "
    "these two statements are semantically equivalent—that is, if they mean the same thing and convey the same "
    'core information. Provide your answers with a single boolean value "True" or "False" in the tag '
    "<answer></answer> (e.g. <answer>True</answer> or <answer>False</answer>)."
)
"""HiPRAG Figure 5, verbatim."""

UNDER_SEARCH_PROMPT: Final = (
    "You are an expert Fact-Checker and Logic Verifier. Your task is to evaluate a single, isolated reasoning "
    "step from an AI agent.\n\n"
    "This step was generated without using a search tool. Your goal is to determine if the agent made a mistake "
    "by not searching, based only on the information within this single step and your own general knowledge.\n\n"
    "Analyze the provided step by asking two questions:\n\n"
    "1. **Factual Accuracy:** Is the statement in the <reasoning></reasoning> and <conclusion></conclusion> "
    "factually correct?\n"
    "2. **Internal Logic:** Does the <conclusion></conclusion> logically follow from the "
    "<reasoning></reasoning> provided within this same step?\n\n"
    'If both questions are answered correctly, provide your answers with a single boolean value "True" or '
    '"False" in the tag <answer></answer> (e.g. <answer>True</answer> or <answer>False</answer>).'
)
"""HiPRAG Figure 6, verbatim (True = the step is correct, i.e. *not* an under-search)."""

ANSWER_JUDGE_TEMPLATE: Final = (
    "You are an evaluation assistant. Your task is to determine whether the given prediction semantically "
    "matches any of the reference answers. This is a flexible match: even if the wording is different, if the "
    "meaning is the same, consider it a match.\n\n"
    "Prediction: {prediction}\n"
    "Reference Answers: {golden}\n\n"
    "Please answer with a single word:\n"
    "- YES → if the prediction expresses the same meaning as any of the reference answers.\n"
    "- NO → otherwise.\n\n"
    "Only respond with YES or NO."
)
"""Multi-stage paper, Appendix B.4 "Instruction for Judge LLM" (line breaks ours)."""

Messages = list[dict[str, str]]


def equivalence_messages(statement_a: str, statement_b: str) -> Messages:
    """Chat messages asking whether two statements are equivalent (Figure 5)."""
    return [
        {"role": "system", "content": OVER_SEARCH_PROMPT},
        {"role": "user", "content": f"Statement 1: {statement_a.strip()}\nStatement 2: {statement_b.strip()}"},
    ]


def step_messages(question: str, reasoning: str, conclusion: str) -> Messages:
    """Chat messages asking whether a non-search step is correct (Figure 6). An empty ``question`` sends the step
    alone, as the paper's verifier sees it ("a single, isolated reasoning step"); a question is sent before it
    (``under_search_input: step_and_question``, prorag's earlier layout)."""
    step = f"<reasoning>{reasoning.strip()}</reasoning>\n<conclusion>{conclusion.strip()}</conclusion>"
    if not question.strip():
        return [{"role": "system", "content": UNDER_SEARCH_PROMPT}, {"role": "user", "content": step}]
    user = f"The agent is answering the question: {question.strip()}\n\nThe step to evaluate:\n{step}"
    return [{"role": "system", "content": UNDER_SEARCH_PROMPT}, {"role": "user", "content": user}]


def answer_messages(golden_answers: Sequence[str], prediction: str) -> Messages:
    """Chat messages asking whether a prediction matches a golden answer (multi-stage paper, B.4)."""
    golden = [normalize_answer(answer) for answer in golden_answers]
    content = ANSWER_JUDGE_TEMPLATE.format(prediction=normalize_answer(prediction), golden=golden)
    return [{"role": "user", "content": content}]


_ANSWER_TAG = re.compile(r"<\s*answer\s*>(.*?)<\s*/\s*answer\s*>", re.IGNORECASE | re.DOTALL)
_YES_NO = re.compile(r"\W*(yes|no)\W*", re.IGNORECASE)


def parse_boolean_answer(reply: str | None) -> bool | None:
    """``True``/``False`` from the last ``<answer>…</answer>`` of ``reply`` when it holds exactly ``True`` or
    ``False`` (case-insensitive, surrounding white space allowed); None for anything else."""
    if not reply:
        return None
    matches = _ANSWER_TAG.findall(reply)
    if not matches:
        return None
    value = matches[-1].strip().lower()
    if value == "true":
        return True
    if value == "false":
        return False
    return None


def parse_yes_no(reply: str | None) -> bool | None:
    """``True`` for a reply that is the single word YES, ``False`` for NO (any case, surrounding punctuation
    and white space allowed, e.g. ``"Yes."``, ``"**NO**"``); None for anything else."""
    if not reply:
        return None
    match = _YES_NO.fullmatch(reply.strip())
    if match is None:
        return None
    return match.group(1).lower() == "yes"
