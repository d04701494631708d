"""A protocol plugs in without touching library code: a toy protocol registered here runs through the rollout
engine (via ``build_runner``), becomes an SFT example (its own label mask) and is judged by the reward-judging node
(the same scorer as RL)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

import pytest

from prorag.agent import Rollout, build_runner
from prorag.pipelines.reward_judging.nodes import judge_trajectories
from prorag.pipelines.reward_judging.params import RewardJudgingParams
from prorag.protocol.base import Boundary, ProtocolAdapter, StepDict, split_inserted
from prorag.protocol.markup import last_between
from prorag.protocol.registry import protocol_names, register_protocol, unregister_protocol
from prorag.retrieval import build_retrieval_index
from prorag.rewards.hiprag import HiPRAGSettings
from prorag.specs import MethodSpec, PolicySpec, SamplingSpec
from prorag.training.sft import IGNORE_INDEX, build_sft_example

QUESTION: Final = "Between Harvey Pekar and Denise Levertov who was born earlier?"
SCRIPT: Final = ("I should look up Pekar.<q>Harvey Pekar</q>"
                 "Pekar was born in 1939 in Cleveland.<a>Harvey Pekar</a>")
_ROUND: Final = re.compile(r"(.*?)<q>(.*?)</q>\n<docs>(.*?)</docs>\n", re.DOTALL)


@dataclass(frozen=True)
class ToyAdapter:
    """``<q>query</q>`` searches, ``<docs>…</docs>`` insertions, ``<a>answer</a>``; the text after each insertion
    is that search step's conclusion."""

    name: str = "toy"
    stop_strings: tuple[str, ...] = ("</q>", "</a>")
    step_on_search: bool = True

    def messages(self, question: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"Search with <q>…</q>, answer with <a>…</a>.\nQuestion: {question}"}]

    def initial_prefix(self) -> str:
        return ""

    def boundary(self, stop: str, completion: str) -> Boundary | None:
        return {"</q>": "search", "</a>": "answer"}.get(stop)  # type: ignore[return-value]

    def query(self, transcript: str) -> str:
        return last_between(transcript, "<q>", "</q>") or ""

    def insertion(self, docs_text: str) -> str:
        return f"\n<docs>{docs_text}</docs>\n"

    def after_step(self, step_index: int, budget: int) -> str:
        return ""

    def forced_answer(self, transcript: str) -> str:
        return "<a>"

    def check_format(self, completion: str) -> tuple[int, int]:
        steps = self.steps(completion)
        return (1, len(steps)) if steps is not None else (0, -1)

    def steps(self, completion: str) -> list[StepDict] | None:
        if not completion.endswith("</a>"):
            return None
        rounds = list(_ROUND.finditer(completion))
        ends = [match.end() for match in rounds[1:]] + [completion.rindex("<a>")]
        return [{"kind": "search", "reasoning": match.group(1), "query": match.group(2), "context": match.group(3),
                 "conclusion": completion[match.end():end].split("<q>")[0]}
                for match, end in zip(rounds, ends, strict=True)]

    def extract_answer(self, completion: str) -> str | None:
        return last_between(completion, "<a>", "</a>")

    def label_pieces(self, completion: str) -> list[tuple[str, bool]]:
        return split_inserted(completion, self)


@pytest.fixture
def toy_protocol() -> Iterator[str]:
    register_protocol("toy", ToyAdapter)
    yield "toy"
    unregister_protocol("toy")


def test_a_registered_protocol_runs_end_to_end(toy_protocol, scripted, keyword_retriever, passages, tokenizer,
                                               one_torch_thread):
    assert isinstance(ToyAdapter(), ProtocolAdapter) and "toy" in protocol_names()
    method = MethodSpec(name="toy_agent", kind="agent", protocol=toy_protocol, step_budget=2)  # validated by name

    runner = build_runner(method, scripted({QUESTION: SCRIPT}), keyword_retriever(), top_k=2,
                          sampling=SamplingSpec())
    (rollout,) = runner([QUESTION])
    assert (rollout.protocol, rollout.method, rollout.stop_reason) == ("toy", "toy_agent", "answer")
    assert rollout.format_ok and rollout.n_steps == 1 and rollout.answer == "Harvey Pekar"
    assert rollout.queries == ["Harvey Pekar"] and "<docs>Doc 1(Title:" in rollout.completion

    example = build_sft_example(tokenizer, QUESTION, rollout.completion, protocol=toy_protocol)
    trained = tokenizer.decode([token for token, label in zip(example["input_ids"], example["labels"], strict=True)
                                if label != IGNORE_INDEX])
    assert "Harvey Pekar</q>" in trained and "</a>" in trained
    assert "<docs>" not in trained and "Doc 1(Title:" not in trained  # the inserted documents are not trained

    index = build_retrieval_index(passages, "hashing:64", show_progress=False)
    records = [rollout.to_dict(), {**rollout.to_dict(), "protocol": "short_answer", "method": "direct"}]
    verdicts, table, metrics = judge_trajectories(records, index, RewardJudgingParams(), HiPRAGSettings(),
                                                  PolicySpec(model="bundled:tiny-random-llama", batch_size=2))
    assert metrics["skipped_trajectories"] == 1  # the baseline's record has no agent protocol
    assert list(table["method"]) == ["toy_agent"]
    assert table["format"].iloc[0] == pytest.approx(0.2)  # λf·F: the toy format check passed (eq. 1)
    assert [step["kind"] for step in verdicts[0]["steps"]] == ["search"]  # its search step was judged
    assert metrics["toy_agent"]["steps"] == 1
    assert Rollout.from_dict(records[0]).protocol == "toy"


def test_an_unregistered_protocol_is_rejected_by_name():
    with pytest.raises(ValueError, match="unknown protocol 'toy'"):
        MethodSpec(name="x", kind="agent", protocol="toy")
