"""Extraction through the Generator interface: counts, grounding, cache keys, kill-and-resume."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from prorag.data.records import Passage
from prorag.kg import ExtractionCache, ExtractionSettings, extract_triplets
from prorag.kg.cache import cache_key


def _chunks(count: int) -> list[Passage]:
    return [Passage(id=f"p{i}", title=f"Town {i}", text=f"Town {i} lies on river R{i} and has {i} bridges.")
            for i in range(count)]


def _reply(prompt: str, passage_of: Callable[[str], str]) -> str:
    passage = passage_of(prompt)
    number = passage.split("Town ", 1)[1].split("\n", 1)[0]
    if number == "3":
        return "I do not know."  # unparsable
    return (f"Town {number} | lies on | river R{number}\n"
            f"Town {number} | twinned with | Atlantis\n"  # tail not in the chunk: ungrounded
            "not a triplet")


def test_counts_grounding_and_source_ids(scripted, tmp_path: Path) -> None:
    generator = scripted(lambda prompt: _reply(prompt, scripted.passage_of))
    settings = ExtractionSettings(model="scripted", batch_size=2, cache_path=str(tmp_path / "cache.jsonl"),
                                  show_progress=False)
    result = extract_triplets(generator, _chunks(5), settings)
    stats = result.stats.to_dict()
    assert stats["chunks"] == 5 and stats["chunks_generated"] == 5 and generator.calls == 3
    assert stats["unparsable_replies"] == 1 and stats["parse_failure_rate"] == pytest.approx(0.2)
    assert stats["malformed_lines"] == 4 + 1  # the stray line of 4 replies + the unparsable reply's line
    assert stats["triplets_parsed"] == 8 and stats["triplets_ungrounded"] == 4
    assert stats["ungrounded_rate"] == pytest.approx(0.5)
    assert [(t.head, t.tail, t.chunk_id) for t in result.triplets][:2] == [("Town 0", "river R0", "p0"),
                                                                          ("Town 1", "river R1", "p1")]
    assert all(t.grounded for t in result.triplets) and stats["triplets_kept"] == 4
    assert stats["completion_tokens"] > 0 and stats["tokens_per_second"] > 0
    unfiltered = extract_triplets(generator, _chunks(5), ExtractionSettings(
        model="scripted", filter_ungrounded=False, cache_path=settings.cache_path, show_progress=False))
    assert len(unfiltered.triplets) == 8 and not all(t.grounded for t in unfiltered.triplets)


def test_rerun_and_added_passage_extract_only_what_is_new(scripted, tmp_path: Path) -> None:
    cache_path = str(tmp_path / "cache.jsonl")
    settings = ExtractionSettings(model="scripted", batch_size=4, cache_path=cache_path, show_progress=False)
    first = scripted(lambda prompt: _reply(prompt, scripted.passage_of))
    extract_triplets(first, _chunks(4), settings)
    again = scripted(lambda prompt: _reply(prompt, scripted.passage_of))
    rerun = extract_triplets(again, _chunks(6), settings)
    assert [scripted.passage_of(p).split("\n")[0] for p in again.prompts] == ["Title: Town 4", "Title: Town 5"]
    assert rerun.stats.chunks_from_cache == 4 and rerun.stats.chunks_generated == 2
    other_model = scripted(lambda prompt: _reply(prompt, scripted.passage_of))
    extract_triplets(other_model, _chunks(2), ExtractionSettings(model="other", cache_path=cache_path,
                                                                 show_progress=False))
    assert len(other_model.prompts) == 2  # the model is part of the key
    edited = [Passage(id="p0", title="Town 0", text="Town 0 was renamed.")]
    assert cache_key("scripted", settings.prompt_id, edited[0]) != cache_key("scripted", settings.prompt_id,
                                                                              _chunks(1)[0])


def test_kill_and_resume_repeats_no_finished_chunk(scripted, tmp_path: Path) -> None:
    cache_path = tmp_path / "cache.jsonl"
    settings = ExtractionSettings(model="scripted", batch_size=3, cache_path=str(cache_path), show_progress=False)
    killed = scripted(lambda prompt: _reply(prompt, scripted.passage_of), fail_after=2)
    with pytest.raises(KeyboardInterrupt):
        extract_triplets(killed, _chunks(10), settings)
    finished = [scripted.passage_of(p) for p in killed.prompts]
    assert len(finished) == 6 and len(cache_path.read_text().splitlines()) == 6  # durable before the kill
    with cache_path.open("a", encoding="utf-8") as handle:  # a kill in the middle of writing a line
        handle.write('{"key": "half a li')
    resumed = scripted(lambda prompt: _reply(prompt, scripted.passage_of))
    result = extract_triplets(resumed, _chunks(10), settings)
    redone = [scripted.passage_of(p) for p in resumed.prompts]
    assert not set(redone) & set(finished) and len(redone) == 4
    assert result.stats.chunks_from_cache == 6 and result.stats.corrupt_cache_lines == 1
    assert {t.chunk_id for t in result.triplets} == {f"p{i}" for i in range(10)} - {"p3"}
    reread = ExtractionCache(cache_path)
    assert len(reread) == 10 and reread.corrupt_lines == 1
    assert all(json.loads(line)["key"] for line in cache_path.read_text().splitlines()[-4:])


_KILLED_RUN = """
import sys, time
from prorag.data.records import Passage
from prorag.kg import ExtractionSettings, extract_triplets
from prorag.llm.generation import Completion

class Slow:
    tokenizer = None
    def apply_chat_template(self, messages):
        return messages[-1]["content"]
    def generate(self, prompts, params):
        time.sleep(0.3)
        return [[Completion("A | b | C", [1], None, "stop", None, 1)] for _ in prompts]

chunks = [Passage(f"p{i}", "", f"text {i}") for i in range(40)]
extract_triplets(Slow(), chunks, ExtractionSettings(model="slow", batch_size=2, cache_path=sys.argv[1],
                                                   show_progress=False))
"""


def test_a_sigkilled_run_resumes_without_repeating_a_finished_chunk(scripted, tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    cache_path = tmp_path / "cache.jsonl"
    process = subprocess.Popen([sys.executable, "-c", _KILLED_RUN, str(cache_path)])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not cache_path.exists() or
                                                len(cache_path.read_bytes().splitlines()) < 6):
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait(timeout=30)
    finished = {json.loads(line)["chunk_id"] for line in cache_path.read_bytes().splitlines()
                if line.strip().endswith(b"}")}
    assert 6 <= len(finished) < 40
    resumed = scripted(lambda prompt: "A | b | C")
    result = extract_triplets(resumed, [Passage(f"p{i}", "", f"text {i}") for i in range(40)],
                              ExtractionSettings(model="slow", batch_size=2, cache_path=str(cache_path),
                                                 show_progress=False))
    redone = {scripted.passage_of(prompt) for prompt in resumed.prompts}
    assert not redone & {f"text {p[1:]}" for p in finished}
    assert result.stats.chunks_from_cache == len(finished) and len(redone) == 40 - len(finished)


def test_the_cache_is_keyed_by_endpoint_so_replies_of_one_server_are_not_reused_for_another(scripted, tmp_path):
    from prorag.kg.params import ExtractionParams, ExtractorSpec

    params = ExtractionParams(cache_path=str(tmp_path / "cache.jsonl"))
    hostile = ExtractorSpec(model="m", backend="openai", base_url="http://127.0.0.1:1/v1", api_key_env="X")
    good = hostile.model_copy(update={"base_url": "http://127.0.0.1:2/v1"})
    first = scripted(lambda prompt: "Town 0 | is ruled by | Mallory")
    extract_triplets(first, _chunks(1), replace(params.settings(hostile), show_progress=False))
    second = scripted(lambda prompt: _reply(prompt, scripted.passage_of))
    result = extract_triplets(second, _chunks(1), replace(params.settings(good), show_progress=False))
    assert second.calls == 1 and result.stats.chunks_from_cache == 0
    assert [t.tail for t in result.triplets] == ["river R0"]
