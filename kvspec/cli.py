"""The kvspec command line: a parser built from a table of commands.

Each command is a module of ``kvspec.commands`` with ``HELP``,
``add_arguments(parser)`` and ``run(args) -> Outcome``; commands never import
this module or one another.  Errors kvspec raises on purpose
(``KvspecError``) are caught here, once: one line on stderr, the exit code of
their outcome.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
import tempfile
import threading
import traceback
from typing import Iterator, Sequence

from kvspec.model.errors import KvspecError
from kvspec.model.outcome import Outcome, worst

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


# Ending kvspec from outside is an interrupt, however it is asked for: each
# raises KeyboardInterrupt, which every command turns into partial results,
# status INTERRUPTED and closed workers.
_STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


@contextlib.contextmanager
def _stop_signals_interrupt(received: list[str]) -> Iterator[None]:
    """While a command runs, SIGTERM and SIGHUP (and SIGINT) raise
    KeyboardInterrupt and are recorded in ``received``; the previous handlers
    come back after (kvspec may be called in-process)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    from kvspec.subjects import stop

    def interrupt(signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        received.append(name)
        stop.request_stop(name)  # kept: raised inside a finalizer, the interrupt itself is lost
        raise KeyboardInterrupt

    previous = {}
    for name in _STOP_SIGNALS:
        number = getattr(signal, name, None)
        if number is not None and signal.getsignal(number) is not signal.SIG_IGN:  # nohup stays nohup
            previous[number] = signal.signal(number, interrupt)
    stop.clear()
    try:
        yield
    finally:
        stop.clear()
        for number, handler in previous.items():
            signal.signal(number, handler)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def _crash_log(exc: BaseException) -> str:
    """Write ``exc``'s traceback to a new file in the system's temporary
    directory; its path (or why there is none)."""
    try:
        handle = tempfile.NamedTemporaryFile("w", prefix="kvspec-internal-error-", suffix=".log",
                                             delete=False)
        with handle:
            handle.write(f"kvspec {' '.join(sys.argv[1:])}\n")
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=handle)
        return handle.name
    except (OSError, RecursionError) as again:
        return f"no log file: writing one failed too ({_one_line(again)})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help is 0, a usage error is 2
        return int(exc.code or 0)
    received: list[str] = []
    try:
        with _stop_signals_interrupt(received):
            outcome = args.run(args)
    except KvspecError as exc:
        print(f"kvspec: error: {exc}", file=sys.stderr)
        return exc.outcome.exit_code
    except Exception as exc:  # noqa: BLE001 - anything else is a kvspec bug: a line, a log, its own code
        print(f"kvspec: internal error: {_one_line(exc)} (a kvspec bug, not a finding; the traceback is in "
              f"{_crash_log(exc)})", file=sys.stderr)
        return Outcome.INTERNAL.exit_code
    except KeyboardInterrupt:
        by = f" by {received[0]}" if received else ""
        print(f"kvspec: interrupted{by} (results so far were written)", file=sys.stderr)
        return Outcome.INTERRUPTED.exit_code
    if received:  # the interrupt was raised inside code that swallowed it: the run is still not whole
        print(f"kvspec: interrupted by {received[0]}, but the run went on past it; its results are as "
              "written, the exit code says interrupted", file=sys.stderr)
        return worst([outcome, Outcome.INTERRUPTED]).exit_code
    return outcome.exit_code
