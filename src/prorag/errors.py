"""Errors a user causes and can fix (a mistyped key, a missing input, a bad data file), told apart from bugs.

:class:`UserError` is a marker base: the project's CLI (:mod:`prorag.cli`) prints such an error's message and a
hint instead of a traceback. Kedro-free; Kedro's own "no such pipeline" error is recognized by its message.
"""

from __future__ import annotations

import re

TRACEBACK_ENV = "PRORAG_TRACEBACK"
"""Set to 1 to see the traceback of an expected error (``kedro run --traceback`` does the same)."""

_NO_PIPELINE = re.compile(r"Failed to find the pipeline named '(?P<name>[^']*)'")


class UserError(Exception):
    """An error whose message tells the user what to change; shown without a traceback by ``kedro run``."""


def user_error_message(error: BaseException) -> str | None:
    """The one-line (or one line per problem) message of an expected error, ``None`` for anything else."""
    if isinstance(error, UserError):
        return str(error)
    text = str(error)
    if isinstance(error, ValueError) and (found := _NO_PIPELINE.search(text)):
        # Kedro: "... named 'x'. It needs to be ... Did you mean one of these instead?\n    a\n    b"
        _, _, tail = text.partition("Did you mean one of these instead?")
        matches = [line.strip() for line in tail.splitlines() if line.strip()]
        guess = f"; did you mean {' or '.join(repr(name) for name in matches[:3])}?" if matches else ""
        return (f"unknown pipeline {found['name']!r}{guess} "
                "(`kedro registry list` lists the registered pipelines)")
    return None
