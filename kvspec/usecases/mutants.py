"""``kvspec mutants``'s use case: every mutant of a release against every technique."""

from __future__ import annotations

import time
from typing import Any, Callable

import attrs

from kvspec.model.errors import KvspecError
from kvspec.model.outcome import Outcome
from kvspec.usecases import Say, print_line

__all__ = ["MutantRow", "kill_matrix"]


def _model_verdict(variant_name: str) -> str:
    """What the proofs say of the variant a mutant models: 'equivalent' when
    its conformance theorem is PROVED, else 'non-equivalent' (or 'unknown')."""
    from kvspec.proofs.catalog import theorem
    from kvspec.proofs.runner import run_theorem
    from kvspec.proofs.verdict import Status

    result = run_theorem(theorem(f"conformance.{variant_name}"), vacuity=False)
    return {Status.PROVED: "equivalent", Status.REFUTED: "non-equivalent"}.get(result.status, "unknown")


def _symbolic_cell(subject, operator, version: str, model: str) -> dict[str, Any]:
    """The symbolic leg on one mutant; out of scope when the mutation lies in
    code the harness abstracts (it would be 'verified' for the wrong reason)."""
    from kvspec.subjects.provision import ensure_release
    from kvspec.subjects.symbolic import SymbolicStatus, symbolic_check

    original = (ensure_release(version) / operator.target_file).read_text(encoding="utf-8")
    method = operator.mutated_method(original)
    verdict = symbolic_check(subject)
    status = verdict.status.value
    if verdict.target and method != verdict.target and verdict.status is SymbolicStatus.VERIFIED:
        status = "out of scope"
    elif verdict.status is SymbolicStatus.VERIFIED and model == "equivalent":
        status = "verified-equivalent"  # the real code, not just the model, is equivalent
    return {"symbolic": status, "symbolic_seconds": round(verdict.seconds, 2),
            "mutated_method": method, "symbolic_detail": verdict.detail}


@attrs.frozen
class MutantRow:
    """One mutant against every technique: the differentials' typed results,
    the exhaustive sweep's summary and the symbolic cell; or why it was not
    run (``not_run``: "not applicable" or "error", with ``error``).
    ``as_dict`` is the row of ``kvspec.mutants/1``."""

    operator: Any  # subjects.mutation's operator
    model: str  # the proofs' verdict on the variant it models, or "lookup side" / "state side"
    not_run: str | None = None
    error: str | None = None
    fuzz: Any = None  # diff_tests.fuzz.FuzzResult (registration, or lookup for a lookup- or state-side mutant)
    stateful: Any = None  # diff_tests.stateful.StatefulResult (None: not run)
    swept: dict[str, Any] | None = None  # diff_tests.exhaustive.exhaust's summary (registration side)
    symbolic: dict[str, Any] | None = None  # the symbolic columns (with --symbolic)
    wall_seconds: float = 0.0

    @property
    def name(self) -> str:
        return self.operator.name

    @property
    def lookup(self) -> bool:
        return self.operator.side != "registration"

    @property
    def killed(self) -> bool:
        return self.fuzz is not None and self.fuzz.failure is not None

    @property
    def killed_stateful(self) -> bool:
        return self.stateful is not None and self.stateful.failure is not None

    @property
    def survived(self) -> str:
        """What a technique that did not kill it says: "equivalent" when the proofs say so."""
        return "equivalent" if self.model == "equivalent" else "survived"

    @property
    def status(self) -> str:
        if self.not_run:
            return self.not_run
        return "killed" if self.killed or self.killed_stateful else self.survived

    def as_dict(self) -> dict[str, Any]:
        operator = self.operator
        row: dict[str, Any] = {"mutant": operator.name, "models_variant": operator.models_variant,
                               "summary": operator.summary, "side": operator.side, "model": self.model}
        if self.not_run:
            return {**row, "status": self.not_run, "error": self.error}
        result, stateful, killed, killed_stateful, survived = (self.fuzz, self.stateful, self.killed,
                                                               self.killed_stateful, self.survived)
        row.update(
            status=self.status,
            differential="lookup" if self.lookup else "registration",
            fuzz="killed" if killed else survived,
            cases_to_kill=result.cases_to_first_failure,
            seconds_to_kill=result.seconds_to_first_failure,
            cases=result.cases,
            category=result.failure.category.value if killed else None,
            example=result.failure.case.describe() if killed else None,
            stateful="not run" if stateful is None else "killed" if killed_stateful else survived,
            programs_to_kill=stateful and stateful.programs_to_first_failure,
            stateful_seconds_to_kill=None if stateful is None or stateful.seconds_to_first_failure is None
            else round(stateful.seconds_to_first_failure, 2),
            stateful_category=stateful.failure.category.value if killed_stateful else None,
            stateful_example=stateful.failure.case.describe() if killed_stateful else None,
            wall_seconds=self.wall_seconds,
        )
        swept = self.swept
        if swept is None:  # the exhaustive scope and the symbolic leg check registration only
            row.update(exhaustive="n/a", exhaustive_failing="", exhaustive_seconds="")
        else:
            row.update(exhaustive="killed" if swept["failing_cases"] else survived,
                       exhaustive_failing=f"{swept['failing_cases']}/{swept['cases']}",
                       exhaustive_seconds=swept["seconds"])
        if self.symbolic is not None:
            row.update(self.symbolic)
        return row


def kill_matrix(version: str, max_examples: int, seed: int, names: list[str] | None = None,
                symbolic: bool = False, every_technique: bool = False, say: Say = print_line,
                on_row: Callable[[list[MutantRow]], None] = lambda rows: None) -> list[MutantRow]:
    """Every mutant of ``version`` (or the named ones) against every technique
    (the stateful differential on state-side mutants only, unless
    ``every_technique``); ``on_row`` gets the rows so far after each one."""
    from kvspec.diff_tests.exhaustive import Scope, exhaust
    from kvspec.diff_tests.fuzz import fuzz_subject
    from kvspec.diff_tests.stateful import fuzz_stateful
    from kvspec.subjects.mutation import ALL_MUTANTS, MutationTargetNotFound
    from kvspec.subjects.process import SubjectProcess
    from kvspec.subjects.provision import ensure_release
    from kvspec.subjects.subject import mutant_subject

    exhaustive_scope = Scope(max_groups=2)
    rows: list[MutantRow] = []
    for operator in ALL_MUTANTS:
        if names and operator.name not in names:
            continue
        # A registration-side mutant is fuzzed by the registration differential;
        # a lookup- or state-side one by the hit-length differential (which
        # checks registration too); every mutant then by the stateful one.
        lookup = operator.side != "registration"
        model = {"lookup": "lookup side", "state": "state side"}.get(operator.side)
        model = model or _model_verdict(operator.models_variant)
        started = time.perf_counter()
        subject = mutant_subject(version, operator.name)
        try:
            operator.apply((ensure_release(version) / operator.target_file).read_text(encoding="utf-8"))
        except MutationTargetNotFound as exc:
            # The release lacks the code the operator rewrites (often: it already has that shape).
            rows.append(MutantRow(operator, model, not_run="not applicable", error=str(exc)))
            on_row(rows)
            say(f"  {operator.name}: not applicable to {version}: {exc}")
            continue
        try:
            with SubjectProcess(subject) as proc:
                result = fuzz_subject(proc, max_examples, seed, stop_at_first=True, lookup=lookup)
                stateful = None
                if every_technique or operator.side == "state":
                    stateful = fuzz_stateful(proc, max_examples, seed, stop_at_first=True)
                swept = None if operator.side != "registration" else exhaust([proc], exhaustive_scope)
        except KvspecError as exc:
            if exc.outcome is not Outcome.USAGE:
                raise
            rows.append(MutantRow(operator, model, not_run="error", error=str(exc)))
            on_row(rows)
            say(f"  {operator.name}: ERROR {exc}")
            continue
        wall_seconds = round(time.perf_counter() - started, 2)
        cell = None
        if symbolic and operator.side != "registration":
            cell = {"symbolic": "n/a", "symbolic_seconds": ""}
        elif symbolic:
            cell = _symbolic_cell(subject, operator, version, model)
        row = MutantRow(operator, model, fuzz=result, stateful=stateful, swept=swept, symbolic=cell,
                        wall_seconds=wall_seconds)
        rows.append(row)
        on_row(rows)
        shown = row.as_dict()
        say(f"  {operator.name}: {row.status} (fuzz {shown['fuzz']}, stateful {shown['stateful']})"
            + (f", symbolic {shown['symbolic']}" if symbolic else ""))
    return rows
