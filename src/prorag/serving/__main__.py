"""``python -m prorag.serving --model SPEC [--adapter DIR] [--host 127.0.0.1] [--port 8000] [--dtype bfloat16]``.

Serves a causal LM from the registry (``bundled:…``, a local folder, a hub name) with the OpenAI API
(see :mod:`prorag.serving.app`), with a trained PEFT adapter merged in when ``--adapter`` names one (its base is
then the model the adapter records unless ``--model`` says otherwise). The API key comes from
``$PRORAG_SERVE_API_KEY``, ``--api-key-file`` or ``--api-key`` (which every user of the machine can read in ``ps``:
a warning says so); without one the server is open, so it binds to 127.0.0.1 unless ``--host`` says otherwise.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from prorag.redaction import install_log_redaction
from prorag.serving.app import DEFAULT_HOST
from prorag.serving.guard import add_connection_options, add_request_limit_options

logger = logging.getLogger("prorag.serving")

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def build_parser() -> argparse.ArgumentParser:
    """The command-line options of ``prorag serve``."""
    parser = argparse.ArgumentParser(
        prog="prorag serve",
        description="Serve a causal LM (bundled:…, a local folder, a hub name) with the OpenAI API: /v1/models, "
                    "/v1/completions, /v1/chat/completions (also `python -m prorag.serving`).")
    parser.add_argument("--model", default=None,
                        help="model spec, e.g. bundled:smollm2-135m-instruct (default with --adapter: its base)")
    parser.add_argument("--adapter", default=None,
                        help="a trained PEFT adapter folder, merged into the model (e.g. data/06_models/rl_adapter/"
                             "<version>/rl_adapter)")
    parser.add_argument("--served-model-name", default=None,
                        help="name clients use (default: the spec, or the adapter folder's name)")
    parser.add_argument("--host", default=DEFAULT_HOST, help="interface to bind (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default: %(default)s)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="dtype of the weights (default: %(default)s)")
    parser.add_argument("--mixed-precision", default="no", choices=["no", "bf16"],
                        help="bf16: the linear layers in bf16 under autocast over --dtype's weights, as SFT trains "
                             "(prorag.llm.precision; default: %(default)s)")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=8, help="rows per model.generate call (default: %(default)s)")
    parser.add_argument("--max-batch-size", type=int, default=8,
                        help="prompts gathered into one generate call (default: %(default)s)")
    parser.add_argument("--batch-wait-ms", type=float, default=5.0,
                        help="how long after a request to wait for another one (default: %(default)s)")
    parser.add_argument("--max-tokens-limit", type=int, default=4096,
                        help="largest max_tokens a request may ask (default: %(default)s)")
    parser.add_argument("--default-max-tokens", type=int, default=None, help="default: min(256, limit)")
    parser.add_argument("--max-n", type=int, default=16, help="most completions per request (default: %(default)s)")
    parser.add_argument("--max-request-sequences", type=int, default=256,
                        help="most prompts x n per request (default: %(default)s, vLLM's max_num_seqs)")
    parser.add_argument("--max-share-tokens", type=int, default=None,
                        help="most tokens decoded per sequence in one generate call before other requests get a "
                             "turn, e.g. 64 (default: no bound)")
    parser.add_argument("--max-body-bytes", type=int, default=8 << 20,
                        help="largest request body (default: %(default)s)")
    parser.add_argument("--body-timeout-s", type=float, default=30.0,
                        help="longest wait for the next chunk of a request body (default: %(default)s)")
    add_request_limit_options(parser)
    add_connection_options(parser)
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's choice; 1 is often faster on shared CPUs)")
    parser.add_argument("--api-key", default=None,
                        help="require this bearer token (seen in `ps`: prefer $PRORAG_SERVE_API_KEY, --api-key-file)")
    parser.add_argument("--api-key-file", default=None, help="require the bearer token stored in this file")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                        help="logging level of the server and uvicorn (default: %(default)s)")
    return parser


def server_api_key(args: argparse.Namespace) -> str | None:
    """The bearer token the server requires: ``--api-key-file``'s content, ``--api-key`` (with a warning: any
    user of the machine reads it in ``ps``), else ``$PRORAG_SERVE_API_KEY``; None: an open server."""
    if args.api_key is not None and args.api_key_file is not None:
        raise SystemExit("give --api-key or --api-key-file, not both")
    if args.api_key_file is not None:
        try:
            key = Path(args.api_key_file).read_text(encoding="utf-8").strip()
        except OSError as error:
            raise SystemExit(f"--api-key-file {args.api_key_file}: {error.strerror}") from None
        if not key:
            raise SystemExit(f"--api-key-file {args.api_key_file} is empty")
        return key
    if args.api_key is not None:
        logger.warning("--api-key is visible to every user of this machine in `ps`; prefer $PRORAG_SERVE_API_KEY "
                       "or --api-key-file")
        return args.api_key or None
    return os.environ.get("PRORAG_SERVE_API_KEY") or None


def main(argv: Sequence[str] | None = None) -> int:
    """Load the model and serve it in the foreground until interrupted."""
    import uvicorn

    from prorag.llm.factory import build_generator
    from prorag.serving.app import create_app
    from prorag.serving.guard import allowed_hosts_for, server_config

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.model is None and args.adapter is None:
        parser.error("give --model, --adapter, or both")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_log_redaction()
    api_key = server_api_key(args)
    if args.host not in _LOOPBACK:
        logger.warning("binding %s: the server is reachable from other machines%s", args.host,
                       "" if api_key else " and has no API key")
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    if args.adapter is not None:
        from prorag.llm.registry import adapter_base_model

        model = args.model or adapter_base_model(args.adapter)
        logger.info("loading %s with the adapter %s merged (%s on %s)", model, args.adapter, args.dtype, args.device)
        served_name = args.served_model_name or Path(args.adapter).name
    else:
        model = args.model
        logger.info("loading %s (%s on %s)", model, args.dtype, args.device)
        served_name = args.served_model_name or model
    generator = build_generator(model, adapter=args.adapter, dtype=args.dtype, batch_size=args.batch_size,
                                device=args.device, mixed_precision=args.mixed_precision)
    app = create_app(generator, served_name, args.max_batch_size, args.batch_wait_ms,
                     api_key=api_key, max_tokens_limit=args.max_tokens_limit,
                     default_max_tokens=args.default_max_tokens, max_n=args.max_n,
                     max_request_sequences=args.max_request_sequences,
                     max_share_tokens=args.max_share_tokens, max_body_bytes=args.max_body_bytes,
                     body_timeout_s=args.body_timeout_s, body_deadline_s=args.body_deadline_s,
                     max_json_depth=args.max_json_depth, max_int_digits=args.max_int_digits,
                     keep_alive_timeout_s=args.keep_alive_timeout_s, header_timeout_s=args.header_timeout_s,
                     max_connections=args.max_connections, allowed_hosts=allowed_hosts_for(args.host))
    logger.info("serving %s on http://%s:%d/v1%s", served_name, args.host, args.port,
                " (API key required)" if api_key else "")
    # server_config: the access log redacted (?api_key=***), and the app's connection limits (idle connections and
    # unfinished headers closed, the connection cap).
    uvicorn.Server(server_config(app, host=args.host, port=args.port, log_level=args.log_level)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
