"""What kvspec does, as typed functions, one module per use case: ``prove``
(the theorem catalog), ``real_code`` (the symbolic leg), ``fuzz`` (the
differentials on live subjects), ``mutants`` (the kill matrix), ``history``
(one release's row), ``mtp`` (the multi-module MTP question), ``hitrate``
(the hit-rate replay) and ``upstream`` (a vLLM bug report).  Commands parse
arguments and call these; ``check``, the tests and the benchmarks call them
too (never each other's argparse).  Each returns a typed result; how far a
run got is a ``model.outcome.RunStatus``, what it established an ``Outcome``.
"""

from __future__ import annotations

from typing import Callable

__all__ = ["Say", "print_line"]

# Where a use case says what it is doing, a line at a time (the command's stdout by default).
Say = Callable[[str], None]


def print_line(message: str) -> None:
    print(message, flush=True)
