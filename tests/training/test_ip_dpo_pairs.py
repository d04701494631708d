from __future__ import annotations

import json

import pytest

from prorag.training.ip_dpo import (
    PairRules,
    ScoredPath,
    build_pairs,
    build_question_pairs,
    candidate_counts,
    is_chosen,
    pair_counts,
    rejection_kind,
)

RULES = PairRules(min_outcome=0.8, min_process=0.5, easy_max_f1=0.0)


def path(key: str, pid: str, *, outcome: float, f1: float | None = None, fmt: float = 1.0, process: float = 0.0,
         single: bool = False) -> ScoredPath:
    return ScoredPath(question_key=key, path_id=pid, completion=pid, outcome=outcome,
                      f1=outcome if f1 is None else f1, format=fmt, process=process, single_hop=single)


# A hand-made multi-hop question: three chosen paths, and rejections of every kind plus a passed-over path.
MULTI = [
    path("m", "best", outcome=1.0, process=0.9),        # chosen, total 2.9
    path("m", "good", outcome=0.9, process=0.7),        # chosen, total 2.6
    path("m", "ok", outcome=0.8, process=0.5),          # chosen, total 2.3
    path("m", "bad_format", outcome=0.0, fmt=0.0),      # format rejection, total 0.0
    path("m", "wrong", outcome=0.0, process=0.6),       # easy rejection, total 1.6
    path("m", "sloppy", outcome=1.0, process=0.2),      # hard rejection (process too low), total 2.2
    path("m", "spare_format", outcome=1.0, fmt=0.0),    # format rejection, total 1.0
]


def test_chosen_set_is_eq14() -> None:
    chosen = [p.path_id for p in MULTI if is_chosen(p, RULES)]
    assert chosen == ["best", "good", "ok"]
    assert rejection_kind(MULTI[3], RULES) == "format"
    assert rejection_kind(MULTI[4], RULES) == "easy"
    assert rejection_kind(MULTI[5], RULES) == "hard"


def test_pairs_cover_all_three_kinds_and_never_reuse_a_rejected_path() -> None:
    pairs = build_question_pairs(MULTI, RULES)
    # ranked ascending by total: bad_format 0.0, spare_format 1.0, wrong 1.6, sloppy 2.2
    assert [(p.chosen.path_id, p.rejected.path_id, p.kind) for p in pairs] == [
        ("best", "bad_format", "format"), ("good", "spare_format", "format"), ("ok", "wrong", "easy")]
    rejected = [p.rejected.path_id for p in pairs]
    assert len(rejected) == len(set(rejected))
    # a fourth chosen path takes the remaining hard rejection
    more = [*MULTI, path("m", "fine", outcome=0.85, process=0.55)]
    pairs = build_question_pairs(more, RULES)
    assert {p.kind for p in pairs} == {"format", "easy", "hard"}
    assert [p.rejected.path_id for p in pairs] == ["bad_format", "spare_format", "wrong", "sloppy"]
    assert pair_counts(pairs) == {"pairs_format": 2, "pairs_easy": 1, "pairs_hard": 1, "pairs_total": 4}


def test_candidate_counts_show_why_a_hard_candidate_went_unpaired() -> None:
    """Three chosen paths take the three rejections ranked below the hard one, which stays a candidate."""
    counts = candidate_counts(MULTI, RULES)
    assert counts == {"chosen_set": 3, "candidates_format": 2, "candidates_easy": 1, "candidates_hard": 1}
    assert pair_counts(build_question_pairs(MULTI, RULES))["pairs_hard"] == 0
    single = [path("s", "right", outcome=1.0, single=True), path("s", "half", outcome=0.5, single=True)]
    assert candidate_counts(single, RULES) == {"chosen_set": 1, "candidates_format": 0, "candidates_easy": 0,
                                               "candidates_hard": 0}   # a half-right single-hop path is no rejection


def test_rejection_must_score_below_its_chosen_path() -> None:
    paths = [path("m", "chosen", outcome=0.8, process=0.5),   # total 2.3
             path("m", "high", outcome=1.0, process=0.45)]   # hard candidate but total 2.45 > 2.3
    assert build_question_pairs(paths, RULES) == []


def test_single_hop_uses_format_and_easy_only() -> None:
    paths = [
        path("s", "one_step", outcome=1.0, single=True),               # chosen (F1 1 / T 1)
        path("s", "one_step_b", outcome=0.9, single=True),             # chosen
        path("s", "two_steps", outcome=0.5, f1=1.0, single=True),      # right but slow: not chosen, no hard kind
        path("s", "wrong", outcome=0.0, single=True),                  # easy
    ]
    pairs = build_question_pairs(paths, RULES)
    assert [(p.chosen.path_id, p.rejected.path_id, p.kind) for p in pairs] == [("one_step", "wrong", "easy")]
    assert rejection_kind(paths[2], RULES) is None


def test_no_chosen_no_pairs_and_questions_are_grouped() -> None:
    assert build_question_pairs([path("m", "x", outcome=0.0, fmt=0.0)], RULES) == []
    pairs = build_pairs([*MULTI, *[ScoredPath(**{**p.__dict__, "question_key": "n"}) for p in MULTI]], RULES)
    assert pair_counts(pairs)["pairs_total"] == 6
    with pytest.raises(ValueError, match="several questions"):
        build_question_pairs([path("a", "1", outcome=1.0), path("b", "2", outcome=1.0)], RULES)


def test_question_mix_and_golden_evidence() -> None:
    from pathlib import Path

    from prorag.data.records import load_questions
    from prorag.rewards.tearag import golden_evidence
    from prorag.training.ip_dpo import QuestionMix, question_group, select_question_mix

    raw = Path(__file__).resolve().parents[2] / "data/01_raw/qa"
    pool = [*load_questions(raw / "nq.jsonl")[:5], *load_questions(raw / "hotpotqa.jsonl")[:40],
            *load_questions(raw / "musique_train.jsonl")]
    mix = QuestionMix(nq=2, hotpotqa_bridge=2, hotpotqa_comparison=1, musique=3)
    chosen = select_question_mix(pool, mix, exclude=[pool[0]])
    groups = [question_group(q, mix) for q in chosen]
    assert groups.count("nq") == 2 and pool[0] not in chosen
    assert groups.count("hotpotqa_bridge") == 2 and groups.count("hotpotqa_comparison") == 1
    # 3 MuSiQue questions spread over 2/3/4 hops (the files hold each)
    assert sorted(g for g in groups if g.startswith("musique")) == ["musique_2hop", "musique_3hop", "musique_4hop"]
    assert golden_evidence(chosen[0]) == []  # NQ: single-hop, no evidence
    hotpot = next(q for q in chosen if q.source == "hotpotqa")
    facts = hotpot.metadata["supporting_facts"]
    assert len(golden_evidence(hotpot)) == len(facts) and golden_evidence(hotpot)[0].startswith(f"{facts[0][0]}: ")
    musique = next(q for q in chosen if q.source == "musique_train")
    assert len(golden_evidence(musique)) == len(musique.supporting_passage_ids)


def test_preference_records_cut_the_engine_prefix() -> None:
    from prorag.protocol.tearag import TeaRAGAdapter
    from prorag.training.ip_dpo import preference_records

    adapter = TeaRAGAdapter(few_shot=False)
    prefix = adapter.initial_prefix()
    written = "A</entities>\n<subquery>q</subquery>"
    context = adapter.insertion("docs")
    chosen = ScoredPath("q", "q#0", prefix + written + context + "s</summary>", 1.0, 1.0, 1.0, 0.9, False,
                        inserted_spans=((0, len(prefix)), (len(prefix + written), len(prefix + written + context))))
    rejected = ScoredPath("q", "q#1", prefix + "B</entities>…", 0.0, 0.0, 0.0, 0.0, False,
                          inserted_spans=((0, len(prefix)),))
    from prorag.training.ip_dpo import PreferencePair

    (record,) = preference_records([PreferencePair("q", chosen, rejected, "format")], adapter.messages,
                                   {"q": "Who?"}, prefix)
    assert record["transcript"] == prefix and record["chosen"] == written + context + "s</summary>"
    (start, end), = record["chosen_inserted"]  # the prefix went to the prompt; the context stays masked
    assert record["chosen"][start:end] == context and record["rejected_inserted"] == []
    assert ScoredPath.from_dict(json.loads(json.dumps(chosen.to_dict()))) == chosen
    assert record["messages"][-1]["content"] == "Question: Who?"
    bad = ScoredPath("q", "q#2", "no prefix", 0.0, 0.0, 0.0, 0.0, False)
    with pytest.raises(ValueError, match="initial prefix"):
        preference_records([PreferencePair("q", chosen, bad, "format")], adapter.messages, {"q": "Who?"}, prefix)
