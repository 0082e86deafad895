"""``kvspec mutants``'s use case: every mutant of a release against every technique."""

from __future__ import annotations

import time
from typing import Any, Callable

from kvspec.model.errors import KvspecError
from kvspec.model.outcome import Outcome
from kvspec.usecases import Say, print_line

__all__ = ["kill_matrix"]


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


def kill_matrix(version: str, max_examples: int, seed: int, names: list[str] | None = None,
                symbolic: bool = False, every_technique: bool = False, say: Say = print_line,
                on_row: Callable[[list[dict[str, Any]]], None] = lambda rows: None) -> list[dict[str, Any]]:
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
    rows: list[dict[str, Any]] = []
    for operator in ALL_MUTANTS:
        if names and operator.name not in names:
            continue
        # A registration-side mutant is fuzzed by the registration differential;
        # a lookup- or state-side one by the hit-length differential (which
        # checks registration too); every mutant then by the stateful one.
        lookup = operator.side != "registration"
        model = {"lookup": "lookup side", "state": "state side"}.get(operator.side)
        row: dict[str, Any] = {"mutant": operator.name, "models_variant": operator.models_variant,
                               "summary": operator.summary, "side": operator.side,
                               "model": model or _model_verdict(operator.models_variant)}
        started = time.perf_counter()
        subject = mutant_subject(version, operator.name)
        try:
            operator.apply((ensure_release(version) / operator.target_file).read_text(encoding="utf-8"))
        except MutationTargetNotFound as exc:
            # The release lacks the code the operator rewrites (often: it already has that shape).
            row.update(status="not applicable", error=str(exc))
            rows.append(row)
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
            row.update(status="error", error=str(exc))
            rows.append(row)
            on_row(rows)
            say(f"  {operator.name}: ERROR {exc}")
            continue
        killed = result.failure is not None
        killed_stateful = stateful is not None and stateful.failure is not None
        survived = "equivalent" if row["model"] == "equivalent" else "survived"
        row.update(
            status="killed" if killed or killed_stateful else survived,
            differential="lookup" if lookup else "registration",
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
            wall_seconds=round(time.perf_counter() - started, 2),
        )
        if swept is None:  # the exhaustive scope and the symbolic leg check registration only
            row.update(exhaustive="n/a", exhaustive_failing="", exhaustive_seconds="")
        else:
            row.update(exhaustive="killed" if swept["failing_cases"] else survived,
                       exhaustive_failing=f"{swept['failing_cases']}/{swept['cases']}",
                       exhaustive_seconds=swept["seconds"])
        if symbolic and operator.side != "registration":
            row.update(symbolic="n/a", symbolic_seconds="")
        elif symbolic:
            row.update(_symbolic_cell(subject, operator, version, row["model"]))
        rows.append(row)
        on_row(rows)
        say(f"  {operator.name}: {row['status']} (fuzz {row['fuzz']}, stateful {row['stateful']})"
            + (f", symbolic {row['symbolic']}" if symbolic else ""))
    return rows

