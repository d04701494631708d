"""LLMJudge against real loopback HTTP servers: the project's OpenAI-compatible server over a scripted judge
model, and a tiny FastAPI app that is slow or fails on demand."""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from prorag.judges import (
    ANSWER_JUDGE_TEMPLATE,
    OVER_SEARCH_PROMPT,
    UNDER_SEARCH_PROMPT,
    JudgeCache,
    LLMJudge,
    Verdict,
    cache_key,
    parse_boolean_answer,
    parse_yes_no,
)
from prorag.judges.prompts import answer_messages, equivalence_messages, step_messages
from prorag.serving import create_app, serve_in_thread

MODEL = "judge-model"
API_KEY = "test-secret-key"


@pytest.fixture(scope="module")
def judge_model(scripted_judge_model: Any) -> Any:
    """The project's conftest's scripted judge model (shared with the compare pipeline's LLM-judge test)."""
    return scripted_judge_model


@pytest.fixture(scope="module")
def served(judge_model) -> Iterator[tuple[str, FastAPI]]:
    app = create_app(judge_model, MODEL, max_batch_size=32, batch_wait_ms=2, api_key=API_KEY,
                     max_tokens_limit=4096)
    url, stop = serve_in_thread(app)
    yield url, app
    stop()


def misbehaving_app(delay_s: float) -> FastAPI:
    """Answers ``<answer>True</answer>`` — after ``delay_s`` when the material says SLOW (50 ms for PAUSE), with
    a 500 when it says FAIL. Counts requests (retries included) and the most requests in flight at once."""
    app = FastAPI()
    app.state.requests = 0
    app.state.in_flight = 0
    app.state.max_in_flight = 0

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        body = await request.json()
        app.state.requests += 1
        content = body["messages"][-1]["content"]
        app.state.in_flight += 1
        app.state.max_in_flight = max(app.state.max_in_flight, app.state.in_flight)
        try:
            if "PAUSE" in content:
                await asyncio.sleep(0.05)
            if "SLOW" in content:
                deadline = time.monotonic() + delay_s
                while time.monotonic() < deadline and not await request.is_disconnected():
                    await asyncio.sleep(0.02)
        finally:
            app.state.in_flight -= 1
        if "FAIL" in content:
            return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, status_code=500)
        return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "<answer>True</answer>"}}]}

    return app


@pytest.fixture(scope="module")
def misbehaving() -> Iterator[tuple[str, FastAPI]]:
    app = misbehaving_app(delay_s=1.0)
    url, stop = serve_in_thread(app)
    yield url, app
    stop()


def make_judge(url: str, **options: Any) -> LLMJudge:
    options.setdefault("api_key", API_KEY)
    options.setdefault("max_retries", 0)
    options.setdefault("timeout", 10)
    return LLMJudge(url, MODEL, **options)


# ------------------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(("reply", "expected"), [
    ("<answer>True</answer>", True),
    ("<answer>False</answer>", False),
    ("Reasoning first.\n<ANSWER> true </ANSWER>", True),
    ("<answer>\n FALSE\n</answer>", False),
    ("<answer>True</answer> on reflection <answer>False</answer>", False),
    ("<answer>Yes</answer>", None),
    ("<answer>True.</answer>", None),
    ("<answer>True or False</answer>", None),
    ("True", None),
    ("<answer>True", None),
    ("", None),
    (None, None),
])
def test_parse_boolean_answer(reply, expected):
    assert parse_boolean_answer(reply) is expected


@pytest.mark.parametrize(("reply", "expected"), [
    ("YES", True), ("no", False), (" Yes.\n", True), ("**NO**", False), ("Yes, it matches", None),
    ("YES NO", None), ("<answer>YES</answer>", None), ("", None),
])
def test_parse_yes_no(reply, expected):
    assert parse_yes_no(reply) is expected


def test_prompts_are_the_papers_and_present_the_material():
    assert OVER_SEARCH_PROMPT.startswith("You are an expert in Natural Language Understanding and Semantic Analysis.")
    assert "semantically equivalent—that is" in OVER_SEARCH_PROMPT
    assert "This step was generated without using a search tool." in UNDER_SEARCH_PROMPT
    assert "2. **Internal Logic:** Does the <conclusion></conclusion> logically follow" in UNDER_SEARCH_PROMPT
    assert "Only respond with YES or NO." in ANSWER_JUDGE_TEMPLATE
    system, user = equivalence_messages(" Paris is the capital. ", "Paris")
    assert system == {"role": "system", "content": OVER_SEARCH_PROMPT}
    assert user["content"] == "Statement 1: Paris is the capital.\nStatement 2: Paris"
    system, user = step_messages("Q?", "r", "o")
    assert system["content"] == UNDER_SEARCH_PROMPT
    assert user["content"].endswith("<reasoning>r</reasoning>\n<conclusion>o</conclusion>")
    (only,) = answer_messages(["The Beatles", "Beatles"], "the Beatles!")
    assert "Prediction: beatles\nReference Answers: ['beatles', 'beatles']" in only["content"]


def test_cache_key_depends_on_endpoint_model_messages_and_params():
    messages = equivalence_messages("a", "b")
    here = "http://127.0.0.1:8000/v1"
    key = cache_key("m", messages, {"temperature": 0.0}, endpoint=here)
    assert key == cache_key("m", [dict(m) for m in messages], {"temperature": 0.0}, endpoint=here + "/")
    assert len({key, cache_key("m2", messages, {"temperature": 0.0}, endpoint=here),
                cache_key("m", equivalence_messages("a", "c"), {"temperature": 0.0}, endpoint=here),
                cache_key("m", messages, {"temperature": 0.5}, endpoint=here),
                cache_key("m", messages, {"temperature": 0.0}, endpoint="https://api.example.com/v1")}) == 5


def test_cache_is_shared_between_connections_and_threads(tmp_path):
    path = tmp_path / "cache.db"
    first, second = JudgeCache(path), JudgeCache(path)

    def write(start: int) -> None:
        for index in range(start, start + 20):
            first.put(f"k{index}", f"raw {index}", task="t", model="m")

    threads = [threading.Thread(target=write, args=(start,)) for start in (0, 20, 40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(second) == 60
    assert second.get_many(["k5", "k59", "missing"]) == {"k5": "raw 5", "k59": "raw 59"}
    assert "k0" in second and "missing" not in second
    first.close()
    second.close()


# ---------------------------------------------------------------------------------- judging over HTTP


def test_verdicts_over_http_and_unparsable_is_unknown(served, judge_model):
    url, _ = served
    with make_judge(url) as judge:
        verdicts = judge.equivalent([("Paris is the capital", "paris is the capital"),
                                     ("Paris", "Lyon"), ("garble", "Paris")])
        assert [v.value for v in verdicts] == [True, False, None]
        assert "<answer> True </answer>" in verdicts[0].raw and verdicts[0].error is None
        assert verdicts[2].error == "unparsable reply" and verdicts[2].raw.startswith("Hmm")
        steps = judge.verify_steps([("Capital of France?", "France's capital is well known.", "It is Paris."),
                                    ("Capital of France?", "I recall it.", "It is Lyon."),
                                    ("Capital of France?", "garble", "Paris")])
        assert [v.value for v in steps] == [True, False, None]
        answers = judge.answer_correct([("Who?", ["The Beatles", "Beatles"], "the Beatles"),
                                        ("Who?", ("Queen",), "ABBA"), ("Who?", "garble", "garble x")])
        assert [v.value for v in answers] == [True, False, None]
        assert judge.stats.items == 9 and judge.stats.http_calls == 9 and judge.stats.unparsable == 3
    system_prompts = [p for p in judge_model.prompts if p.startswith("<|system|>")]
    assert any(OVER_SEARCH_PROMPT in p for p in system_prompts)
    assert any(UNDER_SEARCH_PROMPT in p for p in system_prompts)


def test_api_key_never_shown_and_never_taken_from_openai_api_key(served, monkeypatch):
    url, _ = served
    judge = LLMJudge(url, MODEL, API_KEY, max_retries=0, timeout=10)
    assert API_KEY not in repr(judge) and API_KEY not in str(vars(judge.stats))
    assert judge.equivalent([("a", "a")])[0].value is True
    judge.close()
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    with LLMJudge(url, MODEL, max_retries=0, timeout=10) as unkeyed:  # no key given: $OPENAI_API_KEY is not sent
        (verdict,) = unkeyed.equivalent([("a", "a")])
    assert verdict.value is None and verdict.error.startswith("HTTP 401")
    with make_judge(url, api_key="wrong-key") as wrong:
        (verdict,) = wrong.equivalent([("a", "a")])
    assert verdict.value is None and verdict.error.startswith("HTTP 401")
    assert "wrong-key" not in verdict.error


def test_second_run_is_served_from_the_cache(served, tmp_path):
    url, app = served
    items = [(f"fact {i}", f"FACT {i}" if i % 2 else f"other {i}") for i in range(6)] + [("garble", "x")]
    items.append(items[0])  # a duplicate within the batch is sent once
    with make_judge(url, cache=JudgeCache(tmp_path / "judge.db")) as judge:
        before = app.state.stats.requests
        first = judge.equivalent(items)
        assert app.state.stats.requests - before == 7
    assert not any(v.cached for v in first)
    with make_judge(url, cache=JudgeCache(tmp_path / "judge.db")) as again:  # a new process would do the same
        before = app.state.stats.requests
        second = again.equivalent(items)
        assert app.state.stats.requests - before == 1  # only the unparsable item
        assert again.stats.http_calls == 1 and again.stats.cache_hits == len(items) - 1
    assert [v.value for v in second] == [v.value for v in first] == [False, True] * 3 + [None, False]
    assert [v.cached for v in second] == [True] * 6 + [False, True]  # the unparsable reply is asked again
    assert second[6].raw == first[6].raw and len(JudgeCache(tmp_path / "judge.db")) == 6
    with make_judge(url, cache=JudgeCache(tmp_path / "judge.db"), temperature=0.5) as other_params:
        before = app.state.stats.requests
        other_params.equivalent(items[:2])
        assert app.state.stats.requests - before == 2  # other sampling parameters: other keys


def test_interrupted_run_resumes_from_its_cache(served, tmp_path):
    url, app = served
    steps = [("Capital?", f"reasoning {i}", "Paris" if i % 3 else "Rome") for i in range(10)]
    with make_judge(url, cache=JudgeCache(tmp_path / "judge.db")) as judge:
        judge.verify_steps(steps[:4])  # the run that was killed after the first part of its batch
    with make_judge(url, cache=JudgeCache(tmp_path / "judge.db")) as judge:
        before = app.state.stats.requests
        verdicts = judge.verify_steps(steps)
        assert app.state.stats.requests - before == 6
    assert [v.cached for v in verdicts] == [True] * 4 + [False] * 6
    assert [v.value for v in verdicts] == [bool(i % 3) for i in range(10)]


def test_timeouts_become_unknown_after_retries_within_bounded_time(misbehaving):
    url, app = misbehaving
    judge = make_judge(url, timeout=0.2, max_retries=1)
    before = app.state.requests
    started = time.monotonic()
    verdicts = judge.equivalent([("SLOW a", "b"), ("SLOW c", "d"), ("SLOW e", "f")])
    elapsed = time.monotonic() - started
    judge.close()
    assert all(v.value is None and v.error.startswith("timeout") for v in verdicts)
    assert app.state.requests - before == 6  # every item tried twice
    assert elapsed < 4.0  # (1 + retries) × timeout + one backoff (≤ 0.5 s), in parallel


def test_concurrency_is_bounded(misbehaving):
    url, app = misbehaving
    app.state.max_in_flight = 0
    with make_judge(url, max_concurrency=2) as judge:
        verdicts = judge.equivalent([(f"PAUSE {i}", "x") for i in range(6)])
    assert all(v.value is True for v in verdicts)
    assert app.state.max_in_flight == 2


def test_errors_are_not_cached_and_are_retried_next_run(misbehaving, served, tmp_path):
    slow_url, _ = misbehaving
    items = [("quick one", "x"), ("FAIL here", "y"), ("SLOW there", "z"), ("quick two", "w")]
    cache = JudgeCache(tmp_path / "judge.db")
    with make_judge(slow_url, cache=cache, timeout=0.3) as judge:
        first = judge.equivalent(items)
    assert [v.value for v in first] == [True, None, None, True]
    assert first[1].error.startswith("HTTP 500") and first[2].error.startswith("timeout")
    assert len(cache) == 2 and judge.stats.errors == 2
    with make_judge(slow_url, cache=cache, timeout=0.3) as judge:  # the next run, same server: only the failures
        second = judge.equivalent([items[0], items[3]])
    assert [v.cached for v in second] == [True, True]
    # Another endpoint is another cache entry, even under the same model name.
    url, app = served
    with make_judge(url, cache=cache) as judge:
        before = app.state.stats.requests
        third = judge.equivalent(items)
        assert app.state.stats.requests - before == 4
    assert not any(v.cached for v in third) and all(v.known for v in third) and len(cache) == 6


def test_sync_methods_work_inside_a_running_event_loop_and_async_variants(served):
    url, _ = served
    judge = make_judge(url, max_concurrency=2)

    async def main() -> tuple[list[Verdict], list[Verdict]]:
        inside = judge.equivalent([("x", "X"), ("x", "y"), ("z", "z")])  # blocks this loop, still works
        awaited = await judge.aanswer_correct([("Q", ["Paris"], "Paris"), ("Q", ["Paris"], "Rome")])
        return inside, awaited

    inside, awaited = asyncio.run(main())
    judge.close()
    assert [v.value for v in inside] == [True, False, True]
    assert [v.value for v in awaited] == [True, False]


def test_invalid_arguments_raise():
    with pytest.raises(ValueError):
        LLMJudge("http://127.0.0.1:1/v1", MODEL, max_concurrency=0)
    judge = LLMJudge("http://127.0.0.1:1/v1", MODEL, max_retries=0, timeout=1)
    with pytest.raises(TypeError):
        judge.equivalent([("only one",)])
    with pytest.raises(TypeError):
        judge.equivalent("not a list")
    assert judge.equivalent([]) == []
    (unreachable,) = judge.equivalent([("a", "b")])
    judge.close()
    assert unreachable.value is None and unreachable.error.startswith("connection error")


class NotAnApiHandler(http.server.BaseHTTPRequestHandler):
    """A web server at the wrong ``base_url`` (or a proxy's login page): 200 with HTML, 200 with JSON that is no
    chat completion, or 200 with the right JSON, chosen by the material."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", 0))).decode().lower()
        if "html" in body:
            reply, kind = b"<!doctype html><html><body>Please sign in</body></html>", "text/html"
        elif "garbage" in body:
            reply, kind = b'{"status": "ok", "choices": "none"}', "application/json"
        else:
            reply = json.dumps({"id": "x", "object": "chat.completion", "created": 0, "model": MODEL,
                                "choices": [{"index": 0, "finish_reason": "stop", "message": {
                                    "role": "assistant", "content": "<answer>True</answer>"}}]}).encode()
            kind = "application/json"
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *_: Any) -> None:
        pass


def test_a_non_json_or_garbage_200_reply_is_an_unknown_verdict_counted_and_logged(tmp_path, caplog):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotAnApiHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    cache = JudgeCache(tmp_path / "judge.db")
    try:
        with caplog.at_level(logging.WARNING, logger="prorag.judges"), make_judge(url, cache=cache) as judge:
            verdicts = judge.equivalent([("HTML a", "b"), ("GARBAGE c", "d"), ("fine", "e")])
            steps = judge.verify_steps([("Q?", "HTML", "o")])
            answers = judge.answer_correct([("Q?", ["x"], "GARBAGE")])
    finally:
        server.shutdown()
    assert [v.value for v in verdicts] == [None, None, True]
    assert verdicts[0].error.startswith("malformed reply") and "Please sign in" in verdicts[0].error
    assert verdicts[1].error.startswith("malformed reply")
    assert steps[0].value is None and answers[0].value is None
    assert judge.stats.errors == 4 and judge.stats.items == 5 and judge.stats.unparsable == 0
    assert len(cache) == 1  # only the reply that parsed
    assert "2 of 3 verdicts unknown (2 failed" in caplog.text and "Please sign in" in caplog.text
