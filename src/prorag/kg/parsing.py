"""Strict parsing of an extraction reply, entity normalization and the grounding check.

The parser never raises: a line that is not ``head | relation | tail`` with three non-empty fields is a
*malformed* triplet (dropped, counted); a non-empty reply that yields no triplet and is not ``NONE`` is
*unparsable* (dropped, counted).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Final

from prorag.data.records import normalize_text
from prorag.kg.prompt import NO_TRIPLETS

MAX_FIELD_CHARS: Final = 120
"""A field longer than this is a run-on sentence, not an entity or relation: the triplet is malformed."""
_LIST_MARKER = re.compile(r"^\s*(?:[-*•]|\d{1,3}[.)])\s+")
_EDGE_PUNCTUATION = "\"'`“”‘’()[]{}<>.,;:!?*"
_LEADING_ARTICLE = re.compile(r"^(?:the|a|an)\s+", re.IGNORECASE)


@dataclass(frozen=True)
class RawTriplet:
    """One parsed triplet, fields as written (whitespace-normalized)."""

    head: str
    relation: str
    tail: str


@dataclass(frozen=True)
class ParsedReply:
    """What one reply yielded: its triplets and the counts of what was dropped."""

    triplets: tuple[RawTriplet, ...] = ()
    malformed: int = 0
    unparsable: bool = False
    lines: tuple[str, ...] = field(default=(), repr=False)


def clean_field(value: str) -> str:
    """Whitespace-normalized, NFC, with surrounding quotes, brackets and end punctuation stripped."""
    return normalize_text(value).strip(_EDGE_PUNCTUATION + " ")


def parse_triplet_line(line: str) -> RawTriplet | None:
    """``head | relation | tail`` (an optional list marker, surrounding parentheses and one outer ``|`` on either
    side are tolerated); else None."""
    text = _LIST_MARKER.sub("", line.strip())
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    text = text.strip().removeprefix("|").removesuffix("|")  # a table-style outer separator, as small models write
    parts = text.split("|")
    if len(parts) != 3:
        return None
    head, relation, tail = (clean_field(part) for part in parts)
    if not head or not relation or not tail or max(len(head), len(relation), len(tail)) > MAX_FIELD_CHARS:
        return None
    return RawTriplet(head, relation, tail)


def parse_reply(text: str) -> ParsedReply:
    """Parse one model reply; never raises (anything unexpected is counted, not thrown)."""
    if not isinstance(text, str):
        return ParsedReply(unparsable=True)
    lines = tuple(line for line in text.replace("\r", "\n").split("\n") if line.strip())
    if not lines or (len(lines) == 1 and clean_field(lines[0]).upper() == NO_TRIPLETS):
        return ParsedReply(lines=lines)
    triplets: list[RawTriplet] = []
    malformed = 0
    for line in lines:
        parsed = parse_triplet_line(line)
        if parsed is None:
            malformed += 1
        else:
            triplets.append(parsed)
    if not triplets:
        return ParsedReply(malformed=malformed, unparsable=True, lines=lines)
    return ParsedReply(tuple(dict.fromkeys(triplets)), malformed, False, lines)


def entity_key(name: str) -> str:
    """The deduplication key of an entity name: NFKC, case-folded, no accents, no leading article, no
    surrounding punctuation, single spaces (``"The Beatles"``, ``"the beatles."`` → ``"beatles"``)."""
    text = unicodedata.normalize("NFKD", clean_field(name))
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).casefold()
    text = _LEADING_ARTICLE.sub("", " ".join(text.split()))
    return text.strip(_EDGE_PUNCTUATION + " ")


def relation_key(relation: str) -> str:
    """A relation's normalized form: case-folded, single spaces."""
    return " ".join(clean_field(relation).casefold().split())


def _searchable(text: str) -> str:
    return " " + " ".join(re.findall(r"\w+", entity_key(text))) + " "


def is_grounded(name: str, chunk_text: str) -> bool:
    """Whether ``name`` occurs in ``chunk_text`` as a whole-word sequence, ignoring case, accents and
    punctuation (the hallucination check: an extracted head or tail should be copied from its chunk)."""
    needle = _searchable(name)
    return needle.strip() != "" and needle in _searchable(chunk_text)
