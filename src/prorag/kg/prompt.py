"""The triplet-extraction prompt (TeaRAG §4.1; §4.3.1 step 1 reuses it on golden evidence paragraphs).

TeaRAG extracts (head, relation, tail) triplets from every chunk with Qwen2.5-14B-Instruct "following Zhu et al.
(2025)" but prints no prompt, and its code was not reachable from here. This is therefore a documented few-shot
prompt in the OpenIE style of HippoRAG: an instruction, two worked examples as chat turns, then the passage.

Output format — one triplet per line, the three fields separated by ``" | "``::

    Barack Obama | was born in | Honolulu
    Barack Obama | served as | president of the United States

``NONE`` alone means the passage states no fact. A line format (rather than JSON) is used because small models
(SmolLM2-135M) close lines far more reliably than they balance JSON brackets; the parser
(:mod:`prorag.kg.parsing`) accepts nothing else.
"""

from __future__ import annotations

import hashlib
import json
from typing import Final

from prorag.data.records import Passage

FIELD_SEPARATOR: Final = " | "
NO_TRIPLETS: Final = "NONE"

INSTRUCTION: Final = (
    "You extract knowledge triplets from a passage. Write one fact per line as: head | relation | tail. "
    "The head and the tail are short entity names copied from the passage (people, places, organizations, "
    "works, dates, numbers); the relation is a short verb phrase. Use only facts stated in the passage. "
    "Write nothing else. If the passage states no fact, write NONE."
)

FEW_SHOT: Final[tuple[tuple[str, str], ...]] = (
    (
        "Title: Radio City (Indian radio station)\n"
        "Radio City is India's first private FM radio station and was started on 3 July 2001. "
        "It broadcasts on 91.1 megahertz from Mumbai.",
        "Radio City | is | private FM radio station\n"
        "Radio City | located in | India\n"
        "Radio City | started on | 3 July 2001\n"
        "Radio City | broadcasts on | 91.1 megahertz\n"
        "Radio City | broadcasts from | Mumbai",
    ),
    (
        "Title: Marie Curie\n"
        "Marie Curie was a physicist born in Warsaw. She won the Nobel Prize in Physics in 1903 "
        "with Pierre Curie.",
        "Marie Curie | was | physicist\n"
        "Marie Curie | born in | Warsaw\n"
        "Marie Curie | won | Nobel Prize in Physics\n"
        "Marie Curie | won Nobel Prize in | 1903\n"
        "Marie Curie | shared Nobel Prize with | Pierre Curie",
    ),
)


def passage_block(passage: Passage) -> str:
    """The user turn for one passage: ``Title: …`` then the text."""
    return f"Title: {passage.title}\n{passage.text}" if passage.title else passage.text


def extraction_messages(passage: Passage, *, few_shot: bool = True) -> list[dict[str, str]]:
    """Chat messages asking for the triplets of ``passage`` (system, few-shot turns, the passage)."""
    messages = [{"role": "system", "content": INSTRUCTION}]
    if few_shot:
        for example, answer in FEW_SHOT:
            messages += [{"role": "user", "content": example}, {"role": "assistant", "content": answer}]
    messages.append({"role": "user", "content": passage_block(passage)})
    return messages


def prompt_fingerprint(*, few_shot: bool = True, extra: dict[str, object] | None = None) -> str:
    """A short hash of everything that shapes a reply except the passage: instruction, examples, ``extra``
    (the sampling settings). Part of the extraction cache key, so a prompt change re-extracts."""
    material = {"instruction": INSTRUCTION, "few_shot": FEW_SHOT if few_shot else (), "extra": extra or {}}
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode("utf-8")).hexdigest()[:16]
