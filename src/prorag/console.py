"""The ``prorag`` command (:data:`DESCRIPTION`); ``prorag --version`` is the installed distribution's."""

from __future__ import annotations

import argparse
import logging
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from prorag.llm.registry import BUNDLED_MODELS, prepare_bundled

DESCRIPTION = """the trained agent (ask, export), bundled offline models and an OpenAI-compatible model server.

Pipelines run with Kedro (`kedro run --pipelines=train`, `kedro registry list`); this command covers what is
not a pipeline."""


def package_version() -> str:
    """The installed ``prorag`` distribution's version (``unknown`` when run from a tree that is not installed)."""
    try:
        return version("prorag")
    except PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``prorag`` console script."""
    parser = argparse.ArgumentParser(prog="prorag", description=f"prorag: {DESCRIPTION}",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    commands = parser.add_subparsers(dest="command")
    models = commands.add_parser("models", help="bundled offline models")
    model_commands = models.add_subparsers(dest="action", required=True)
    model_commands.add_parser("list", help="list the bundled models")
    prepare = model_commands.add_parser("prepare", help="build the cached folders of bundled models")
    prepare.add_argument("specs", nargs="*", default=sorted(BUNDLED_MODELS),
                         help=f"bundled specs to prepare (default: all: {', '.join(sorted(BUNDLED_MODELS))})")
    ask = commands.add_parser(
        "ask", help="answer a question with the trained agent: its search loop over the run's index",
        description="Run a trained policy (the newest adapter of --method from a completed run, or --adapter) "
                    "through the method's search loop with the run's retrieval index, printing each step.")
    ask.add_argument("question", help="the question to answer")
    export = commands.add_parser(
        "export", help="write the trained adapter (portable base name) or the merged model to a folder",
        description="Copy the trained adapter with its base model recorded by its hub name (loadable with plain "
                    "PEFT elsewhere), or with --merge save the base model with the adapter merged in (a plain "
                    "transformers folder: AutoModelForCausalLM.from_pretrained(OUT)).")
    export.add_argument("output", type=Path, help="the folder to write (new or empty)")
    export.add_argument("--merge", action="store_true", help="merge the adapter into the base model")
    for command in (ask, export):
        command.add_argument("--adapter", default=None,
                             help="an adapter (or model) folder (default: the newest adapter of --method)")
        command.add_argument("--method", default="hiprag", help="the methods entry (default: %(default)s)")
        command.add_argument("--project", type=Path, default=Path.cwd(), help="the project root (default: .)")
        command.add_argument("--env", default=None, help="Kedro configuration env (default: local)")
        command.add_argument("--verbose", action="store_true", help="print the INFO log lines too")
    # `serve` forwards its options to `python -m prorag.serving` (`prorag serve --help` lists them).
    commands.add_parser("serve", help="serve a model or a trained adapter with an OpenAI-compatible API",
                        add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "serve":
        from prorag.serving.__main__ import main as serve_main

        return serve_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.command in ("ask", "export"):
        return _use_agent(args)
    if args.action == "list":
        for model in BUNDLED_MODELS.values():
            print(f"{model.spec:32} {model.kind:10} {model.description}")
    else:
        for spec in args.specs:
            print(f"{spec}: {prepare_bundled(spec)}")
    return 0


def _use_agent(args: argparse.Namespace) -> int:
    if not args.verbose:  # faiss logs 9 INFO lines on import about which CPU build it loads
        logging.getLogger("faiss").setLevel(logging.WARNING)
    from prorag.errors import user_error_message
    from prorag.use_agent import Project, ask, export, render_rollout

    try:
        needs_project = args.command == "ask" or args.adapter is None
        project = Project(args.project, args.env, quiet=not args.verbose) if needs_project else None
        if args.command == "ask":
            print(render_rollout(*ask(args.question, project=project, method=args.method, adapter=args.adapter)))
        else:
            print(export(args.output, project=project, method=args.method, adapter=args.adapter, merge=args.merge))
    except Exception as error:
        message = user_error_message(error)
        if message is None:
            raise
        print(f"Error: {message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
