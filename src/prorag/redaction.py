"""The one redaction of secrets, used by every writer: MLflow params and tags, traces, reports
(``comparison.md`` …) and logs (``info.log`` through :class:`RedactingFilter`, installed by ``conf/logging.yml``).

Hidden: the value of a secret-looking key (:func:`is_secret_key`: ``api_key``, ``hf_token``, ``password`` …; not
``max_new_tokens`` or ``api_key_env``, the *name* of a variable), and inside any text the userinfo of a URL
(``http://user:sk-…@host`` → ``http://***@host``), a secret-looking query parameter (``?api_key=…``) and a bearer
token (``Bearer sk-…``). Imports nothing from prorag, so any module may use it.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Mapping
from typing import Any

REDACTED = "***"

# A key is secret-looking when a word of its last dotted part (words split at "_", "-" and camelCase) is one of
# _SECRET_WORDS, or two adjacent words form one of _SECRET_PAIRS. "token" (singular) is a credential unless a
# word of _TOKEN_NOT_SECRET qualifies it (pad_token_id); "tokens" is a budget (max_new_tokens, context_tokens).
_SECRET_WORDS = frozenset({"token", "secret", "secrets", "password", "passwd", "pwd", "passphrase", "credential",
                           "credentials", "creds", "authorization", "apikey", "bearer", "cookie", "signature"})
_SECRET_PAIRS = frozenset({("api", "key"), ("private", "key"), ("access", "key"), ("secret", "key"),
                           ("client", "secret"), ("session", "key"), ("auth", "header")})
_TOKEN_NOT_SECRET = frozenset({"id", "ids", "budget", "limit", "count", "length", "len", "size", "type",
                               "index", "str", "string", "text"})
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")
_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^\s/@?#]+)@")
_QUERY_PARAMETER = re.compile(r"(?P<lead>[?&;](?P<name>[A-Za-z0-9_.\-]+)=)(?P<value>[^&#\s\"'<>]+)")
_BEARER = re.compile(r"(?P<lead>\bBearer\s+)(?P<value>[A-Za-z0-9._~+/=\-]{8,})", re.IGNORECASE)


def is_secret_key(key: str) -> bool:
    """Whether a (dotted) parameter name looks like it holds a credential: ``judge.api_key``, ``AUTH_TOKEN``,
    ``hf_token``, ``db.password``, ``clientSecret`` are; ``max_new_tokens``, ``context_tokens``,
    ``pad_token_id``, ``api_key_env`` (the *name* of a variable) and ``tokenizer`` are not."""
    words = [word.lower() for word in _WORD_SPLIT.split(str(key).rsplit(".", 1)[-1]) if word]
    if words[-1:] == ["env"]:  # api_key_env names the variable that holds the key, not the key
        return False
    if "token" in words and not _TOKEN_NOT_SECRET.intersection(words):
        return True
    if any(word in _SECRET_WORDS and word != "token" for word in words):
        return True
    return any(pair in _SECRET_PAIRS for pair in itertools.pairwise(words))


def redact_text(text: str) -> str:
    """``text`` with the credentials in it hidden: URL userinfo (``http://user:secret@host`` →
    ``http://***@host``), secret-looking query parameters (``?api_key=…`` → ``?api_key=***``) and bearer tokens."""
    text = _URL_USERINFO.sub(lambda match: f"{match['scheme']}{REDACTED}@", text)
    text = _QUERY_PARAMETER.sub(lambda match: f"{match['lead']}{REDACTED}" if is_secret_key(match["name"])
                                else match[0], text)
    return _BEARER.sub(lambda match: f"{match['lead']}{REDACTED}", text)


def redact_value(value: Any) -> Any:
    """:func:`redact_text` applied to a string, or to every string inside lists, tuples and mappings (the value of
    a secret-looking key of a mapping is hidden whole)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {key: REDACTED if is_secret_key(str(key)) else redact_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(item) for item in value]
    return value


def redact(values: Mapping[str, Any]) -> dict[str, Any]:
    """A mapping with secrets hidden: the value of every secret-looking key (:func:`is_secret_key`), and the
    credentials inside any other value (:func:`redact_text`). Token budgets stay visible."""
    return {key: REDACTED if is_secret_key(key) else redact_value(value) for key, value in values.items()}


class RedactingFilter(logging.Filter):
    """A logging filter that passes every record with :func:`redact_text` applied to its message and traceback.

    :func:`install_log_redaction` attaches it to every handler (the project's ``settings.py`` calls it, so the
    terminal and ``info.log`` of ``kedro run`` get it; both servers' command lines call it too)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: leave it to the handler's own error reporting
            return True
        redacted = redact_text(message)
        if redacted != message and isinstance(record.args, tuple):
            # Redact the arguments one by one first: formatters that read ``record.args`` (uvicorn's access log
            # unpacks client, method, path, version and status) keep working, with ``?api_key=***`` in the path.
            record.args = tuple(redact_text(arg) if isinstance(arg, str) else arg for arg in record.args)
            try:
                message = record.getMessage()
            except Exception:
                message = ""
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        return True


def install_log_redaction(*loggers: logging.Logger) -> int:
    """Attach a :class:`RedactingFilter` to every handler of ``loggers`` (default: the root logger and every logger
    configured so far) that has none yet; returns how many handlers got one. Idempotent."""
    chosen = loggers or (logging.getLogger(), *(item for item in logging.Logger.manager.loggerDict.values()
                                                if isinstance(item, logging.Logger)))
    added = 0
    for logger in chosen:
        for handler in logger.handlers:
            if not any(isinstance(existing, RedactingFilter) for existing in handler.filters):
                handler.addFilter(RedactingFilter())
                added += 1
    return added
