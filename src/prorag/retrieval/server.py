"""Retrieval HTTP server speaking the Search-R1 / verl search-tool contract.

``POST /retrieve`` with ``{"queries": [...], "topk": k, "return_scores": bool}`` answers
``{"result": [[{"document": {"id", "contents", "title", "text"}, "score": s}, ...], ...]}``; without
``return_scores`` each entry is the bare document object, exactly as Search-R1's server answers.
``topk`` may be omitted (the server default applies). ``GET /health`` reports status and batching counters.

Requests arriving within ``batch_window_ms`` of each other are gathered into one ``retriever.search`` call
(one call per distinct ``topk``), run on a single worker thread. Bad requests get 4xx answers
``{"detail": "<message>"}`` and keep their keep-alive connection: 400 malformed JSON, JSON nested too deeply or a
lone surrogate in a string, 413 body or query list too large, 415 a body that is not ``application/json``, 422
wrong fields. Only loopback ``Host`` names are answered unless the server is bound to another interface
(:mod:`prorag.serving.guard`).

Run: ``python -m prorag.retrieval.server --index-dir data/06_models/retrieval_index/<version>/retrieval_index
--port 8090`` (a version folder of the ``retrieval_index`` dataset; ``kedro run --pipelines=index`` writes one).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from prorag.redaction import install_log_redaction
from prorag.retrieval.base import Hit, Retriever
from prorag.serving.batching import MicroBatcher
from prorag.serving.guard import (
    BODY_DEADLINE_S,
    BODY_TIMEOUT_S,
    HEADER_TIMEOUT_S,
    KEEP_ALIVE_TIMEOUT_S,
    LOOPBACK_HOSTS,
    MAX_INT_DIGITS,
    MAX_JSON_DEPTH,
    BadRequestBody,
    ConnectionLimits,
    add_connection_options,
    add_request_limit_options,
    allowed_hosts_for,
    check_content_type,
    check_request_limits,
    parse_json_body,
    restrict_hosts,
    server_config,
)
from prorag.serving.guard import read_body as read_guarded_body

if TYPE_CHECKING:
    from prorag.retrieval.index import RetrievalIndex

logger = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8090
"""Not 8000-8003: the policy, RL, judge and trained-policy vLLM servers of conf/gpu's placement."""


class RetrieveRequest(BaseModel):
    """The request body; strict types (``"3"`` is no topk, ``1`` no bool); extra keys are ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")

    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


class RequestError(Exception):
    """A client error answered with ``status`` and ``{"detail": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class _Pending:
    queries: list[str]
    k: int
    future: asyncio.Future[list[list[Hit]]]


@dataclass
class BatchStats:
    """Counters of the micro-batcher (reported by ``/health``)."""

    requests: int = 0
    queries: int = 0
    batches: int = 0
    search_calls: int = 0
    largest_batch: int = 0
    search_seconds: float = 0.0
    errors: int = 0
    started_at: float = field(default_factory=time.time)


class SearchBatcher(MicroBatcher[_Pending]):
    """Gathers concurrent requests arriving within ``window_s`` into one search call per distinct k."""

    def __init__(self, retriever: Retriever, *, window_s: float = 0.005, max_batch_queries: int = 512) -> None:
        super().__init__(name="prorag-retrieval-batcher", window_s=window_s, max_size=max_batch_queries)
        self.retriever = retriever
        self.stats = BatchStats()

    async def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Queue one request and wait for its share of a batched search."""
        future: asyncio.Future[list[list[Hit]]] = asyncio.get_running_loop().create_future()
        self.stats.requests += 1
        return await self.enqueue(_Pending(queries, k, future))

    def size(self, item: _Pending) -> int:
        return len(item.queries)

    async def _search(self, queries: list[str], k: int) -> list[list[Hit]]:
        started = time.perf_counter()
        try:
            results = await self.run_blocking(self.retriever.search, queries, k)
        finally:
            self.stats.search_calls += 1
            self.stats.search_seconds += time.perf_counter() - started
        if len(results) != len(queries):
            raise RuntimeError(f"retriever returned {len(results)} result lists for {len(queries)} queries")
        self.stats.queries += len(queries)
        return results

    async def execute(self, batch: list[_Pending]) -> None:
        """One search per distinct k. If a combined search fails, its requests are retried one by one,
        so a request that breaks the retriever fails alone, not the others gathered with it."""
        self.stats.batches += 1
        self.stats.largest_batch = max(self.stats.largest_batch, sum(len(item.queries) for item in batch))
        for k in sorted({item.k for item in batch}):
            group = [item for item in batch if item.k == k and not item.future.done()]
            if not group:
                continue
            try:
                results = await self._search([query for item in group for query in item.queries], k)
            except Exception as error:
                if len(group) == 1:
                    self._fail(group[0], error)
                    continue
                logger.warning("a batched search of %d requests failed; retrying them one by one", len(group))
                for item in group:
                    try:
                        self._succeed(item, await self._search(item.queries, k))
                    except Exception as item_error:
                        self._fail(item, item_error)
                continue
            offset = 0
            for item in group:
                self._succeed(item, results[offset : offset + len(item.queries)])
                offset += len(item.queries)

    @staticmethod
    def _succeed(item: _Pending, results: list[list[Hit]]) -> None:
        if not item.future.done():
            item.future.set_result(results)

    def _fail(self, item: _Pending, error: Exception) -> None:
        self.stats.errors += 1
        logger.error("retrieval failed for a request of %d queries: %s", len(item.queries), error, exc_info=error)
        if not item.future.done():
            item.future.set_exception(error)


def _describe_validation(error: ValidationError) -> str:
    problems = []
    for item in error.errors():
        where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in item["loc"]).lstrip(".")
        problems.append(f"{where or 'body'}: {item['msg']}")
    return "; ".join(problems)


def _document_entry(hit: Hit, with_score: bool) -> dict[str, Any]:
    document = hit.to_document()
    return {"document": document, "score": hit.score} if with_score else document


def create_app(
    retriever: Retriever,
    *,
    max_queries: int = 256,
    max_topk: int = 100,
    default_topk: int = 3,
    max_query_chars: int = 4096,
    max_body_bytes: int = 1 << 20,
    body_timeout_s: float = BODY_TIMEOUT_S,
    body_deadline_s: float = BODY_DEADLINE_S,
    max_json_depth: int = MAX_JSON_DEPTH,
    max_int_digits: int = MAX_INT_DIGITS,
    keep_alive_timeout_s: float = KEEP_ALIVE_TIMEOUT_S,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    max_connections: int | None = None,
    fair_share_queries: int = 32,
    batch_window_ms: float = 5.0,
    max_batch_queries: int = 512,
    info: dict[str, Any] | None = None,
    allowed_hosts: Sequence[str] | None = LOOPBACK_HOSTS,
) -> FastAPI:
    """The FastAPI app serving ``retriever`` (see the module docstring for the contract and limits);
    ``allowed_hosts`` are the ``Host`` names answered (``None``: any, for a server bound to another interface).
    A request of more than ``fair_share_queries`` queries is searched in shares of that size, so that it cannot
    hold a small request behind it for its whole duration; the limits are listed in ``docs/serving.md``. The
    connection limits (``keep_alive_timeout_s``, ``header_timeout_s``, ``max_connections``) are kept in
    ``app.state.connection_limits`` and applied by :func:`prorag.serving.guard.server_config`."""
    if not 1 <= default_topk <= max_topk:
        raise ValueError(f"need 1 <= default_topk <= max_topk, got {default_topk} and {max_topk}")
    if max_queries < 1 or fair_share_queries < 1:
        raise ValueError(f"max_queries and fair_share_queries must be >= 1, got {max_queries}, {fair_share_queries}")
    check_request_limits(max_json_depth=max_json_depth, max_int_digits=max_int_digits, body_timeout_s=body_timeout_s,
                         body_deadline_s=body_deadline_s)
    connection_limits = ConnectionLimits(keep_alive_timeout_s, header_timeout_s, max_connections)
    batcher = SearchBatcher(
        retriever, window_s=batch_window_ms / 1000.0, max_batch_queries=max(max_batch_queries, max_queries)
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await batcher.aclose()

    app = FastAPI(title="prorag retrieval server", lifespan=lifespan)
    restrict_hosts(app, None if allowed_hosts is None else tuple(allowed_hosts))
    app.state.batcher = batcher
    app.state.retriever = retriever
    app.state.connection_limits = connection_limits

    async def read_body(request: Request) -> bytes:
        try:
            check_content_type(request.headers.get("content-type"))
        except BadRequestBody as error:
            raise RequestError(error.status, error.message) from None
        try:
            return await read_guarded_body(request, max_bytes=max_body_bytes, timeout_s=body_timeout_s,
                                           deadline_s=body_deadline_s)
        except BadRequestBody as error:
            raise RequestError(error.status, error.message) from None

    def parse(body: bytes) -> RetrieveRequest:
        try:
            raw = parse_json_body(body, max_depth=max_json_depth, max_int_digits=max_int_digits)
        except BadRequestBody as error:
            raise RequestError(error.status, error.message) from None
        if not isinstance(raw, dict):
            raise RequestError(422, f"body must be a JSON object, got {type(raw).__name__}")
        try:
            request = RetrieveRequest.model_validate(raw)
        except ValidationError as error:
            raise RequestError(422, _describe_validation(error)) from None
        if not request.queries:
            raise RequestError(422, "queries: must be a non-empty list of strings")
        if len(request.queries) > max_queries:
            raise RequestError(
                413, f"queries: {len(request.queries)} queries exceed the limit of {max_queries} per request"
            )
        for position, query in enumerate(request.queries):
            if not query.strip():
                raise RequestError(422, f"queries[{position}]: empty query")
            if len(query) > max_query_chars:
                raise RequestError(
                    422, f"queries[{position}]: {len(query)} characters exceed the limit of {max_query_chars}"
                )
        if request.topk is not None and not 1 <= request.topk <= max_topk:
            raise RequestError(422, f"topk: must be between 1 and {max_topk}, got {request.topk}")
        return request

    @app.exception_handler(RequestError)
    async def request_error(_: Request, error: RequestError) -> JSONResponse:
        return JSONResponse({"detail": error.message}, status_code=error.status)

    @app.post("/retrieve")
    async def retrieve(request: Request) -> JSONResponse:
        body = parse(await read_body(request))
        k = body.topk or default_topk
        results: list[list[Hit]] = []
        try:
            # Fairness: a large request is searched in shares of fair_share_queries, one after the other, so a
            # request arriving meanwhile joins the next share's batch instead of waiting for the whole request.
            for start in range(0, len(body.queries), fair_share_queries):
                results += await batcher.search(body.queries[start:start + fair_share_queries], k)
        except Exception as error:
            return JSONResponse({"detail": f"retrieval failed: {type(error).__name__}: {error}"}, status_code=500)
        return JSONResponse(
            {"result": [[_document_entry(hit, body.return_scores) for hit in hits] for hits in results]}
        )

    @app.get("/health")
    async def health() -> dict[str, Any]:
        stats = batcher.stats
        size = len(retriever) if hasattr(retriever, "__len__") else None  # type: ignore[arg-type]
        return {
            "status": "ok",
            "retriever": type(retriever).__name__,
            "passages": size,
            "default_topk": default_topk,
            "max_topk": max_topk,
            "max_queries": max_queries,
            "batching": {
                "requests": stats.requests,
                "queries": stats.queries,
                "batches": stats.batches,
                "search_calls": stats.search_calls,
                "largest_batch": stats.largest_batch,
                "search_seconds": round(stats.search_seconds, 4),
                "errors": stats.errors,
            },
            **({"info": info} if info else {}),
        }

    return app


class BackgroundServer:
    """Run an app with ``uvicorn.Server`` on a background thread (port 0 = a free port); a context manager. The
    connection limits are the app's (``create_app``'s arguments)."""

    def __init__(
        self,
        app: FastAPI,
        host: str = DEFAULT_HOST,
        port: int = 0,
        *,
        log_level: str = "warning",
        access_log: bool = False,
    ) -> None:
        self.server = uvicorn.Server(
            server_config(app, host=host, port=port, log_level=log_level, access_log=access_log, lifespan="on")
        )
        self.host = host
        self.port = port
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        self._thread = threading.Thread(target=self.server.run, name="prorag-retrieval-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"retrieval server failed to start on {self.host}:{self.port}")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_background_server(
    retriever: Retriever,
    host: str = DEFAULT_HOST,
    port: int = 0,
    *,
    log_level: str = "warning",
    **app_options: Any,
) -> BackgroundServer:
    """Serve ``retriever`` on a background thread; returns the started server (``.url``, ``.stop()``)."""
    app_options.setdefault("allowed_hosts", allowed_hosts_for(host))
    return BackgroundServer(create_app(retriever, **app_options), host, port, log_level=log_level).start()


def serve(
    retriever: Retriever,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    log_level: str = "info",
    **app_options: Any,
) -> None:
    """Serve ``retriever`` in the foreground (blocks); loopback only unless ``host`` says otherwise. The access
    log is redacted (``?api_key=***``); the connection limits are ``app_options`` of :func:`create_app`."""
    if host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning("retrieval server binding %s: reachable from other machines, with no authentication", host)
    app_options.setdefault("allowed_hosts", allowed_hosts_for(host))
    uvicorn.Server(server_config(create_app(retriever, **app_options), host=host, port=port, log_level=log_level)).run()


class ServerExtension(Protocol):
    """Command-line options another package adds to the server, to add retriever kinds to the loaded index
    (the knowledge layer's ``--knowledge-graph``: :class:`prorag.kg.kag.KnowledgeGraphOption`)."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def apply(self, index: RetrievalIndex, args: argparse.Namespace) -> None: ...


def build_parser(extensions: Sequence[ServerExtension] = ()) -> argparse.ArgumentParser:
    """The command-line options of ``python -m prorag.retrieval.server``, plus those of ``extensions`` (imports
    FAISS: call it after :func:`main` has set ``OMP_WAIT_POLICY``)."""
    from prorag.retrieval.index import RETRIEVER_KINDS

    parser = argparse.ArgumentParser(prog="python -m prorag.retrieval.server", description=__doc__.split("\n")[0])
    parser.add_argument("--index-dir", required=True,
                        help="an index folder: data/06_models/retrieval_index/<version>/retrieval_index")
    parser.add_argument("--retriever", choices=RETRIEVER_KINDS, default="dense",
                        help="dense (FAISS), bm25, hybrid, or kag / kag_concat with --knowledge-graph "
                             "(default: %(default)s)")
    parser.add_argument("--host", default=DEFAULT_HOST, help="interface to bind (default: %(default)s)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="TCP port (default: %(default)s)")
    parser.add_argument("--default-topk", type=int, default=3,
                        help="passages per query when a request gives no topk (default: %(default)s)")
    parser.add_argument("--max-topk", type=int, default=100,
                        help="largest topk a request may ask (default: %(default)s)")
    parser.add_argument("--max-queries", type=int, default=256, help="most queries per request (default: %(default)s)")
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20,
                        help="largest request body (default: %(default)s)")
    parser.add_argument("--body-timeout-s", type=float, default=30.0,
                        help="longest wait for the next chunk of a request body (default: %(default)s)")
    add_request_limit_options(parser)
    add_connection_options(parser)
    parser.add_argument("--fair-share-queries", type=int, default=32,
                        help="queries of one request searched at a time (default: %(default)s)")
    parser.add_argument("--batch-window-ms", type=float, default=5.0,
                        help="requests this close together are searched in one batch (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="FAISS OpenMP threads (default: all CPUs)")
    parser.add_argument("--nprobe", type=int, default=None,
                        help="IVF lists probed per query (default: the index's own; a flat index ignores it)")
    parser.add_argument("--use-gpu", action="store_true",
                        help="search the FAISS index on GPUs (--gpus, default all visible; float16, flat sharded)")
    parser.add_argument("--gpus", type=lambda text: [int(item) for item in text.split(",")], default=None,
                        help="comma-separated GPU numbers FAISS may use with --use-gpu, e.g. 0,1")
    parser.add_argument("--no-mmap", action="store_true",
                        help="read the FAISS index and BM25 into RAM instead of memory-mapping them")
    parser.add_argument("--device", default=None, help="embedder device, e.g. cpu or cuda")
    parser.add_argument("--log-level", default="info", help="logging level (default: %(default)s)")
    for extension in extensions:
        extension.add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None, extensions: Sequence[ServerExtension] = ()) -> None:
    """``python -m prorag.retrieval.server --index-dir DIR [--retriever KIND] [--host H] [--port P]``;
    ``extensions`` add options that add retriever kinds (run as a script: the knowledge graph's, see the end of
    this module)."""
    # torch and faiss each bring an OpenMP runtime; spin-waiting threads of the two fight over the cores and
    # made single-query search up to 10x slower on 2 cores (benchmarks/retrieval.py). Must precede their import.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from prorag.retrieval.index import load_index_dir

    args = build_parser(extensions).parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    install_log_redaction()
    index = load_index_dir(
        args.index_dir,
        load_bm25=args.retriever != "dense",
        use_gpu=args.use_gpu,
        gpus=args.gpus,
        mmap=not args.no_mmap,
        nprobe=args.nprobe,
        device=args.device,
        threads=args.threads,
    )
    for extension in extensions:
        extension.apply(index, args)
    retriever = index.retriever(args.retriever)
    serve(
        retriever,
        args.host,
        args.port,
        log_level=args.log_level,
        keep_alive_timeout_s=args.keep_alive_timeout_s,
        header_timeout_s=args.header_timeout_s,
        max_connections=args.max_connections,
        default_topk=args.default_topk,
        max_topk=args.max_topk,
        max_queries=args.max_queries,
        batch_window_ms=args.batch_window_ms,
        max_body_bytes=args.max_body_bytes,
        body_timeout_s=args.body_timeout_s,
        body_deadline_s=args.body_deadline_s,
        max_json_depth=args.max_json_depth,
        max_int_digits=args.max_int_digits,
        fair_share_queries=args.fair_share_queries,
        info={"index_dir": str(args.index_dir), "retriever": args.retriever, **index.meta.to_dict()},
    )


if __name__ == "__main__":
    # The script is an entry point above both retrieval and the knowledge layer: it alone composes the two, so
    # ``--retriever kag --knowledge-graph DIR`` works while the library module imports nothing from prorag.kg.
    from prorag.kg.kag import KnowledgeGraphOption

    main(extensions=[KnowledgeGraphOption()])
