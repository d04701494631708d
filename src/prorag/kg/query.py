"""The KAG query string: a subquery with its key entities, as the TeaRAG protocol sends it to the ``kag``
retrievers (:mod:`prorag.kg.kag`). :func:`format_kag_query` / :func:`parse_kag_query` are the one encoding."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Final

KEY_ENTITIES_PREFIX: Final = "\nKey entities: "


def format_kag_query(subquery: str, key_entities: Sequence[str]) -> str:
    """The query string carrying a subquery and its key entities: ``subquery`` then, on a last line,
    ``Key entities: ["e1", "e2"]`` (a JSON list). With no key entities it is the subquery alone."""
    entities = [entity.strip() for entity in key_entities if entity and entity.strip()]
    subquery = subquery.strip()
    return f"{subquery}{KEY_ENTITIES_PREFIX}{json.dumps(entities, ensure_ascii=False)}" if entities else subquery


def parse_kag_query(text: str) -> tuple[str, list[str]]:
    """Inverse of :func:`format_kag_query`: ``(subquery, key_entities)``. A query without a well-formed
    ``Key entities:`` last line is all subquery, with no key entities (never an error)."""
    head, separator, tail = text.rpartition(KEY_ENTITIES_PREFIX)
    if not separator:
        return text.strip(), []
    try:
        entities = json.loads(tail)
    except json.JSONDecodeError:
        return text.strip(), []
    if not isinstance(entities, list) or not all(isinstance(entity, str) for entity in entities):
        return text.strip(), []
    return head.strip(), [entity.strip() for entity in entities if entity.strip()]
