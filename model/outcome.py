"""What a run established, as one ordered type; every exit code comes from it.

A command collects the outcome of each thing it did and exits with the most
urgent one (``worst``).  The order is the order of urgency: a finding
outranks everything, because it is true whatever else went wrong; an
interrupt, an internal error or a setup error outranks an incomplete or
unknown result; OK is
only what remains when everything asked for ran and held.
"""

from __future__ import annotations

import enum
from typing import Iterable

__all__ = ["Outcome", "worst", "OK", "FINDING", "USAGE", "UNKNOWN", "INCOMPLETE", "INFRASTRUCTURE",
           "HARDENING", "INTERRUPTED", "INTERNAL", "EXIT_CODES", "RunStatus"]


class Outcome(enum.Enum):
    """(urgency rank, exit code, meaning).  Compare with ``<``: by urgency."""

    # Everything asked for ran, in full, and held.
    OK = (0, 0, "everything asked for ran in full and is as expected")
    # A finding no known deployment reaches, or whose effect is only on
    # speculative acceptance, or a stateful finding on hand-built geometry
    # vLLM's engine did not reproduce: worth fixing, not a regression.
    HARDENING = (1, 6, "hardening: a finding no known deployment reaches, one that only affects "
                       "speculative acceptance, or one on hand-built geometry not reproduced through vLLM's "
                       "engine")
    # A solver or symbolic budget ran out: no conclusion either way.
    UNKNOWN = (2, 3, "unknown: a proof or symbolic budget ran out, no conclusion")
    # The run stopped before covering what was asked; partial results were written.
    INCOMPLETE = (3, 4, "incomplete: the run stopped before covering what was asked; partial results "
                        "were written")
    # The machine, not vLLM: a worker killed from outside or hung, again after a restart.
    INFRASTRUCTURE = (4, 5, "infrastructure error: a worker was killed or hung, again after a restart "
                            "(not a vLLM finding)")
    # Bad command line, bad input file, or a subject that cannot be set up.
    USAGE = (5, 2, "usage, input or setup error")
    # An exception kvspec did not expect (a kvspec bug, EX_SOFTWARE): one line
    # said, the traceback written to a log file the line names.  Above a usage
    # error: nothing the user gave explains it.
    INTERNAL = (6, 70, "internal error: a kvspec bug; the traceback is in the log file named")
    # Interrupted (Ctrl-C, SIGTERM or SIGHUP); partial results were written.
    INTERRUPTED = (7, 130, "interrupted; partial results were written")
    # A discrepancy against the spec, or a theorem not as expected.
    FINDING = (8, 1, "finding: a discrepancy with the spec, or a theorem not as expected")

    def __init__(self, rank: int, exit_code: int, meaning: str):
        self.rank = rank
        self.exit_code = exit_code
        self.meaning = meaning

    def __lt__(self, other: "Outcome") -> bool:
        if not isinstance(other, Outcome):
            return NotImplemented
        return self.rank < other.rank


class RunStatus(enum.Enum):
    """A run's state in a word or two, first in every report of it and the
    ``status`` of every result file (the value is the JSON string).  What a
    run established is its ``Outcome``; this says only how far it got."""

    # Everything planned ran, in full.
    COMPLETE = "COMPLETE"
    # Everything planned ran, but a subject's tree lacks part of the release it claims to be.
    REDUCED_SCOPE = "REDUCED SCOPE"
    # An error stopped the run before it covered everything; partial results were written.
    INCOMPLETE = "INCOMPLETE"
    # An interrupt stopped it; partial results were written.
    INTERRUPTED = "INTERRUPTED"

    def __str__(self) -> str:
        return self.value


def worst(outcomes: Iterable[Outcome]) -> Outcome:
    """The most urgent of ``outcomes`` (OK when there are none)."""
    return max(outcomes, default=Outcome.OK)


OK, FINDING, USAGE, UNKNOWN = Outcome.OK, Outcome.FINDING, Outcome.USAGE, Outcome.UNKNOWN
INCOMPLETE, INFRASTRUCTURE, HARDENING, INTERRUPTED, INTERNAL = (
    Outcome.INCOMPLETE, Outcome.INFRASTRUCTURE, Outcome.HARDENING, Outcome.INTERRUPTED, Outcome.INTERNAL)
# The one table of exit codes, by code (the manual's exit-code reference is
# generated from ``Outcome``: docs/generate.py).
EXIT_CODES = {o.exit_code: o for o in sorted(Outcome, key=lambda o: o.exit_code)}
