"""HTTP client of the retrieval server; implements the :class:`~prorag.retrieval.base.Retriever` interface."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import httpx

from prorag.retrieval.base import Hit, RetrievalError, check_search_args


class RetrievalServerError(RetrievalError):
    """The server answered with an error status; ``status_code`` and the server's ``detail`` message."""

    def __init__(self, url: str, status_code: int, detail: str) -> None:
        super().__init__(f"retrieval server {url} answered {status_code}: {detail}")
        self.url = url
        self.status_code = status_code
        self.detail = detail


def _parse_document(document: Any, where: str) -> tuple[str, str, str]:
    if not isinstance(document, dict) or not isinstance(document.get("contents"), str):
        raise RetrievalError(f"malformed response: {where} has no string 'contents'")
    identifier = str(document.get("id", ""))
    title, text = document.get("title"), document.get("text")
    if isinstance(title, str) and isinstance(text, str):
        return identifier, title, text
    head, separator, tail = document["contents"].partition("\n")
    return (identifier, head.strip('"'), tail) if separator else (identifier, "", head)


def _decode(content: bytes | bytearray) -> Any:
    return json.loads(bytes(content))


class RetrievalClient:
    """Search a remote index: ``RetrievalClient("http://127.0.0.1:8090").search(["q"], k=3)``.

    Requests carry at most ``max_queries_per_request`` queries (larger lists are split and re-joined);
    ``None`` asks the server's ``/health`` for its ``max_queries`` once (256 if it does not say).
    Connection failures are retried ``retries`` times; a 4xx/5xx raises :class:`RetrievalServerError`
    with the server's message. Thread-safe (one pooled ``httpx.Client``).

    Each request has an overall deadline of ``timeout`` seconds: a reply body still arriving then (a server that
    trickles it a byte at a time) is abandoned at its next chunk and raises
    :class:`~prorag.retrieval.base.RetrievalError`. ``timeout`` is also httpx's per-phase limit (connect, each read),
    so a server silent for ``timeout`` seconds ends the request too. A reply that is not
    JSON (HTML, bytes that are no UTF-8, a huge integer, deep nesting) raises ``RetrievalError`` naming the URL.
    """

    def __init__(
        self,
        base_url: str,
        timeout: float = 30.0,
        *,
        max_queries_per_request: int | None = None,
        retries: int = 2,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if max_queries_per_request is not None and max_queries_per_request < 1:
            raise ValueError(f"max_queries_per_request must be >= 1, got {max_queries_per_request}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0, got {timeout}")
        self.base_url = base_url.rstrip("/")
        self.timeout = float(timeout)
        self.max_queries_per_request = max_queries_per_request
        self._http = httpx.Client(
            base_url=self.base_url,
            timeout=timeout,
            transport=transport or httpx.HTTPTransport(retries=retries),
        )

    def _request(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        url = f"{self.base_url}{path}"
        deadline = time.monotonic() + self.timeout
        try:
            with self._http.stream(method, path, json=payload) as response:
                content = bytearray()
                for chunk in response.iter_bytes():  # the deadline bounds the whole reply, not each read
                    content += chunk
                    self._check_deadline(deadline, url)
                self._check_deadline(deadline, url)
        except httpx.HTTPError as error:
            raise RetrievalError(f"cannot reach retrieval server {url}: {type(error).__name__}: {error}") from error
        if response.status_code >= 400:
            try:
                detail = _decode(content).get("detail", content.decode(errors="replace"))
            except (ValueError, RecursionError, AttributeError):
                detail = content.decode(errors="replace")
            raise RetrievalServerError(url, response.status_code, str(detail))
        try:
            return _decode(content)
        except (ValueError, RecursionError) as error:  # HTML, no UTF-8, a huge integer, deep nesting
            raise RetrievalError(f"malformed response from {url}: not JSON ({type(error).__name__})") from None

    def _check_deadline(self, deadline: float, url: str) -> None:
        if time.monotonic() > deadline:
            raise RetrievalError(f"retrieval server {url} timed out: no complete reply within {self.timeout:g} s")

    def _chunk_size(self) -> int:
        if self.max_queries_per_request is None:
            try:
                limit = self.health().get("max_queries")
            except RetrievalServerError:  # a server without /health (e.g. Search-R1's own)
                limit = None
            self.max_queries_per_request = limit if isinstance(limit, int) and limit > 0 else 256
        return self.max_queries_per_request

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        queries = check_search_args(queries, k)
        results: list[list[Hit]] = []
        if not queries:
            return results
        chunk_size = self._chunk_size()
        for start in range(0, len(queries), chunk_size):
            chunk = queries[start : start + chunk_size]
            body = self._request("POST", "/retrieve", {"queries": chunk, "topk": k, "return_scores": True})
            rows = body.get("result") if isinstance(body, dict) else None
            if not isinstance(rows, list) or len(rows) != len(chunk):
                raise RetrievalError(
                    f"malformed response from {self.base_url}/retrieve: expected 'result' with {len(chunk)} lists"
                )
            for row_number, row in enumerate(rows):
                hits: list[Hit] = []
                for rank, entry in enumerate(row if isinstance(row, list) else [None]):
                    where = f"result[{start + row_number}][{rank}]"
                    if not isinstance(entry, dict):
                        raise RetrievalError(f"malformed response: {where} is not an object")
                    identifier, title, text = _parse_document(entry.get("document"), where)
                    hits.append(Hit(id=identifier, title=title, text=text, score=float(entry.get("score", 0.0))))
                results.append(hits)
        return results

    def health(self) -> dict[str, Any]:
        """The server's ``/health`` report."""
        return self._request("GET", "/health")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RetrievalClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
