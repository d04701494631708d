"""The ``prorag`` command (:data:`DESCRIPTION`); ``prorag --version`` is the installed distribution's."""

from __future__ import annotations

import argparse
import logging
import sys
from importlib.metadata import PackageNotFoundError, version

from prorag.llm.registry import BUNDLED_MODELS, prepare_bundled

DESCRIPTION = """bundled offline models and an OpenAI-compatible model server.

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
    commands = parser.add_subparsers(dest="command", required=True)
    models = commands.add_parser("models", help="bundled offline models")
    model_commands = models.add_subparsers(dest="action", required=True)
    model_commands.add_parser("list", help="list the bundled models")
    prepare = model_commands.add_parser("prepare", help="build the cached folders of bundled models")
    prepare.add_argument("specs", nargs="*", default=sorted(BUNDLED_MODELS),
                         help=f"bundled specs to prepare (default: all: {', '.join(sorted(BUNDLED_MODELS))})")
    # `serve` forwards its options to `python -m prorag.serving` (`prorag serve --help` lists them).
    commands.add_parser("serve", help="serve a model with an OpenAI-compatible API", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "serve":
        from prorag.serving.__main__ import main as serve_main

        return serve_main(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    if args.action == "list":
        for model in BUNDLED_MODELS.values():
            print(f"{model.spec:32} {model.kind:10} {model.description}")
    else:
        for spec in args.specs:
            print(f"{spec}: {prepare_bundled(spec)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
