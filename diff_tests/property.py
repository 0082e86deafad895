"""The differential property, written once: a batch of cases through a live
subject, each compared with the spec as its reply streams back.

``kvspec fuzz`` (``diff_tests.fuzz``) and the pytest properties that ship
with kvspec (``diff_tests.test_differential``) run this same body.
"""

from __future__ import annotations

from typing import Any

import attrs

from kvspec.model.case import Case
from kvspec.model.replies import record_of
from kvspec.oracles.lookup import check_case, exact_lookup_applies
from kvspec.oracles.registration import Discrepancy
from kvspec.model.requests import Stream

__all__ = ["Failure", "Tally", "run_batch"]


@attrs.frozen
class Failure:
    case: Case
    discrepancies: tuple[Discrepancy, ...]
    # The subject's raw observations (or its traceback): a reply's record.
    reply: dict[str, Any] = attrs.field(converter=record_of)
    flaky: bool = False

    @property
    def category(self):
        return self.discrepancies[0].category

    def as_dict(self) -> dict[str, Any]:
        return {
            "category": self.category.value,
            "case": self.case.as_dict(),
            "case_text": self.case.describe(),
            "discrepancies": [d.as_dict() for d in self.discrepancies],
            "summary": [d.summary() for d in self.discrepancies],
            "observed": self.reply,
            "flaky": self.flaky,
        }


@attrs.define
class Tally:
    """What a run exercised: Hypothesis examples (one configuration and a
    batch of requests), differential cases (one request on a manager in its
    initial state, compared), cache_blocks calls, later-request lookups."""

    examples: int = 0
    cases: int = 0
    calls: int = 0
    lookups: int = 0
    exact_lookups: int = 0
    nonzero_hits: int = 0
    discrepancies: int = 0
    # Cases under lookahead block hashes (the rest: legacy hashes), and cases
    # drawn from the deployment profiles (the rest: the small scope).
    lookahead_cases: int = 0
    deployment_cases: int = 0

    def as_dict(self) -> dict[str, int]:
        return attrs.asdict(self)


def run_batch(subject, batch: tuple[Case, ...], tally: Tally) -> Failure | None:
    """Run ``batch`` on ``subject`` (a live ``SubjectProcess``) and compare
    every reply; the first failing case is the batch's failure (the rest of
    the stream is drained, uncompared)."""
    caps = subject.capabilities
    tally.examples += 1
    failed = None
    # Replies stream in: case i is compared while the worker drives case i + 1.
    # (Iterate the stream itself, never zip it: it must run to its end marker.)
    for index, reply in enumerate(subject.stream(Stream.of(batch))):
        if failed is not None:
            continue
        case = batch[index]
        tally.cases += 1
        tally.lookahead_cases += case.config.hash_scheme.value == "lookahead"
        tally.deployment_cases += getattr(batch, "scope", "small") == "deployment"
        tally.calls += len(reply.get("calls", ()))
        if "probe" in reply:
            tally.lookups += 1
            tally.exact_lookups += exact_lookup_applies(case)
            tally.nonzero_hits += reply["probe"]["hit"] > 0
        found = check_case(case, caps, reply)
        if found:
            tally.discrepancies += 1
            failed = Failure(case, tuple(found), reply)
    return failed
