"""How long a small request waits behind heavy ones on a real ``prorag serve`` (issue 47, bug 3).

Starts ``prorag serve`` (a subprocess, loopback, a free port) and runs two scenarios:

- **abandoned**: ``--heavy`` clients each send ``n`` × ``max_tokens`` (default 16 × 1,024) and leave after
  ``--leave-after-s``; then a 2-token request is sent and its wait measured. A server that keeps generating for
  clients that left makes it wait for their whole generate calls.
- **staying**: one heavy client stays for its answer; a 2-token request sent ``--leave-after-s`` later is timed
  (the wait of a small request behind a running long share).

Printed as JSON, with the server's ``/health`` counters (tokens decoded meanwhile, requests ``abandoned``).

    PYTHONPATH=src .venv/bin/python benchmarks/serve_abandon.py --model bundled:smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time

import httpx

SMALL = {"prompt": "Hello", "max_tokens": 2, "temperature": 0.0}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(model: str, port: int, extra: list[str]) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-c", "import sys; from prorag.console import main; sys.exit(main())", "serve",
               "--model", model, "--port", str(port), "--torch-threads", "1", "--log-level", "warning", *extra]
    server = subprocess.Popen(command, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"prorag serve exited with {server.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.5)
    server.kill()
    raise SystemExit("prorag serve did not start within 300 s")


def _leave(url: str, body: dict, after_s: float) -> None:
    try:
        with httpx.Client(timeout=after_s) as client:
            client.post(url, json=body)
    except httpx.TimeoutException:
        pass


def _small(url: str) -> float:
    started = time.perf_counter()
    with httpx.Client(timeout=900) as client:
        reply = client.post(url, json=SMALL)
    reply.raise_for_status()
    return round(time.perf_counter() - started, 2)


def _health(port: int) -> dict:
    return httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["stats"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bundled:smollm2-135m-instruct")
    parser.add_argument("--heavy", type=int, default=1, help="clients that send a heavy request and leave")
    parser.add_argument("--n", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=1024)
    parser.add_argument("--leave-after-s", type=float, default=3.0)
    parser.add_argument("--scenario", choices=["abandoned", "staying", "both"], default="both")
    parser.add_argument("serve_options", nargs="*", help="more options for prorag serve (after --)")
    args = parser.parse_args()
    port = _free_port()
    url = f"http://127.0.0.1:{port}/v1/completions"
    heavy = {"prompt": "Tell me a long story about a dragon.", "n": args.n, "max_tokens": args.max_tokens,
             "temperature": 1.0}
    server = _start(args.model, port, args.serve_options)
    report: dict = {"model": args.model, "heavy": args.heavy, "n": args.n, "max_tokens": args.max_tokens,
                    "serve_options": args.serve_options}
    try:
        report["small_alone_s"] = _small(url)
        if args.scenario in ("abandoned", "both"):
            before = _health(port)["prefix_cache"]["decode_tokens"]
            leavers = [threading.Thread(target=_leave, args=(url, heavy, args.leave_after_s))
                       for _ in range(args.heavy)]
            for thread in leavers:
                thread.start()
            for thread in leavers:
                thread.join()
            report["abandoned_small_wait_s"] = _small(url)
            time.sleep(1.0)
            stats = _health(port)
            report["abandoned_counted"] = stats["abandoned"]
            report["abandoned_generate_seconds"] = stats["generate_seconds"]
            report["abandoned_tokens_decoded"] = stats["prefix_cache"]["decode_tokens"] - before
        if args.scenario in ("staying", "both"):
            stayer = threading.Thread(target=_leave, args=(url, heavy, 900.0))
            started = time.perf_counter()
            stayer.start()
            time.sleep(args.leave_after_s)
            report["staying_small_wait_s"] = _small(url)
            stayer.join()
            report["staying_heavy_s"] = round(time.perf_counter() - started, 2)
    finally:
        server.terminate()
        server.wait(30)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
