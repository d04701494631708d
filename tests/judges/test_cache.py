"""JudgeCache across processes: concurrent writers lose nothing, a forked child gets its own connection, and a
writer killed mid-run leaves every committed reply whole and the file usable."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from prorag.judges import cache as cache_module
from prorag.judges.cache import JudgeCache

# cache.py imports only the standard library: a child loads it alone, without the prorag package (fast start).
CHILD_PRELUDE = textwrap.dedent(f"""
    import importlib.util, os, sys, time
    spec = importlib.util.spec_from_file_location("judge_cache", {cache_module.__file__!r})
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cache = module.JudgeCache(sys.argv[1])
""")


def child(script: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", CHILD_PRELUDE + textwrap.dedent(script), *args],
                            stderr=subprocess.PIPE)


def rows(path: Path) -> dict[str, str]:
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        return dict(connection.execute("SELECT key, raw FROM judge_replies").fetchall())


def test_two_processes_writing_at_once_lose_nothing(tmp_path):
    path, start = tmp_path / "judge.db", tmp_path / "go"
    writer = """
        prefix, start = sys.argv[2], sys.argv[3]
        open(f"{start}.{prefix}", "w").close()  # ready
        while not os.path.exists(start):  # both writers begin together
            time.sleep(0.005)
        for index in range(500):
            cache.put(f"{prefix}{index}", f"raw {prefix}{index}", task="t", model="m")
            if index % 50 == 0:
                assert cache.get(f"{prefix}{index}") == f"raw {prefix}{index}"
    """
    processes = [child(writer, str(path), prefix, str(start)) for prefix in ("a", "b")]
    deadline = time.monotonic() + 30
    while not all((tmp_path / f"go.{prefix}").exists() for prefix in "ab"):
        assert time.monotonic() < deadline and all(process.poll() is None for process in processes)
        time.sleep(0.01)
    start.touch()
    for process in processes:
        _, errors = process.communicate(timeout=60)
        assert process.returncode == 0, errors.decode()
    stored = rows(path)
    assert len(stored) == 1000 and all(raw == f"raw {key}" for key, raw in stored.items())
    assert len(JudgeCache(path).get_many(stored)) == 1000
    with sqlite3.connect(path) as connection:  # the two runs of writes did overlap in time
        spans = dict(connection.execute("SELECT substr(key, 1, 1), printf('%f,%f', min(created_at), max(created_at)) "
                                        "FROM judge_replies GROUP BY substr(key, 1, 1)").fetchall())
    (a_first, a_last), (b_first, b_last) = (map(float, spans[prefix].split(",")) for prefix in "ab")
    assert a_first < b_last and b_first < a_last


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_a_forked_child_uses_its_own_connection(tmp_path):
    cache = JudgeCache(tmp_path / "judge.db")
    cache.put("parent", "raw parent")
    pid = os.fork()
    if pid == 0:  # the child: the inherited object re-opens the file before its first statement
        status = 1
        try:
            cache.put("child", "raw child")
            status = 0 if cache.get("parent") == "raw parent" else 2
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    cache.put("parent again", "raw")  # the parent's connection is untouched by the child's
    assert cache.get_many(["parent", "child", "parent again"]) == {
        "parent": "raw parent", "child": "raw child", "parent again": "raw"}


def test_a_writer_killed_mid_run_leaves_every_committed_reply_whole(tmp_path):
    path = tmp_path / "judge.db"
    writer = """
        index = 0
        while True:
            cache.put(f"k{index}", f"raw k{index} " + "x" * 2000, task="t", model="m")
            index += 1
    """
    process = child(writer, str(path))
    reader = JudgeCache(path)
    deadline = time.monotonic() + 30
    while len(reader) < 200:
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=10) == -signal.SIGKILL
    stored = rows(path)
    assert len(stored) >= 200
    assert all(raw == f"raw {key} " + "x" * 2000 for key, raw in stored.items())
    assert sorted(int(key[1:]) for key in stored) == list(range(len(stored)))  # committed in order, no gaps
    reader.put("after", "raw after")  # the file stays writable: no lock left behind
    assert JudgeCache(path).get("after") == "raw after"
    reader.close()
