"""The kvspec command line: a parser built from a table of commands.

Each command is a module of ``kvspec.commands`` with ``HELP``,
``add_arguments(parser)`` and ``run(args) -> Outcome``; commands never import
this module or one another.  Errors kvspec raises on purpose
(``KvspecError``) are caught here, once: one line on stderr, the exit code of
their outcome.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from kvspec.model.errors import KvspecError
from kvspec.model.outcome import Outcome

__all__ = ["COMMANDS", "build_parser", "main"]

# The commands, in the order --help lists them.
COMMANDS = ("check", "prove", "fuzz", "run", "mutants", "exhaust", "history", "mtp", "hitrate", "replay",
            "report", "recipe")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvspec",
        description="Formal model and differential tests for vLLM's prefix-cache registration boundary.",
        epilog="exit codes: " + "; ".join(f"{o.exit_code} {o.name.lower()}"
                                          for o in sorted(Outcome, key=lambda o: o.exit_code)),
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        module = importlib.import_module(f"kvspec.commands.{name}")
        command = sub.add_parser(name, help=module.HELP, description=module.__doc__)
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def _version() -> str:
    import kvspec

    return f"kvspec {kvspec.__version__}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help is 0, a usage error is 2
        return int(exc.code or 0)
    try:
        outcome = args.run(args)
    except KvspecError as exc:
        print(f"kvspec: error: {exc}", file=sys.stderr)
        return exc.outcome.exit_code
    except KeyboardInterrupt:
        print("kvspec: interrupted (results so far were written)", file=sys.stderr)
        return Outcome.INTERRUPTED.exit_code
    return outcome.exit_code
