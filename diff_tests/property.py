"""The differential property, written once: a batch of cases through a live
subject, each compared with the spec as its reply streams back.

``kvspec fuzz`` (``diff_tests.fuzz``) and the pytest properties that ship
with kvspec (``diff_tests.test_differential``) run this same body.
"""

from __future__ import annotations

from typing import Any

import attrs

from kvspec.model.case import Case
from kvspec.model.known import KnownBug, count_met, known_bugs, recognise_all
from kvspec.model.replies import record_of
from kvspec.oracles.lookup import check_case, exact_lookup_applies
from kvspec.oracles.registration import Discrepancy
from kvspec.model.requests import Stream

__all__ = ["Failure", "Tally", "known_of", "run_batch", "run_recognising"]


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
    # Known vLLM bugs an example met and that were recognised (by name), and
    # the case each was first met at: such an example ends at that case and
    # counts as run; the test says them at its end.
    known_met: dict[str, int] = attrs.Factory(dict)
    known_first: dict[str, str] = attrs.Factory(dict)

    def as_dict(self) -> dict[str, int]:
        """The counters (what ``known_met`` names is said apart)."""
        return attrs.asdict(self, filter=lambda field, value: isinstance(value, int))

    @classmethod
    def summed(cls, tallies) -> "Tally":
        """One tally for several runs (parallel jobs): counters summed, known
        bugs met summed by name, each first met where the earliest run met it."""
        tallies = list(tallies)
        total = cls(**{name: sum(getattr(t, name) for t in tallies) for name in cls().as_dict()})
        for tally in tallies:
            for name, n in tally.known_met.items():
                total.known_met[name] = total.known_met.get(name, 0) + n
                total.known_first.setdefault(name, tally.known_first[name])
        return total

    def shortfall(self, budget: int) -> str | None:
        """Why a property that returned without failing did not exercise the
        subject (fewer examples than its ``budget``, or an example without a
        case), or None: it cannot have passed vacuously."""
        if self.examples < budget or self.cases < self.examples:
            return (f"kvspec: the property ran {self.examples} of {budget} examples ({self.cases} cases): "
                    "it did not exercise the subject")
        return None

    def known_met_text(self) -> str:
        """The known bugs met, in words ("" when none)."""
        return ", ".join(f"{name} in {n} example(s) (first: {self.known_first[name]})"
                         for name, n in sorted(self.known_met.items()))


def known_of(subject, discrepancy: Discrepancy | None = None) -> tuple[KnownBug, ...]:
    """The known vLLM bugs a live subject carries (those ``discrepancy``
    shows, if given): those of the release its vLLM says it is (a tree or a
    mutant: the release its ``_version.py`` names; where its code is newer,
    the subject's scope reduction says so)."""
    version = subject.identity.get("vllm_version")
    if discrepancy is None:
        return tuple(known_bugs(version))
    return tuple(known_bugs(version, discrepancy.category, discrepancy.summary(), discrepancy.group_kinds))


def run_recognising(subject, batch: tuple[Case, ...], tally: Tally, known: tuple[KnownBug, ...]) -> Failure | None:
    """``run_batch``, with a failure that is only known vLLM bugs of
    ``known`` counted in ``tally`` (and not returned): that example ends at
    the case that met it, and the search goes on."""
    failed = run_batch(subject, batch, tally)
    bugs = () if failed is None else recognise_all(known, failed.discrepancies)
    if bugs:
        count_met(tally.known_met, tally.known_first, bugs, failed.case.describe())
        return None
    return failed


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
