"""Concrete points in the proofs' vocabulary, and the spec evaluated by Z3 there.

``group_vars`` is the inverse of ``encoding.decode_geometry``: one group of a
real configuration at one call, as the symbol values the theorems range over,
so a theorem's condition or closed form can be evaluated at a finding.
``z3_bounds`` is the ledger's Z3 leg: the spec built as Z3 terms, the inputs
fixed by equations, and the solver asked for the bound (not the integer
backend, which is the oracle's leg).
"""

from __future__ import annotations

import z3

from kvspec.model.arith import Z3Arith
from kvspec.model.domain import CoordinatorConfig
from kvspec.model.spec import RegistrationRule, registration_bound

from .encoding import GEOMETRY_BOOLS, GEOMETRY_INTS, Vars, declare, inputs
from .runner import DEFAULT_RLIMIT, check, new_solver

__all__ = ["group_vars", "z3_bounds"]


def group_vars(
    config: CoordinatorConfig, group: int, n: int, total_tokens: int, *,
    partial: bool, eagle: bool, lookahead: int,
) -> Vars:
    H, S = config.hash_block_size, config.scheduler_block_size
    B = config.groups[group].block_size
    return Vars(n=n, t=total_tokens, S=S, H=H, B=B, L=lookahead, m=B // H, k=S // B,
                E=bool(eagle), P=bool(partial))


def z3_bounds(
    config: CoordinatorConfig, n: int, total_tokens: int, *,
    partial: bool, eagle: tuple[bool, ...], lookahead: int,
    rule: RegistrationRule = registration_bound,
) -> tuple[int | None, ...]:
    """Per-group bound as Z3 computes it (None where the solver gave no answer)."""
    out: list[int | None] = []
    for group in range(len(config.groups)):
        concrete = group_vars(config, group, n, total_tokens, partial=partial,
                              eagle=eagle[group], lookahead=lookahead)
        ctx = z3.Context()
        ar = Z3Arith(ctx)
        v = declare(ar, GEOMETRY_INTS, GEOMETRY_BOOLS)
        bound = z3.Int("bound", ctx)
        solver = new_solver(ctx, DEFAULT_RLIMIT)  # evaluating at a point: far below the budget
        for name in GEOMETRY_INTS:
            solver.add(v[name] == concrete[name])
        for name in GEOMETRY_BOOLS:
            solver.add(v[name] == z3.BoolVal(concrete[name], ctx))
        solver.add(bound == rule(ar, inputs(v)))
        out.append(solver.model()[bound].as_long() if check(solver) == z3.sat else None)
    return tuple(out)
