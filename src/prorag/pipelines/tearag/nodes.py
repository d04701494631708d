"""Nodes of the TeaRAG training pipeline: SFT data → SFT → IP-DPO rounds → TeaRAG rollouts on the dev questions."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prorag.agent import build_runner, record_policy
from prorag.assembly import build_extractor, build_method_reward, build_policy
from prorag.config import ParameterError
from prorag.data import Question, require_train_split, select_questions
from prorag.kg.extraction import extract_triplets
from prorag.kg.graph import KnowledgeGraph
from prorag.kg.kag import attach_knowledge_graph
from prorag.kg.params import KgExtractionParams
from prorag.llm.generation import Generator
from prorag.llm.registry import load_tokenizer
from prorag.pipelines.tearag.params import TeaRAGParams
from prorag.retrieval import RetrievalIndex
from prorag.retrieval.base import Retriever
from prorag.rewards.base import RewardSettings
from prorag.rewards.tearag import KnowledgeMatchingReward
from prorag.specs import MethodSpec, PolicySpec
from prorag.training.ip_dpo import IPDPOSettings, PairRules, QuestionMix, run_ip_dpo, select_question_mix
from prorag.training.launch import IN_PROCESS, LaunchSettings, launch_dpo, launch_sft
from prorag.training.sft import build_sft_example, train_sft_lora
from prorag.training.tearag_sft import (
    SFTDataSettings,
    TeaRAGSFTExample,
    build_tearag_sft_data,
    golden_paragraphs,
    group_triplets,
)


def _questions(records: list[dict[str, Any]]) -> list[Question]:
    return [Question.from_dict(record) for record in records]


def _kag_retriever(index: RetrievalIndex, graph: KnowledgeGraph, kg: KgExtractionParams,
                   params: TeaRAGParams) -> Retriever:
    attach_knowledge_graph(index, graph, kg.kag.settings())
    return index.retriever(params.retriever.kind)


def select_sft_data_questions(question_records: list[dict[str, Any]], eval_records: list[dict[str, Any]],
                              params: TeaRAGParams) -> list[Question]:
    """The §4.3.1 SFT questions: the first ``tearag.sft_data.max_questions`` of its sources, never an evaluated
    question (``evaluated_questions``; by key and by text)."""
    selection = params.sft_data
    candidates = select_questions(_questions(question_records), exclude=_questions(eval_records))
    questions = [q for q in candidates if q.source in selection.sources]
    questions = questions[: selection.max_questions] if selection.max_questions else questions
    if not questions:
        raise ValueError(f"tearag.sft_data.sources {selection.sources} select no indexed training question")
    require_train_split(questions, "tearag.sft_data.sources")
    return questions


def select_ip_dpo_questions(question_records: list[dict[str, Any]], eval_records: list[dict[str, Any]],
                            params: TeaRAGParams) -> list[Question]:
    """The §4.3.2 IP-DPO question mix (``tearag.questions``), never an evaluated question (``evaluated_questions``;
    by key and by text)."""
    mix = params.questions
    questions = select_question_mix(
        _questions(question_records),
        QuestionMix(nq=mix.nq, hotpotqa_bridge=mix.hotpotqa_bridge, hotpotqa_comparison=mix.hotpotqa_comparison,
                    musique=mix.musique, nq_sources=tuple(mix.nq_sources),
                    hotpotqa_sources=tuple(mix.hotpotqa_sources), musique_sources=tuple(mix.musique_sources)),
        exclude=_questions(eval_records))
    if not questions:
        raise ValueError("tearag.questions selects no IP-DPO question among the indexed questions")
    return questions


def build_sft_data(question_records: list[dict[str, Any]], eval_records: list[dict[str, Any]],
                   kg: KgExtractionParams, params: TeaRAGParams) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """§4.3.1: triplets of the golden paragraphs (the kg extractor and its cache), then the SFT paths; the
    evaluated questions (``eval_records``) never among them."""
    selection = params.sft_data
    questions = select_sft_data_questions(question_records, eval_records, params)
    paragraphs = list({p.id: p for q in questions for p in golden_paragraphs(q)}.values())
    spec, extraction = kg.extractor, kg.extraction
    result = extract_triplets(build_extractor(spec), paragraphs, extraction.settings(spec))
    examples, skipped = build_tearag_sft_data(
        questions, group_triplets(result.triplets),
        SFTDataSettings(extra_triplets=selection.extra_triplets, distractors=selection.distractors,
                        single_hop_steps=selection.single_hop_steps, max_supporting=selection.max_supporting),
        seed=selection.seed)
    if not examples:
        raise ValueError(f"no TeaRAG SFT example could be built ({dict(skipped)})")
    paths = [example for example in examples if example.kind == "musique_path"]
    metrics = {"records": len(questions), "examples": len(examples), "paths": len(paths),
               "skipped": sum(skipped.values()), "golden_paragraphs": len(paragraphs),
               "triplets": len(result.triplets),
               "supporting_triplets_per_step": sum(e.supporting_triplets for e in paths)
               / max(1, sum(e.n_steps for e in paths)),
               "steps_without_support": sum(e.steps_without_support for e in paths),
               "mean_steps": sum(e.n_steps for e in paths) / max(1, len(paths)),
               **{f"skipped_{reason.replace(' ', '_')[:60]}": count for reason, count in skipped.items()}}
    return [example.to_dict() for example in examples], metrics


def train_tearag_sft(example_records: list[dict[str, Any]], policy: PolicySpec, params: TeaRAGParams,
                     launch: LaunchSettings = IN_PROCESS) -> tuple[str, list[dict[str, Any]]]:
    """LoRA SFT on the TeaRAG paths (``<Reference>`` masked, eq. 4); the adapter and its loss curve (in this process,
    or under ``accelerate launch``: :mod:`prorag.training.launch`)."""
    tokenizer = load_tokenizer(policy.model)
    examples = [TeaRAGSFTExample.from_dict(record) for record in example_records]
    rows = [build_sft_example(tokenizer, item.question, item.completion, protocol=params.agent.protocol,
                              few_shot=params.agent.few_shot) for item in examples]
    if launch.enabled:
        result = launch_sft(policy.model, rows, params.sft, launch)
        adapter_dir, history = result.adapter, result.log_history
    else:
        adapter_dir, history = train_sft_lora(policy.model, rows,
                                              Path(tempfile.mkdtemp(prefix="prorag-tearag-sft-")), params.sft)
    curve = [{"step": int(entry["step"]), **{key: float(value) for key, value in entry.items()
                                              if key in ("loss", "learning_rate", "grad_norm", "train_loss")}}
             for entry in history if "step" in entry]
    return str(adapter_dir), curve


def ip_dpo_sampler(policy: PolicySpec) -> Callable[[str], Generator]:
    """The IP-DPO sampling policy of a round (its current adapter): ``policy``'s own backend — with ``backend:
    openai`` the policy server, the adapter loaded into it by vLLM's LoRA support — never an in-process copy on
    the CPU beside the GPU the trainer uses."""
    return lambda adapter: build_policy(policy.with_trained(adapter))


def run_ip_dpo_rounds(question_records: list[dict[str, Any]], eval_records: list[dict[str, Any]],
                      index: RetrievalIndex, graph: KnowledgeGraph, sft_adapter: str, kg: KgExtractionParams,
                      policy: PolicySpec, params: TeaRAGParams, reward: RewardSettings,
                      launch: LaunchSettings = IN_PROCESS,
                      ) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """§4.3.2: the rounds; returns the last adapter, per-round metrics (``step`` = round), the pairs and the
    scored samples of every round. The questions are :func:`select_ip_dpo_questions` (never an evaluated one);
    their samples are scored with ``reward``, the method's (:func:`ip_dpo_reward`). Each round's DPO runs in this
    process, or under ``accelerate launch`` (:mod:`prorag.training.launch`)."""
    from prorag.tracking.callbacks import MlflowStepMetrics

    questions = select_ip_dpo_questions(question_records, eval_records, params)
    cfg = params.ip_dpo
    settings = IPDPOSettings(
        rounds=cfg.rounds, samples_per_question=cfg.samples_per_question, top_k=params.retriever.top_k,
        rules=PairRules(min_outcome=cfg.min_outcome, min_process=cfg.min_process, easy_max_f1=cfg.easy_max_f1))
    results = run_ip_dpo(policy.model, sft_adapter, questions, _kag_retriever(index, graph, kg, params),
                         params.agent, cfg.sampling, ip_dpo_reward(reward), settings, cfg.trainer,
                         Path(tempfile.mkdtemp(prefix="prorag-ip-dpo-")), generator_factory=ip_dpo_sampler(policy),
                         callbacks=lambda round_index: [MlflowStepMetrics(f"tearag_dpo_round{round_index}")],
                         train_dpo=_launched_dpo(launch) if launch.enabled else None)
    adapter = next((result.adapter for result in reversed(results) if result.adapter), sft_adapter)
    metrics = [{"step": result.round, **result.metrics} for result in results]
    pairs = [{"round": result.round, **pair} for result in results for pair in result.pairs]
    paths = [{"round": result.round, **path} for result in results for path in result.paths]
    return adapter, metrics, pairs, paths


def ip_dpo_reward(reward: RewardSettings) -> KnowledgeMatchingReward:
    """The reward IP-DPO scores its samples with: the method's ``reward`` entry — the one reward judging and
    ``compare`` score the method's rollouts with — built by the reward registry. Its pairs read the
    knowledge-matching components, so the entry's kind must be ``knowledge_matching`` (or a subclass of its own)."""
    built = build_method_reward(reward)
    if not isinstance(built, KnowledgeMatchingReward):
        raise ParameterError(f"invalid parameters: IP-DPO trains with the TeaRAG method's reward, which must be "
                             f"'knowledge_matching' (methods.<name>.reward.kind), got {reward.kind!r}")
    return built


def _launched_dpo(launch: LaunchSettings) -> Callable[..., tuple[Path, list[dict[str, Any]]]]:
    """An IP-DPO round's DPO under ``accelerate launch`` (rank 0 logs ``tearag_dpo_round<k>.*``)."""

    def train(model: str, rows: list[dict[str, str]], output_dir: Path, config: Any, *, callbacks: Any,
              round_index: int) -> tuple[Path, list[dict[str, Any]]]:
        result = launch_dpo(model, rows, config, launch, metrics_prefix=f"tearag_dpo_round{round_index}",
                            label=f"tearag_dpo_round{round_index}")
        return result.adapter, result.log_history

    return train


def run_tearag_rollouts(eval_records: list[dict[str, Any]], index: RetrievalIndex, graph: KnowledgeGraph,
                        sft_adapter: str, ip_dpo_adapter: str, kg: KgExtractionParams, policy: PolicySpec,
                        params: TeaRAGParams) -> list[dict[str, Any]]:
    """The dev questions rolled out with the TeaRAG protocol and the ``kag`` retriever: the base policy (few-shot
    prompt, if ``evaluate_base``), the SFT policy and the IP-DPO policy (``<agent.name>_base/_sft/_ip_dpo``)."""
    questions = _questions(eval_records)
    retriever = _kag_retriever(index, graph, kg, params)
    agent = params.agent.model_dump()
    stages: list[tuple[str, str | None, bool]] = [("sft", sft_adapter, agent["few_shot"]),
                                                  ("ip_dpo", ip_dpo_adapter, agent["few_shot"])]
    if params.evaluate_base:
        stages.insert(0, ("base", None, True))
    records: list[dict[str, Any]] = []
    for stage, adapter, few_shot in stages:
        method = MethodSpec(kind="agent", **{**agent, "few_shot": few_shot, "name": f"{params.agent.name}_{stage}"})
        stage_policy = policy.model_copy(update={"adapter": adapter})
        generator = build_policy(stage_policy)
        runner = build_runner(method, generator, retriever, top_k=params.retriever.top_k,
                              sampling=params.evaluation_sampling)
        records.extend(rollout.to_dict() for rollout in record_policy(runner(questions), stage_policy))
        del generator, runner
    return records
