"""Runs theorems: fresh context, deterministic budget, vacuity, minimisation, replay.

Every solver check gets a *resource* budget (Z3's ``rlimit``), not a time
limit: Z3 counts its own work, which does not grow when the machine is busy,
so a verdict does not depend on load.  (The count is not exactly repeatable
on the hardest nonlinear queries -- Z3's hash ordering varies between
processes; measured up to 25% apart -- so the budget keeps a wide margin.)  A
wall-clock safety net stays, far above what the budget allows; if it ever
fires the result is UNKNOWN and says it was the machine, not the budget.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Iterable

import attrs
import z3

from kvspec.model.arith import INT, Z3Arith

from .budgets import DEFAULT_RLIMIT, SAFETY_NET_S
from .encoding import Vars, decode_model, declare
from .theorem import Target, Theorem
from .verdict import Counterexample, Status, TheoremResult, VacuityCheck

__all__ = ["Budget", "run_theorem", "run_catalog", "DEFAULT_RLIMIT", "SAFETY_NET_S"]

MAX_MINIMISATION_STEPS = 64


@attrs.frozen
class Budget:
    """What one solver check may spend."""

    rlimit: int = DEFAULT_RLIMIT
    safety_net_s: float = SAFETY_NET_S

    def as_dict(self) -> dict[str, Any]:
        return {"rlimit_per_check": self.rlimit, "safety_net_s_per_check": self.safety_net_s}


@attrs.define
class _Spend:
    """Resource units a theorem's checks spent, and why any gave up."""

    most: int = 0
    total: int = 0
    unknown: list[str] = attrs.Factory(list)


def _rlimit_count(solver: z3.Solver) -> int:
    stats = solver.statistics()
    for key in stats.keys():
        if key == "rlimit count":
            return int(stats.get_key_value(key))
    return 0


def _check(solver: z3.Solver, budget: Budget, spend: _Spend) -> Any:
    """One check within ``budget``, counted in ``spend``."""
    before = _rlimit_count(solver)
    answer = check(solver)
    used = max(0, _rlimit_count(solver) - before)
    spend.most, spend.total = max(spend.most, used), spend.total + used
    if answer == z3.unknown:
        reason = solver.reason_unknown()
        if "resource" in reason or "canceled" in reason:
            spend.unknown.append(f"the budget of {budget.rlimit:,} resource units per check ran out")
        elif "timeout" in reason:
            spend.unknown.append(f"the wall-clock safety net of {budget.safety_net_s:g} s expired "
                                 "(the machine, not the budget)")
        else:
            spend.unknown.append(f"the solver gave up: {reason}")
    return answer


def new_solver(ctx: z3.Context, rlimit: int) -> z3.Solver:
    """A solver with a resource budget (check it with ``check``)."""
    solver = z3.Solver(ctx=ctx)
    solver.set("rlimit", int(rlimit))
    return solver


def check(solver: z3.Solver) -> Any:
    """``solver.check()``, with Ctrl-C raised as KeyboardInterrupt: Z3 takes
    SIGINT itself while it solves and answers "unknown" (reason "interrupted
    from keyboard"), which would swallow the interrupt (a run went on and
    said COMPLETE) and pass for a budget that ran out."""
    answer = solver.check()
    if answer == z3.unknown and "keyboard" in solver.reason_unknown():
        raise KeyboardInterrupt
    return answer


def _solver(ctx: z3.Context, budget: Budget, seed: int) -> z3.Solver:
    solver = new_solver(ctx, budget.rlimit)
    solver.set("timeout", int(budget.safety_net_s * 1000))
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


def _minimise(solver: z3.Solver, theorem: Theorem, v: Vars, values: dict[str, Any], budget: Budget,
              spend: _Spend) -> tuple[dict[str, Any], bool]:
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
        step = _check(solver, budget, _Spend())  # a minimisation step never decides the verdict
        if step == z3.sat:
            values = decode_model(solver.model(), v)
            best = sum(values[name] for name in theorem.cost)
        else:
            low = middle + 1
            confirmed = confirmed and step == z3.unsat
        solver.pop()
    return values, confirmed and low >= best


def _search(
    theorem: Theorem, target: Target, budget: Budget, seed: int, minimise: bool, spend: _Spend,
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
        solver = _solver(ctx, budget, seed)
        solver.add(z3.simplify(z3.substitute(query, *fixed)) if fixed else query)
        solver.add(*[var == value for var, value in fixed])
        answer = _check(solver, budget, spend)
        if answer == z3.sat:
            break
        if answer == z3.unknown:
            unknown_reason = f"{spend.unknown[-1]} (case {dict(zip(theorem.bools, case))})"
    else:
        if unknown_reason:
            return Status.UNKNOWN, None, unknown_reason
        return Status.PROVED, None, ""
    values = decode_model(solver.model(), v)
    minimal = False
    if minimise and theorem.cost:
        values, minimal = _minimise(solver, theorem, v, values, budget, spend)
    if not _replays(theorem, values, target):
        return Status.UNKNOWN, None, f"spurious model (did not replay on integers): {values}"
    domain = theorem.explain(values) if theorem.explain is not None else {}
    cost_value = sum(values[name] for name in theorem.cost) if theorem.cost else 0
    return (
        Status.REFUTED,
        Counterexample(values=values, replayed=True, minimal=minimal, cost=cost_value, domain=domain),
        "",
    )


def _assumptions_satisfiable(theorem: Theorem, budget: Budget, seed: int, spend: _Spend) -> Status:
    ctx = z3.Context()
    ar = Z3Arith(ctx)
    v = declare(ar, theorem.ints, theorem.bools)
    solver = _solver(ctx, budget, seed)
    solver.add(theorem.assume(ar, v))
    answer = _check(solver, budget, spend)
    if answer == z3.sat:
        values = decode_model(solver.model(), v)
        return Status.PROVED if bool(theorem.assume(INT, Vars(values))) else Status.UNKNOWN
    return Status.REFUTED if answer == z3.unsat else Status.UNKNOWN


def run_theorem(theorem: Theorem, budget: Budget = Budget(), seed: int = 0,
                vacuity: bool = True) -> TheoremResult:
    start = time.perf_counter()
    spend = _Spend()
    status, counterexample, detail = _search(theorem, theorem.target, budget, seed, minimise=True,
                                             spend=spend)
    check = None
    if vacuity:
        satisfiable = _assumptions_satisfiable(theorem, budget, seed, spend)
        verdicts: dict[Status, list[str]] = {Status.REFUTED: [], Status.PROVED: [], Status.UNKNOWN: []}
        for refuter in theorem.refuters:
            outcome, _, _ = _search(theorem, refuter, budget, seed, minimise=False, spend=spend)
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
        budget=budget.as_dict(),
        resources={"most_per_check": spend.most, "total": spend.total},
    )


def run_catalog(theorems: Iterable[Theorem], budget: Budget = Budget(), seed: int = 0,
                progress=None) -> list[TheoremResult]:
    results = []
    for theorem in theorems:
        result = run_theorem(theorem, budget=budget, seed=seed)
        if progress is not None:
            progress(result)
        results.append(result)
    return results
