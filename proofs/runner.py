"""Runs theorems: fresh context, timeout, vacuity, minimisation, replay."""

from __future__ import annotations

import itertools
import time
from typing import Any, Iterable

import z3

from kvspec.model.arith import INT, Z3Arith

from .encoding import Vars, decode_model, declare
from .theorem import Target, Theorem
from .verdict import Counterexample, Status, TheoremResult, VacuityCheck

__all__ = ["run_theorem", "run_catalog", "DEFAULT_TIMEOUT_MS"]

DEFAULT_TIMEOUT_MS = 20_000
MAX_MINIMISATION_STEPS = 64


def _solver(ctx: z3.Context, timeout_ms: int, seed: int) -> z3.Solver:
    solver = z3.Solver(ctx=ctx)
    solver.set("timeout", int(timeout_ms))
    solver.set("random_seed", int(seed))
    return solver


def _replays(theorem: Theorem, values: dict[str, Any], target: Target) -> bool:
    """The model, run through the integer semantics: assumptions hold and the
    claim fails.  Anything else is a spurious model and never reported."""
    v = Vars(values)
    try:
        return bool(theorem.assume(INT, v)) and not bool(theorem.claim(INT, v, target.fn))
    except ZeroDivisionError:
        return False


def _cost(theorem: Theorem, v: Vars) -> Any:
    return sum((v[name] for name in theorem.cost), start=0)


def _minimise(solver: z3.Solver, theorem: Theorem, v: Vars,
              values: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Binary search on the cost (the sum of the cost symbols, all >= 0) for
    the smallest model.  Minimal means the last bound below the best model
    was confirmed unsat; an unknown step leaves it unconfirmed."""
    cost = _cost(theorem, v)
    low, best = 0, sum(values[name] for name in theorem.cost)
    confirmed = True
    for _ in range(MAX_MINIMISATION_STEPS):
        if low >= best:
            break
        middle = (low + best - 1) // 2
        solver.push()
        solver.add(cost <= middle)
        step = solver.check()
        if step == z3.sat:
            values = decode_model(solver.model(), v)
            best = sum(values[name] for name in theorem.cost)
        else:
            low = middle + 1
            confirmed = confirmed and step == z3.unsat
        solver.pop()
    return values, confirmed and low >= best


def _search(
    theorem: Theorem, target: Target, timeout_ms: int, seed: int, minimise: bool
) -> tuple[Status, Counterexample | None, str]:
    """Look for an input violating the claim for ``target``."""
    ctx = z3.Context()
    ar = Z3Arith(ctx)
    v = declare(ar, theorem.ints, theorem.bools)
    parts = [theorem.assume(ar, v)]
    if theorem.hints is not None:
        parts += theorem.hints(ar, v)
    parts.append(ar.not_(theorem.claim(ar, v, target.fn)))
    query = z3.And(parts)
    # Split on the boolean symbols (EAGLE, partial hits) and substitute each
    # case into the query: the if-then-else terms they guard disappear, which
    # the nonlinear core handles far better than one query with all branches.
    unknown_reason = ""
    solver = None
    for case in itertools.product((False, True), repeat=len(theorem.bools)):
        fixed = [(v[name], ar._bool(value)) for name, value in zip(theorem.bools, case)]
        solver = _solver(ctx, timeout_ms, seed)
        solver.add(z3.simplify(z3.substitute(query, *fixed)) if fixed else query)
        solver.add(*[var == value for var, value in fixed])
        answer = solver.check()
        if answer == z3.sat:
            break
        if answer == z3.unknown:
            unknown_reason = f"solver: {solver.reason_unknown()} (case {dict(zip(theorem.bools, case))})"
    else:
        if unknown_reason:
            return Status.UNKNOWN, None, unknown_reason
        return Status.PROVED, None, ""
    values = decode_model(solver.model(), v)
    minimal = False
    if minimise and theorem.cost:
        values, minimal = _minimise(solver, theorem, v, values)
    if not _replays(theorem, values, target):
        return Status.UNKNOWN, None, f"spurious model (did not replay on integers): {values}"
    domain = theorem.explain(values) if theorem.explain is not None else {}
    cost_value = sum(values[name] for name in theorem.cost) if theorem.cost else 0
    return (
        Status.REFUTED,
        Counterexample(values=values, replayed=True, minimal=minimal, cost=cost_value, domain=domain),
        "",
    )


def _assumptions_satisfiable(theorem: Theorem, timeout_ms: int, seed: int) -> Status:
    ctx = z3.Context()
    ar = Z3Arith(ctx)
    v = declare(ar, theorem.ints, theorem.bools)
    solver = _solver(ctx, timeout_ms, seed)
    solver.add(theorem.assume(ar, v))
    answer = solver.check()
    if answer == z3.sat:
        values = decode_model(solver.model(), v)
        return Status.PROVED if bool(theorem.assume(INT, Vars(values))) else Status.UNKNOWN
    return Status.REFUTED if answer == z3.unsat else Status.UNKNOWN


def run_theorem(
    theorem: Theorem, timeout_ms: int = DEFAULT_TIMEOUT_MS, seed: int = 0, vacuity: bool = True
) -> TheoremResult:
    start = time.perf_counter()
    status, counterexample, detail = _search(theorem, theorem.target, timeout_ms, seed, minimise=True)
    check = None
    if vacuity:
        satisfiable = _assumptions_satisfiable(theorem, timeout_ms, seed)
        verdicts: dict[Status, list[str]] = {Status.REFUTED: [], Status.PROVED: [], Status.UNKNOWN: []}
        for refuter in theorem.refuters:
            outcome, _, _ = _search(theorem, refuter, timeout_ms, seed, minimise=False)
            verdicts[outcome].append(refuter.name)
        note = theorem.no_refuter_reason if not theorem.refuters else ""
        # A refuter the solver gave up on is unknown, never "not refuted":
        # only a proof that it satisfies the claim shows the claim vacuous.
        check = VacuityCheck(satisfiable, tuple(verdicts[Status.REFUTED]), tuple(verdicts[Status.PROVED]),
                             note, tuple(verdicts[Status.UNKNOWN]))
    return TheoremResult(
        name=theorem.name,
        category=theorem.category,
        statement=theorem.statement,
        assumptions=theorem.assumptions_text,
        expected=theorem.expected,
        status=status,
        seconds=time.perf_counter() - start,
        counterexample=counterexample,
        vacuity=check,
        detail=detail,
    )


def run_catalog(
    theorems: Iterable[Theorem], timeout_ms: int = DEFAULT_TIMEOUT_MS, seed: int = 0, progress=None
) -> list[TheoremResult]:
    results = []
    for theorem in theorems:
        result = run_theorem(theorem, timeout_ms=timeout_ms, seed=seed)
        if progress is not None:
            progress(result)
        results.append(result)
    return results
