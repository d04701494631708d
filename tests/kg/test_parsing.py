"""The strict reply parser never raises; entity normalization; the grounding check."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prorag.kg.parsing import entity_key, is_grounded, parse_reply, parse_triplet_line, relation_key


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parser_never_raises_on_arbitrary_text(text: str) -> None:
    parsed = parse_reply(text)
    assert parsed.malformed >= 0
    assert all(t.head and t.relation and t.tail for t in parsed.triplets)
    assert not (parsed.unparsable and parsed.triplets)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["A | b | C", "|", "x | | y", "NONE", "(P | q | R)", "- S | t | U", "junk",
                                 " | | ", "a|b|c|d", "\u00a0", "1. V | w | X"]), max_size=8))
def test_parser_counts_every_line(lines: list[str]) -> None:
    parsed = parse_reply("\n".join(lines))
    kept_lines = [line for line in lines if line.strip()]
    if kept_lines == ["NONE"] or not kept_lines:
        assert parsed.triplets == () and parsed.malformed == 0 and not parsed.unparsable
        return
    good = sum(parse_triplet_line(line) is not None for line in kept_lines)
    assert parsed.malformed == len(kept_lines) - good
    assert parsed.unparsable == (good == 0)


def test_parser_examples() -> None:
    parsed = parse_reply("Radio City | started on | 3 July 2001\nRadio City is a station.\n2) (Mumbai | in | India)")
    assert [(t.head, t.relation, t.tail) for t in parsed.triplets] == [
        ("Radio City", "started on", "3 July 2001"), ("Mumbai", "in", "India")]
    assert parsed.malformed == 1 and not parsed.unparsable
    assert parse_reply("NONE").triplets == () and not parse_reply("NONE").unparsable
    assert parse_reply("I cannot find any facts.").unparsable
    assert parse_reply("a | b").unparsable  # two fields is not a triplet
    assert parse_triplet_line("| Centaurium | is a genus of | gentian family |") is not None
    assert parse_triplet_line("a | b | c | d") is None and parse_triplet_line("a | b | | d") is None
    assert parse_reply("x | " + "y" * 200 + " | z").unparsable  # a run-on field is not an entity
    assert parse_reply(None).unparsable  # type: ignore[arg-type]


def test_entity_and_relation_keys() -> None:
    assert entity_key("The Beatles.") == entity_key("the beatles") == "beatles"
    assert entity_key("  Émile   Zola ") == "emile zola"
    assert entity_key('"Paris"') == "paris"
    assert relation_key("  Was BORN in ") == "was born in"


def test_grounding_is_whole_word_case_and_accent_insensitive() -> None:
    chunk = "Émile Zola\nZola was born in Paris, France, in 1840."
    assert is_grounded("emile zola", chunk)
    assert is_grounded("Paris", chunk) and is_grounded("1840", chunk)
    assert not is_grounded("Par", chunk)  # not a whole word
    assert not is_grounded("London", chunk)
    assert not is_grounded("...", chunk)  # nothing left to look for
