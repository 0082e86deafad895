"""``kvspec history``'s use case: one release's row."""

from __future__ import annotations

from typing import Any

import attrs

from kvspec.model.errors import KvspecError
from kvspec.model.outcome import Outcome, worst

__all__ = ["HistoryRow", "history_row"]


def _fuzz_fields(result) -> dict[str, Any]:
    """What a row keeps of one fuzz run (the registration run's at the row's
    top level, the lookup run's under ``lookup``)."""
    return {"cases": result.cases, "examples": result.examples, "seconds": round(result.seconds, 2),
            "failure": None if result.failure is None else result.failure.as_dict(),
            # A run that stopped early is never "no discrepancy" (exit 4 or 5 for the command).
            "outcome": result.outcome.name, "stopped": result.stopped_why or None}


def _row_status(runs) -> str:
    """One word for runs: a finding first, then a run that did not finish,
    and "no discrepancy" only when every run ran in full."""
    if any(r.failure is not None for r in runs):
        return "discrepancy"
    if any(r.outcome is not Outcome.OK for r in runs):
        return "incomplete"
    return "no discrepancy"


@attrs.frozen
class HistoryRow:
    """One release's row: its four differentials' results (``diff_tests``'
    typed results) and capabilities, the symbolic verdict with
    ``--symbolic``; or why it was not run (``not_run``: "unsupported" or
    "error", with ``detail``).  ``as_dict`` is the row of ``kvspec.history/1``."""

    version: str
    registration: Any = None  # diff_tests.fuzz.FuzzResult
    lookup: Any = None  # diff_tests.fuzz.FuzzResult (the hit-length differential)
    stateful: Any = None  # diff_tests.stateful.StatefulResult
    engine: Any = None  # diff_tests.engine's result
    capabilities: Any = None  # subjects' Capabilities
    symbolic: Any = None  # subjects.symbolic's verdict (with --symbolic)
    not_run: str | None = None
    detail: str | None = None

    @property
    def runs(self) -> tuple:
        return tuple(r for r in (self.registration, self.lookup, self.stateful, self.engine) if r is not None)

    @property
    def status(self) -> str:
        return self.not_run or _row_status(self.runs)

    @property
    def overall(self) -> Outcome | None:
        """The worst outcome of the runs (None: none ran)."""
        return None if self.not_run else worst([r.outcome for r in self.runs])

    def as_dict(self) -> dict[str, Any]:
        row: dict[str, Any] = {"version": self.version}
        if self.not_run:
            return {**row, "status": self.not_run, "detail": self.detail}
        result, lookup, stateful, engine, caps = (self.registration, self.lookup, self.stateful, self.engine,
                                                  self.capabilities)
        row.update(
            status=self.status, overall=self.overall.name,
            capabilities=caps.as_dict(), rule=caps.rule_text(), **_fuzz_fields(result),
            lookup={"status": _row_status([lookup]), **_fuzz_fields(lookup)},
            stateful={"status": _row_status([stateful]), **_fuzz_fields(stateful),
                      "other_failures": [f.as_dict() for f in stateful.other_failures],
                      "operations": stateful.tally.operations, "scope": stateful.scope()},
            engine={"status": _row_status([engine]), **_fuzz_fields(engine),
                    "other_failures": [f.as_dict() for f in engine.other_failures],
                    "operations": engine.tally.operations, "scope": engine.scope(), "settings": engine.settings,
                    "refused": engine.tally.refused},
        )
        if self.symbolic is not None:
            row["symbolic"] = {"status": self.symbolic.status.value, "detail": self.symbolic.detail}
        return row


def history_row(version: str, max_examples: int, seed: int, symbolic: bool) -> HistoryRow:
    """The registration, lookup, stateful and engine differentials (and,
    with ``symbolic``, the release's own code) on one release."""
    from kvspec.diff_tests.engine import fuzz_engine
    from kvspec.diff_tests.fuzz import fuzz_subject
    from kvspec.diff_tests.stateful import fuzz_stateful
    from kvspec.subjects.process import SubjectProcess
    from kvspec.subjects.subject import SubjectUnsupported, release

    subject = release(version)
    try:
        with SubjectProcess(subject) as proc:
            caps = proc.capabilities
            # History shows every bug a release carries: none recognised and passed over.
            result = fuzz_subject(proc, max_examples, seed, include_known=True)
            # The same worker then answers the hit-length and stateful differentials.
            lookup = fuzz_subject(proc, max_examples, seed, lookup=True, include_known=True)
            stateful = fuzz_stateful(proc, max_examples, seed, include_known=True)
            # And through vLLM's real Scheduler, engine-built, the release's defaults included.
            engine = fuzz_engine(proc, max_examples, seed, include_known=True)
    except SubjectUnsupported as exc:
        return HistoryRow(version, not_run="unsupported", detail=str(exc))
    except KvspecError as exc:
        if exc.outcome is not Outcome.USAGE:
            raise
        return HistoryRow(version, not_run="error", detail=str(exc))
    verdict = None
    if symbolic:
        from kvspec.subjects.symbolic import symbolic_check

        verdict = symbolic_check(subject)
    return HistoryRow(version, result, lookup, stateful, engine, caps, verdict)
