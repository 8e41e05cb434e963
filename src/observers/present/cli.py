"""The ``observers`` command line.

Each subcommand lives in its own module that exposes ``register(subparsers)``; the
module list below is the only place that names them.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Sequence

_COMMAND_MODULES = (
    "observers.present.cli_analysis",     # summary, plot, compare, report
    "observers.present.cli_hub",          # push, verify
    "observers.present.cli_distributed",  # ranks
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="observers",
        description="Inspect, compare and publish training telemetry recorded by observers "
                    "(Hugging Face datasets under ./observers/<name> or on the Hub).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `observers summary ... | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
