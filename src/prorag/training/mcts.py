"""MCTS process supervision for ReasonRAG (§2.2.2–2.2.3, Appendix A): trees of Reasoning / Grounding / Terminal
states over the ReasonRAG protocol, SPRE node values, and step-level preference pairs.

A node is a state ``s = (x, y_<i, stage)`` reached by one action (query / evidence / answer) and holds
``{N(s), Q(s), stage}``. Every iteration, for each question of a batch at once:

1. **Selection** (eq. 5): from the root, the live child with the highest
   ``Q(s_i) + c_uct · sqrt(Σ_j N(s_j)) / (1 + N(s_i))`` (:func:`uct_scores`; the parent's count is the sum of its
   children's visits, as printed), until a node that is not yet expanded. ``uct="paper"`` (default) applies eq. 5
   as printed to every child, so an unvisited child (``Q = 0``, ``N = 0``) scores ``c_uct · sqrt(Σ_j N_j)`` (0 when
   no sibling was visited); ``uct="released_code"`` is the authors' released code, where an unvisited child
   scores ``+inf`` (``default_uct_score``). The two differ only when a selected node has unvisited children:
   never in ``value="rollout"`` (every new child is valued at once), often in ``value="judge"`` (an unknown
   verdict leaves a child unvisited).
2. **Expansion**: the missing ``max_children`` actions sampled from the policy for every selected node of every
   question in ONE ``Generator.generate`` call (``SamplingParams(n=...)``), then ONE ``Retriever.search`` call for
   every new query. Malformed samples and duplicate siblings are dropped (counted); a node short of children is
   expanded again (up to ``max_expansions`` attempts), and one without any valid child after them is dead. At the
   round limit ``N`` the protocol's forced answer is inserted (as the engine does). ``action_leads`` (off in the
   paper's setting) lets the tree open a query or an answer for a policy too small to write the tags itself.
3. **Value**: ``value="rollout"`` — SPRE (eq. 1, :func:`prorag.rewards.spre.spre_value`): ``k`` simulations to a
   final answer (batched across all new nodes), ``v`` = F1 to the gold answers (a simulation that ends without
   an answer has ``v = 0``), ``steps`` = the rounds of the whole trajectory; ``value="judge"`` — eq. 6,
   ``v(s) = π_θ(· | x, y_1:t, answer, p_eval)``: with ``judge_prompt="process_evaluation"`` (the paper) the
   explorer policy itself reads Figure 14's "Process Evaluation" prompt, the question, the golden answer and the
   partial process (:func:`prorag.protocol.reasonrag.process_evaluation_messages`, greedy) and ``v`` is the score
   its reply ends with (``So the score is s``; :func:`prorag.protocol.reasonrag.parse_process_score` reads the
   paper's own 0–100 replies as s/100); with ``judge_prompt="answer_matching"`` (prorag's
   earlier reading) a :class:`prorag.judges.base.Judge`'s binary ``answer_correct`` on the process so far gives
   ``v ∈ {0, 1}``. An unparsable reply or *unknown* verdict is excluded (no backpropagation), never counted
   correct. A Terminal node's value is exact in both modes: ``F1 · α^depth``.
4. **Backpropagation** (eq. 7): ``N(s) += 1`` and ``Q(s)`` = the mean of the values propagated through ``s``.

Branches that yield no final answer are pruned: a node none of whose simulations or descendants reached an answer
is excluded from selection (rollout mode) and from the pairs (both modes).

Determinism: every generate call gets ``seed + a call counter``; questions are searched in fixed batches of
``questions_per_batch``, so the same questions, configuration and backend give the same trees. Each finished
question's tree is appended to a JSONL results file (one node per line); a restarted search skips the questions
already there, so a crash never costs a finished question (see :func:`run_mcts`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import Field, create_model
from tqdm.auto import tqdm

from prorag.agent.engine import EMPTY_QUERY_NOTE, QuestionItem, as_question_items, documents_text
from prorag.config import StrictModel
from prorag.data.records import Question
from prorag.judges.base import Judge
from prorag.llm.generation import Completion, Generator, SamplingParams
from prorag.metrics.qa import f1_score
from prorag.protocol import reasonrag
from prorag.protocol.escaping import escape_retrieved
from prorag.retrieval.base import Retriever
from prorag.rewards.spre import spre_value
from prorag.specs import JudgeSpec, PositiveInt, Seed

logger = logging.getLogger(__name__)

TREE_SCHEMA: Final = "prorag.reasonrag_tree/v1"
PAIR_SCHEMA: Final = "prorag.reasonrag_pair/v1"
MIN_REWARD_GAP: Final = 0.01
"""§2.2.3: pairs whose reward difference is below this are dropped."""
_NEXT_STAGE: Final[dict[str, reasonrag.Stage]] = {"query": "grounding", "evidence": "reasoning", "answer": "terminal"}
_ACTION_LETTER: Final = {"query": "Q", "evidence": "E", "answer": "A"}
QUERY_OPENING: Final = reasonrag.QUERY_PREFIX + reasonrag.QUERY_OPEN
ANSWER_OPENING: Final = reasonrag.ANSWER_PREFIX + reasonrag.ANSWER_OPEN


UCTVariant = Literal["paper", "released_code"]


def uct_scores(q_values: Sequence[float], visit_counts: Sequence[int], c_uct: float, *,
               variant: UCTVariant = "paper") -> list[float]:
    """Eq. 5 for the children of one node: ``Q_i + c_uct · sqrt(Σ_j N_j) / (1 + N_i)``, finite for every child
    (``variant="paper"``); ``variant="released_code"`` scores an unvisited child (``N_i = 0``) ``+inf`` instead."""
    q_values, visit_counts = list(q_values), list(visit_counts)
    if len(q_values) != len(visit_counts):
        raise ValueError(f"{len(q_values)} Q values but {len(visit_counts)} visit counts")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in visit_counts):
        raise ValueError(f"visit counts must be non-negative ints, got {visit_counts!r}")
    if not c_uct >= 0:
        raise ValueError(f"c_uct must be >= 0, got {c_uct!r}")
    if variant not in ("paper", "released_code"):
        raise ValueError(f"unknown UCT variant {variant!r} (use 'paper' or 'released_code')")
    exploration = math.sqrt(sum(visit_counts))
    return [math.inf if n == 0 and variant == "released_code" else float(q) + c_uct * exploration / (1 + n)
            for q, n in zip(q_values, visit_counts, strict=True)]


class MCTSConfig(StrictModel):
    """Search settings: ``reasonrag_data.mcts`` with the method's :class:`MCTSValue`. The defaults are the anchor code's
    (``max_rollouts`` = 64 iterations, ``max_children`` = 2, ``c`` = 1.414, decay 0.95, ``max_iter`` = 7)."""

    iterations: PositiveInt = 64
    max_children: PositiveInt = 2
    max_expansions: PositiveInt = 1
    """Expansion attempts of a node: one that has fewer than ``max_children`` valid children after an attempt
    (malformed or duplicate samples) is expanded again, up to this many times; with none at the end it is dead."""
    rollouts: PositiveInt = 4
    """``k`` of eq. 1: simulations per new node (value="rollout"); the paper does not give it."""
    c_uct: float = Field(default=1.414, ge=0)
    uct: UCTVariant = "paper"
    """Eq. 5 as printed (``paper``: an unvisited child scores ``c_uct·sqrt(Σ N)``) or the authors' released code
    (``released_code``: an unvisited child scores ``+inf``); see :func:`uct_scores`."""
    alpha: float = Field(default=0.95, gt=0, le=1)
    max_rounds: int = Field(default=7, ge=3)
    """Algorithm 1's round limit ``N``."""
    value: Literal["rollout", "judge"] = "rollout"
    """rollout: SPRE simulations (eq. 1); judge: the LLM correctness judgment of eq. 6."""
    judge_prompt: Literal["process_evaluation", "answer_matching"] = "process_evaluation"
    """Eq. 6 with ``value="judge"``: ``process_evaluation`` (the paper) — the explorer policy scores the partial
    process in [0, 1] with Figure 14's prompt; ``answer_matching`` — the configured judge's binary answer check
    (the multi-stage YES/NO prompt) on the partial process (prorag's earlier behaviour)."""
    eval_max_new_tokens: PositiveInt = 256
    """Tokens of a Figure 14 reply ("Respond briefly and conclude with: So the score is [Score]")."""
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_new_tokens: PositiveInt = 128
    """Tokens per action (one round)."""
    top_k: PositiveInt = 3
    seed: Seed = 0
    questions_per_batch: PositiveInt = 8
    """Questions searched together (one generate call covers the frontier of all of them)."""
    few_shot: bool = False
    """The protocol prompt with its two worked examples (small policies); the paper's prompt has none."""
    action_leads: bool = False
    """Exploration aid for policies that rarely write a tag: a free Reasoning-stage action is sampled after an
    opening the tree writes, ``So the next query is <query>`` or ``So the answer is <answer>`` (half each; random in
    simulations). The opening is part of the action's text, so a DPO pair still compares two complete responses the
    policy could write. False (the paper): the policy writes its whole action."""

    @property
    def step_budget(self) -> int:
        return reasonrag.step_budget_for_rounds(self.max_rounds)


VALUE_FIELDS: Final = ("alpha", "rollouts", "judge_prompt", "eval_max_new_tokens")
"""The :class:`MCTSConfig` fields that define the node value (with ``value`` itself): :class:`MCTSValue`'s."""


def _value_field(name: str) -> Any:
    return (MCTSConfig.model_fields[name].annotation, MCTSConfig.model_fields[name])


class MCTSValue(create_model("_MCTSValueFields", __base__=StrictModel,  # type: ignore[misc]
                             **{name: _value_field(name) for name in VALUE_FIELDS})):
    """The value function of an MCTS method (its ``methods`` entry's ``value``): what the trees are searched for
    and the pairs ranked by. ``kind: spre`` — SPRE simulations (eq. 1, :func:`prorag.rewards.spre.spre_value`);
    ``kind: judge`` — the correctness judgment of eq. 6 (``judge_prompt``; ``judge`` is the judge of
    ``answer_matching``). The other fields are :class:`MCTSConfig`'s, declared there once."""

    kind: Literal["spre", "judge"] = "spre"
    judge: JudgeSpec = JudgeSpec()

    def search_settings(self) -> dict[str, Any]:
        """The :class:`MCTSConfig` fields this value sets."""
        return {"value": "rollout" if self.kind == "spre" else "judge",
                **{name: getattr(self, name) for name in VALUE_FIELDS}}


MCTSSearchParams = create_model(
    "MCTSSearchParams", __base__=StrictModel, __doc__="``reasonrag_data.mcts``: :class:`MCTSConfig` but the value, "
    "which is the method's (:class:`MCTSValue`).",
    **{name: (field.annotation, field) for name, field in MCTSConfig.model_fields.items()
       if name not in ("value", *VALUE_FIELDS)})


def search_config(search: StrictModel, value: MCTSValue, **overrides: Any) -> MCTSConfig:
    """The search settings ``search`` (:data:`MCTSSearchParams`) with the method's ``value`` and ``overrides``."""
    return MCTSConfig.model_validate({**search.model_dump(), **value.search_settings(), **overrides})


@dataclass
class Node:
    """One state. ``lead`` is protocol text inserted before the action (the forced answer), ``text`` what the
    policy generated, ``insertion`` what the protocol inserted after it (documents, a new line)."""

    id: int
    parent_id: int | None
    depth: int
    stage: reasonrag.Stage
    action: reasonrag.Action | None = None
    lead: str = ""
    text: str = ""
    insertion: str = ""
    answer: str | None = None
    searches: int = 0
    N: int = 0
    value_sum: float = 0.0
    value: float | None = None
    rollout_values: list[float] = field(default_factory=list)
    rollout_steps: list[int] = field(default_factory=list)
    retrieved_ids: list[str] = field(default_factory=list)
    children: list[int] = field(default_factory=list)
    expansions: int = 0
    expanded: bool = False
    dead: bool = False
    answered: bool = False
    invalid_samples: int = 0
    duplicate_samples: int = 0

    @property
    def Q(self) -> float:
        return self.value_sum / self.N if self.N else 0.0


class QuestionTree:
    """The search tree of one question."""

    def __init__(self, item: QuestionItem, messages: list[dict[str, str]]) -> None:
        self.item = item
        self.messages = messages
        self.nodes: list[Node] = [Node(id=0, parent_id=None, depth=0, stage="reasoning")]
        self.unknown_verdicts = 0

    @property
    def root(self) -> Node:
        return self.nodes[0]

    def add(self, parent: Node, **fields: Any) -> Node:
        node = Node(id=len(self.nodes), parent_id=parent.id, depth=parent.depth + 1, **fields)
        self.nodes.append(node)
        parent.children.append(node.id)
        return node

    def path(self, node: Node) -> list[Node]:
        """Root → node."""
        chain = [node]
        while chain[-1].parent_id is not None:
            chain.append(self.nodes[chain[-1].parent_id])
        return chain[::-1]

    def transcript(self, node: Node) -> str:
        """The completion so far (what the policy continues)."""
        return "".join(item.lead + item.text + item.insertion for item in self.path(node))

    def select(self, c_uct: float, uct: UCTVariant = "paper") -> Node | None:
        """Eq. 5 from the root down to a node that is not expanded (or Terminal); None if the tree is dead."""
        node = self.root
        while not node.dead:
            if node.stage == "terminal" or not node.expanded:
                return node
            live = [self.nodes[index] for index in node.children if not self.nodes[index].dead]
            if not live:
                self.kill(node)
                break
            scores = uct_scores([child.Q for child in live], [child.N for child in live], c_uct, variant=uct)
            node = live[max(range(len(live)), key=scores.__getitem__)]  # first maximum: deterministic
        return None

    def kill(self, node: Node) -> None:
        """Prune a node; an expanded parent whose children are all dead is pruned too."""
        node.dead = True
        while node.parent_id is not None:
            parent = self.nodes[node.parent_id]
            if parent.dead or not all(self.nodes[index].dead for index in parent.children):
                return
            parent.dead = True
            node = parent

    def backpropagate(self, node: Node, value: float) -> None:
        """Eq. 7: ``N += 1`` and the value joins ``Q``'s mean, from ``node`` up to the root."""
        for item in self.path(node):
            item.N += 1
            item.value_sum += value

    def mark_answered(self, node: Node) -> None:
        for item in self.path(node):
            item.answered = True

    def records(self) -> list[dict[str, Any]]:
        """One JSON record per node (:data:`TREE_SCHEMA`); the root line carries the question."""
        rows = []
        for node in self.nodes:
            row = {"schema": TREE_SCHEMA, "question_key": self.item.key, "tree_size": len(self.nodes)}
            if node.id == 0:
                row.update(question_id=self.item.id, dataset=self.item.dataset, question=self.item.text,
                           golden_answers=list(self.item.golden_answers), messages=self.messages,
                           unknown_verdicts=self.unknown_verdicts)
            data = asdict(node)
            data["Q"] = node.Q
            data["pruned"] = not node.answered
            row.update(data)
            rows.append(row)
        return rows


@dataclass
class _Simulation:
    tree: QuestionTree
    node: Node
    transcript: str
    stage: reasonrag.Stage
    depth: int
    searches: int
    answer: str | None = None
    failed: bool = False
    pending_query: str | None = None
    index: int = 0


class MCTSSearch:
    """Batched MCTS over many questions (module docstring). ``judge`` is needed for ``value="judge"``."""

    def __init__(self, generator: Generator, retriever: Retriever, config: MCTSConfig, *,
                 judge: Judge | None = None, progress: bool = True) -> None:
        if config.value == "judge" and config.judge_prompt == "answer_matching" and judge is None:
            raise ValueError("MCTSConfig.value='judge' with judge_prompt='answer_matching' needs a judge")
        self.generator = generator
        self.retriever = retriever
        self.config = config
        self.judge = judge
        self.progress = progress
        self.adapter = reasonrag.ReasonRAGAdapter(few_shot=config.few_shot)
        self._calls = 0
        self._seed_base = config.seed
        self.stats: Counter[str] = Counter()

    # ---------------------------------------------------------------------------------------------- search

    def search(self, questions: Sequence[Question] | Sequence[str], *, batch_index: int = 0) -> list[QuestionTree]:
        """Search one batch of questions together; returns their trees."""
        self._calls = 0
        self._seed_base = self.config.seed + 1_000_003 * batch_index
        trees = [QuestionTree(item, self.adapter.messages(item.text)) for item in as_question_items(questions)]
        prefixes = {id(tree): self.generator.apply_chat_template(tree.messages) for tree in trees}
        self._prefixes = prefixes
        for _ in tqdm(range(self.config.iterations), desc="mcts", unit="iteration", leave=False,
                      disable=not self.progress):
            picks = [(tree, node) for tree in trees
                     if (node := tree.select(self.config.c_uct, self.config.uct)) is not None]
            if not picks:
                break
            for tree, node in picks:
                if node.stage == "terminal":  # a revisit: its value is exact
                    tree.backpropagate(node, float(node.value or 0.0))
            children = self._expand([(tree, node) for tree, node in picks if node.stage != "terminal"])
            for (tree, child), value in zip(children, self._evaluate(children), strict=True):
                if value is not None:
                    child.value = value
                    tree.backpropagate(child, value)
        return trees

    def _seed(self) -> int:
        self._calls += 1
        return self._seed_base + self._calls

    def _generate(self, prompts: Sequence[str], counts: Sequence[int]) -> list[list[Completion]]:
        """``counts[i]`` samples for ``prompts[i]``; identical prompts share one request (distinct samples even on a
        server that seeds every request alike)."""
        groups: dict[str, int] = {}
        for prompt, count in zip(prompts, counts, strict=True):
            groups[prompt] = groups.get(prompt, 0) + count
        unique = list(groups)
        if not unique:
            return []
        params = SamplingParams(max_new_tokens=self.config.max_new_tokens, temperature=self.config.temperature,
                                top_p=self.config.top_p, n=max(groups.values()), stop=reasonrag.STOP_STRINGS,
                                seed=self._seed())
        results = self.generator.generate(unique, params)
        if len(results) != len(unique):
            raise RuntimeError(f"the generator returned {len(results)} results for {len(unique)} prompts")
        pools = {prompt: list(samples) for prompt, samples in zip(unique, results, strict=True)}
        out = []
        for prompt, count in zip(prompts, counts, strict=True):
            out.append(pools[prompt][:count])
            pools[prompt] = pools[prompt][count:]
        return out

    def _lead(self, stage: reasonrag.Stage, searches: int) -> str:
        forced = stage == "reasoning" and searches >= self.config.step_budget
        return reasonrag.forced_answer_prefix() if forced else ""

    def _retrieve(self, queries: Sequence[str]) -> list[tuple[str, list[str]]]:
        """One batched search; per query the escaped insertion text and the retrieved ids."""
        if not queries:
            return []
        hits = self.retriever.search(list(queries), self.config.top_k)
        if len(hits) != len(queries):
            raise RuntimeError(f"the retriever returned {len(hits)} results for {len(queries)} queries")
        out = []
        for query, result in zip(queries, hits, strict=True):
            docs = documents_text(result[: self.config.top_k]) if query else escape_retrieved(EMPTY_QUERY_NOTE)
            out.append((self.adapter.insertion(docs), [hit.id for hit in result[: self.config.top_k]]))
        return out

    def _opening_plan(self, node: Node, missing: int) -> list[tuple[str, int]]:
        """``(policy-text opening, sample count)`` of an expansion: no opening, or with ``action_leads`` the query
        and answer openings in turn (query first) for a free Reasoning-stage node."""
        if not self.config.action_leads or node.stage != "reasoning" or self._lead(node.stage, node.searches):
            return [("", missing)]
        queries = (missing + 1) // 2
        return [(opening, count) for opening, count in ((QUERY_OPENING, queries), (ANSWER_OPENING, missing - queries))
                if count]

    def _expand(self, picks: list[tuple[QuestionTree, Node]]) -> list[tuple[QuestionTree, Node]]:
        leads = [self._lead(node.stage, node.searches) for _, node in picks]
        plans = [self._opening_plan(node, self.config.max_children - len(node.children)) for _, node in picks]
        prompts = [self._prefixes[id(tree)] + tree.transcript(node) + lead + opening
                   for (tree, node), lead, plan in zip(picks, leads, plans, strict=True) for opening, _ in plan]
        flat = self._generate(prompts, [count for plan in plans for _, count in plan])
        samples: list[list[tuple[str, Completion]]] = []
        for plan in plans:
            group = []
            for opening, _ in plan:
                group.extend((opening, completion) for completion in flat.pop(0))
            samples.append(group)
        children: list[tuple[QuestionTree, Node]] = []
        for (tree, node), lead, completions in zip(picks, leads, samples, strict=True):
            node.expansions += 1
            seen = {tree.nodes[index].text.strip() for index in node.children}
            for opening, generated in completions:
                completion = Completion(text=opening + generated.text, token_ids=generated.token_ids,
                                        logprobs=None, finish_reason=generated.finish_reason, stop=generated.stop,
                                        prompt_tokens=generated.prompt_tokens)
                parsed = reasonrag.classify_action(lead + completion.text, node.stage)
                if parsed is None:
                    node.invalid_samples += 1
                    self.stats["invalid_samples"] += 1
                    continue
                if completion.text.strip() in seen:
                    node.duplicate_samples += 1
                    self.stats["duplicate_samples"] += 1
                    continue
                seen.add(completion.text.strip())
                action, content = parsed
                child = tree.add(node, stage=_NEXT_STAGE[action], action=action, lead=lead, text=completion.text,
                                 answer=content if action == "answer" else None,
                                 searches=node.searches + (action == "evidence"))
                if action == "evidence":
                    child.insertion = reasonrag.after_evidence()
                children.append((tree, child))
            node.expanded = (len(node.children) >= self.config.max_children
                             or node.expansions >= self.config.max_expansions)
            if node.expanded and not node.children:
                tree.kill(node)
        queries = [(tree, child) for tree, child in children if child.action == "query"]
        inserted = self._retrieve([reasonrag.last_query(child.text) or "" for _, child in queries])
        for (_, child), (text, ids) in zip(queries, inserted, strict=True):
            child.insertion, child.retrieved_ids = text, ids
        self.stats["nodes"] += len(children)
        return children

    def _terminal_value(self, tree: QuestionTree, answer: str | None, steps: int) -> float:
        return f1_score(answer, tree.item.golden_answers) * self.config.alpha ** steps if answer else 0.0

    def _evaluate(self, children: list[tuple[QuestionTree, Node]]) -> list[float | None]:
        values: list[float | None] = [None] * len(children)
        open_positions = []
        for position, (tree, child) in enumerate(children):
            if child.stage == "terminal":
                values[position] = self._terminal_value(tree, child.answer, child.depth)
                tree.mark_answered(child)
            else:
                open_positions.append(position)
        if not open_positions:
            return values
        if self.config.value == "judge" and self.config.judge_prompt == "process_evaluation":
            scores = self._process_scores([children[position] for position in open_positions])
            for position, score in zip(open_positions, scores, strict=True):
                if score is None:
                    children[position][0].unknown_verdicts += 1
                    self.stats["unknown_verdicts"] += 1
                else:
                    values[position] = score
            return values
        if self.config.value == "judge":
            assert self.judge is not None
            items = [(tree.item.text, list(tree.item.golden_answers), _process_text(tree, child))
                     for tree, child in (children[position] for position in open_positions)]
            for position, verdict in zip(open_positions, self.judge.answer_correct(items), strict=True):
                tree = children[position][0]
                if verdict.value is None:
                    tree.unknown_verdicts += 1
                    self.stats["unknown_verdicts"] += 1
                else:
                    values[position] = 1.0 if verdict.value else 0.0
            return values
        simulations = [_Simulation(tree, child, self._prefixes[id(tree)] + tree.transcript(child), child.stage,
                                   child.depth, child.searches, index=index)
                       for tree, child in (children[position] for position in open_positions)
                       for index in range(self.config.rollouts)]
        self._simulate(simulations)
        for index, position in enumerate(open_positions):
            tree, child = children[position]
            group = simulations[index * self.config.rollouts: (index + 1) * self.config.rollouts]
            child.rollout_values = [f1_score(item.answer, tree.item.golden_answers) if item.answer else 0.0
                                    for item in group]
            child.rollout_steps = [item.depth for item in group]
            if any(item.answer is not None for item in group):
                values[position] = spre_value(child.rollout_values, child.rollout_steps, self.config.alpha)
                tree.mark_answered(child)
            else:  # no simulation reached an answer: the branch is pruned
                self.stats["pruned_no_answer"] += 1
                tree.kill(child)
        return values

    def _process_scores(self, nodes: list[tuple[QuestionTree, Node]]) -> list[float | None]:
        """Eq. 6 with Figure 14: the explorer policy grades each partial process (one batched greedy call)."""
        prompts = [self.generator.apply_chat_template(reasonrag.process_evaluation_messages(
            tree.item.text, list(tree.item.golden_answers), _process_text(tree, node))) for tree, node in nodes]
        params = SamplingParams(max_new_tokens=self.config.eval_max_new_tokens, temperature=0.0, n=1,
                                seed=self._seed())
        results = self.generator.generate(prompts, params)
        if len(results) != len(prompts):
            raise RuntimeError(f"the generator returned {len(results)} results for {len(prompts)} prompts")
        return [reasonrag.parse_process_score(samples[0].text if samples else None) for samples in results]

    def _simulate(self, simulations: list[_Simulation]) -> None:
        """Continue every simulation, one round per turn for all of them together, to an answer (or failure)."""
        while active := [item for item in simulations
                         if item.answer is None and not item.failed and item.depth < self.config.max_rounds]:
            leads = [self._lead(item.stage, item.searches) for item in active]
            openings = [self._simulation_opening(item, lead) for item, lead in zip(active, leads, strict=True)]
            samples = self._generate([item.transcript + lead + opening
                                      for item, lead, opening in zip(active, leads, openings, strict=True)],
                                     [1] * len(active))
            querying = []
            for item, lead, opening, completions in zip(active, leads, openings, samples, strict=True):
                text = opening + completions[0].text
                parsed = reasonrag.classify_action(lead + text, item.stage)
                if parsed is None:
                    item.failed = True
                    continue
                action, content = parsed
                item.transcript += lead + text
                item.depth += 1
                item.stage = _NEXT_STAGE[action]
                if action == "answer":
                    item.answer = content
                elif action == "evidence":
                    item.searches += 1
                    item.transcript += reasonrag.after_evidence()
                else:
                    item.pending_query = content
                    querying.append(item)
            for item, (text, _) in zip(querying, self._retrieve([item.pending_query or "" for item in querying]),
                                       strict=True):
                item.transcript += text
                item.pending_query = None


    def _simulation_opening(self, item: _Simulation, lead: str) -> str:
        """With ``action_leads``, a free Reasoning-stage simulation step opens a query or an answer at random
        (seeded by the search seed, the simulation and its depth)."""
        if not self.config.action_leads or item.stage != "reasoning" or lead:
            return ""
        draw = random.Random(f"{self._seed_base}|{item.tree.item.key}|{item.node.id}|{item.index}|{item.depth}")
        return QUERY_OPENING if draw.random() < 0.5 else ANSWER_OPENING


def _process_text(tree: QuestionTree, node: Node) -> str:
    """The agent's thoughts so far (the actions, without the documents), for the eq. 6 judgment."""
    return " ".join((item.lead + item.text).strip() for item in tree.path(node)[1:])


# ------------------------------------------------------------------------------------- results file / resume


def load_finished_trees(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """The complete trees of a results file, by question key; an incomplete trailing tree (a crash while writing)
    is dropped and the file rewritten without it. A line that is not JSON is an error naming the line."""
    target = Path(path)
    if not target.exists():
        return {}
    trees: dict[str, list[dict[str, Any]]] = {}
    current: list[dict[str, Any]] = []
    broken = False
    with target.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                if not line.endswith("\n"):  # a torn last line
                    broken = True
                    break
                raise ValueError(f"{target}:{number}: not JSON ({error.msg})") from error
            if row.get("schema") != TREE_SCHEMA:
                raise ValueError(f"{target}:{number}: schema {row.get('schema')!r}, expected {TREE_SCHEMA!r}")
            if row["id"] == 0:
                broken = broken or bool(current)
                current = []
            current.append(row)
            if len(current) == row["tree_size"]:
                trees[row["question_key"]] = current
                current = []
    if broken or current:
        _write_lines(target, [row for rows in trees.values() for row in rows], mode="w")
    return trees


def _write_lines(path: Path, rows: Iterable[Mapping[str, Any]], *, mode: str = "a") -> None:
    """Append (or rewrite, atomically) JSON lines and fsync, so a finished tree survives a crash."""
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode == "w":
        temporary = path.with_suffix(path.suffix + ".tmp")
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
        return
    with path.open("a", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def run_mcts(generator: Generator, retriever: Retriever, questions: Sequence[Question], config: MCTSConfig,
             results_path: str | Path, *, judge: Judge | None = None, progress: bool = True,
             on_batch: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """Search every question (batches of ``config.questions_per_batch``) and return all tree records, in question
    order. Finished trees are appended to ``results_path`` batch by batch; questions already there are skipped
    (resume after a crash). Batches are fixed by question order, so a resumed run gives the same trees."""
    path = Path(results_path)
    finished = load_finished_trees(path)
    keys = [question.key for question in questions]
    repeated = sorted(key for key, count in Counter(keys).items() if count > 1)
    if repeated:
        raise ValueError(f"questions repeated in the MCTS input: {repeated}")
    search = MCTSSearch(generator, retriever, config, judge=judge, progress=progress)
    size = config.questions_per_batch
    batches = [list(questions[start:start + size]) for start in range(0, len(questions), size)]
    skipped = 0
    for batch_index, batch in enumerate(tqdm(batches, desc="mcts questions", unit="batch", disable=not progress)):
        todo = [question for question in batch if question.key not in finished]
        skipped += len(batch) - len(todo)
        if not todo:
            continue
        trees = search.search(todo, batch_index=batch_index)
        rows = [row for tree in trees for row in tree.records()]
        _write_lines(path, rows)
        for tree in trees:
            finished[tree.item.key] = tree.records()
        if on_batch is not None:
            on_batch(batch_index)
    logger.info("MCTS: %d questions (%d resumed from %s), stats %s", len(questions), skipped, path,
                dict(search.stats))
    return [row for key in keys for row in finished[key]]


# ------------------------------------------------------------------------------------------ preference pairs


def _group_trees(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    trees: dict[str, list[Mapping[str, Any]]] = {}
    for position, row in enumerate(rows):
        if row.get("schema") != TREE_SCHEMA:
            raise ValueError(f"tree record {position}: schema {row.get('schema')!r}, expected {TREE_SCHEMA!r}")
        trees.setdefault(str(row["question_key"]), []).append(row)
    for key, nodes in trees.items():
        if sorted(int(node["id"]) for node in nodes) != list(range(len(nodes))):
            raise ValueError(f"tree of question {key!r}: node ids are not 0..{len(nodes) - 1}")
    return trees


def preference_pairs(rows: Iterable[Mapping[str, Any]], *,
                     min_gap: float = MIN_REWARD_GAP) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """§2.2.3: every pair of sibling steps under the same state (both visited and not pruned), chosen = higher Q;
    identical responses and pairs with ``|ΔQ| < min_gap`` are dropped. Returns the pairs and drop counts.

    A pair holds the chat ``messages`` (the protocol's prompt) and the ``transcript`` before the step (prior
    steps, inserted documents, a forced-answer prefix): DPO's prompt is ``chat_template(messages) + transcript``.
    """
    pairs: list[dict[str, Any]] = []
    dropped: Counter[str] = Counter()
    for key, nodes in _group_trees(rows).items():
        by_id = {int(node["id"]): node for node in nodes}
        root = by_id[0]

        def transcript(node_id: int, table: Mapping[int, Mapping[str, Any]] = by_id) -> str:
            chain = []
            current: int | None = node_id
            while current is not None:
                chain.append(table[current])
                current = table[current]["parent_id"]
            return "".join(item["lead"] + item["text"] + item["insertion"] for item in reversed(chain))

        for parent in nodes:
            siblings = [by_id[index] for index in parent["children"]
                        if by_id[index]["N"] > 0 and not by_id[index]["pruned"]]
            for first in range(len(siblings)):
                for second in range(first + 1, len(siblings)):
                    a, b = siblings[first], siblings[second]
                    if a["text"].strip() == b["text"].strip():
                        dropped["identical"] += 1
                        continue
                    if abs(a["Q"] - b["Q"]) < min_gap:
                        dropped["small_gap"] += 1
                        continue
                    chosen, rejected = (a, b) if a["Q"] > b["Q"] else (b, a)
                    pairs.append({
                        "schema": PAIR_SCHEMA, "question_key": key, "question": root["question"],
                        "dataset": root.get("dataset", ""),
                        "messages": root["messages"],
                        "transcript": transcript(int(parent["id"])) + chosen["lead"],
                        "chosen": chosen["text"], "rejected": rejected["text"],
                        "chosen_action": chosen["action"], "rejected_action": rejected["action"],
                        "chosen_q": chosen["Q"], "rejected_q": rejected["Q"], "margin": chosen["Q"] - rejected["Q"],
                        "depth": int(parent["depth"]), "parent_id": int(parent["id"]),
                        "chosen_id": int(chosen["id"]), "rejected_id": int(rejected["id"]),
                    })
    return pairs, dict(dropped)


def tree_statistics(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Questions, nodes, kept (not pruned) nodes, mean / max depth of the kept nodes, actions by type, unknowns."""
    trees = _group_trees(rows)
    nodes = [node for tree in trees.values() for node in tree]
    kept = [node for node in nodes if not node["pruned"] and node["id"] != 0]
    actions = Counter(node["action"] for node in kept)
    answered_questions = sum(not tree[0]["pruned"] for tree in trees.values())
    return {
        "questions": len(trees),
        "questions_with_answer": answered_questions,
        "nodes": len(nodes) - len(trees),
        "kept_nodes": len(kept),
        "pruned_nodes": len(nodes) - len(trees) - len(kept),
        "mean_depth": sum(node["depth"] for node in kept) / len(kept) if kept else 0.0,
        "max_depth": max((node["depth"] for node in kept), default=0),
        "nodes_query": actions.get("query", 0),
        "nodes_evidence": actions.get("evidence", 0),
        "nodes_answer": actions.get("answer", 0),
        "invalid_samples": sum(int(node["invalid_samples"]) for node in nodes),
        "duplicate_samples": sum(int(node["duplicate_samples"]) for node in nodes),
        "unknown_verdicts": sum(int(tree[0].get("unknown_verdicts", 0)) for tree in trees.values()),
    }


def pair_statistics(pairs: Sequence[Mapping[str, Any]], questions: int) -> dict[str, float]:
    """Pair counts by action type (chosen-rejected, as Figure 2a: ``A-Q`` = answer chosen over query) and the
    margin distribution (mean and quantiles, histogram over [0, 1] in tenths)."""
    stats: dict[str, float] = {"pairs": len(pairs), "pairs_per_question": len(pairs) / questions if questions else 0.0}
    types = Counter(f"{_ACTION_LETTER[pair['chosen_action']]}-{_ACTION_LETTER[pair['rejected_action']]}"
                    for pair in pairs)
    for name in ("A-A", "A-Q", "Q-A", "Q-Q", "E-E"):
        stats[f"pairs_{name}"] = types.get(name, 0)
    margins = sorted(float(pair["margin"]) for pair in pairs)
    if margins:
        stats["margin_mean"] = sum(margins) / len(margins)
        for quantile in (0.1, 0.5, 0.9):
            stats[f"margin_p{int(quantile * 100)}"] = margins[min(len(margins) - 1, int(quantile * len(margins)))]
        for low in range(10):
            upper = (low + 1) / 10
            stats[f"margin_hist_{low / 10:.1f}_{upper:.1f}"] = sum(
                low / 10 <= margin < upper or (low == 9 and margin == 1.0) for margin in margins)
    return stats
