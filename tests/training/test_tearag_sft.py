from __future__ import annotations

import random
from itertools import groupby

import pytest

from prorag.data.records import load_questions
from prorag.kg.extraction import ExtractedTriplet
from prorag.llm.registry import BUNDLED_TINY_LLAMA, load_tokenizer
from prorag.protocol.tearag import check_format, parse
from prorag.rewards.tearag import consistency_reward
from prorag.training.sft import IGNORE_INDEX, build_sft_example
from prorag.training.tearag_sft import (
    SFTDataSettings,
    build_path,
    build_tearag_sft_data,
    fluent_subquery,
    golden_paragraphs,
    group_triplets,
)


def triplet(head: str, relation: str, tail: str, chunk: str) -> ExtractedTriplet:
    return ExtractedTriplet(head, relation, tail, chunk, True, True)


@pytest.fixture(scope="module")
def musique() -> list:
    from pathlib import Path

    return load_questions(Path(__file__).resolve().parents[2] / "data/01_raw/qa/musique_train.jsonl")


TRIPLETS = group_triplets([
    triplet("Journal of Psychotherapy Integration", "published by", "American Psychological Association",
            "musique_train-6"),
    triplet("Journal of Psychotherapy Integration", "established in", "1991", "musique_train-6"),
    triplet("G. Stanley Hall", "first president of", "American Psychological Association", "musique_train-10"),
    triplet("G. Stanley Hall", "published", "Adolescence", "musique_train-10"),
])


def test_first_record_by_hand(musique) -> None:
    record = musique[0]
    assert [p.id for p in golden_paragraphs(record)] == ["musique_train-6", "musique_train-10"]
    (example,) = build_path(record, TRIPLETS, SFTDataSettings(extra_triplets=1), random.Random(0))
    path = parse(example.completion)
    assert check_format(example.completion) == (1, 2)
    assert path.answer == "G. Stanley Hall"
    first, second = path.steps
    assert first.entities == ("Journal of Psychotherapy Integration",)
    assert first.subquery == "What company published Journal of Psychotherapy Integration?"
    assert "(Journal of Psychotherapy Integration, published by, American Psychological Association)" in first.summary
    assert first.summary.endswith("American Psychological Association.")
    # the second sub-question names #1, resolved to the first sub-answer, which is its anchor
    assert second.subquery == "Who was the first president of American Psychological Association?"
    assert "American Psychological Association" in second.entities
    assert "G. Stanley Hall" not in second.entities  # the answer is never a key entity
    # the simulated context holds the golden paragraph and the evidence triplets (kag's triplet layout)
    assert "Title: Journal of Psychotherapy Integration) The Journal of Psychotherapy Integration" in first.context
    assert "(Title: ) Journal of Psychotherapy Integration published by American Psychological Association" \
        in first.context
    assert first.context.count("Doc ") == 3  # paragraph + supporting triplet + one extra triplet
    assert consistency_reward(path) == 1.0
    assert example.supporting_triplets == 2 and example.steps_without_support == 0


def test_the_whole_training_file_builds(musique) -> None:
    examples, skipped = build_tearag_sft_data(musique, {}, SFTDataSettings(single_hop_steps=True), seed=1)
    paths = [e for e in examples if e.kind == "musique_path"]
    assert len(paths) + sum(skipped.values()) == len(musique)
    assert len(paths) > len(musique) // 2
    assert all(check_format(e.completion)[0] == 1 for e in examples)
    assert all(e.steps_without_support == e.n_steps for e in paths)  # no triplets given: no support
    steps = [e for e in examples if e.kind == "musique_step"]
    assert sum(e.n_steps for e in paths) == len(steps)


def test_fluent_relation_subquery() -> None:
    assert fluent_subquery("Hello Love >> performer") == ("Who is the performer of Hello Love?", "Hello Love")
    assert fluent_subquery("how many publix stores are in North Carolina") == (
        "how many publix stores are in North Carolina?", None)


def test_sft_labels_mask_the_reference(musique) -> None:
    tokenizer = load_tokenizer(BUNDLED_TINY_LLAMA)
    (example,) = build_path(musique[0], TRIPLETS, SFTDataSettings(), random.Random(0))
    row = build_sft_example(tokenizer, example.question, example.completion, protocol="tearag", few_shot=False)
    runs = [(trained, [token for _, token in group])
            for trained, group in groupby(zip(row["labels"], row["input_ids"], strict=True),
                                          key=lambda pair: pair[0] != IGNORE_INDEX)]
    trained_text = "".join(tokenizer.decode(ids) for trained, ids in runs if trained)
    masked_text = "".join(tokenizer.decode(ids) for trained, ids in runs if not trained)
    assert "<Reference>" not in trained_text and "</Reference>" not in trained_text
    assert "peer-reviewed academic journal" not in trained_text and "peer-reviewed academic journal" in masked_text
    assert "Doc 1" not in trained_text
    assert trained_text.count("<subquery>") == 2 and trained_text.count("</summary>") == 2
    assert "What company published Journal of Psychotherapy Integration?" in trained_text
    assert trained_text.endswith("<answer>G. Stanley Hall</answer>" + tokenizer.eos_token)
    assert tokenizer.decode(row["input_ids"]).endswith(example.completion + tokenizer.eos_token)
