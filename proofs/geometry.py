"""Theorems over one group's geometry: the symbols, assumptions and cost every
catalog entry shares (``catalog`` for registration, ``lookup_catalog`` for
the lookup side)."""

from __future__ import annotations

from typing import Any, Callable

from kvspec.model.arith import Arith

from .encoding import GEOMETRY_BOOLS, GEOMETRY_INTS, Vars, well_formed
from .theorem import Target, Theorem
from .verdict import Status

__all__ = ["WF_TEXT", "GEOMETRY_COST", "geometry_theorem"]

WF_TEXT = ("H >= 1, B = m*H, S = k*B (m, k >= 1), 0 <= n <= t, L >= 0, "
           "EAGLE => L <= S (lookahead guard), partial hits => H < S")
GEOMETRY_COST = ("n", "S", "H", "B", "L", "t")


def geometry_theorem(
    name: str,
    category: str,
    statement: str,
    claim: Callable[[Arith, Vars, Callable], Any],
    target: Target,
    *,
    expected: Status = Status.PROVED,
    refuters: tuple[Target, ...] = (),
    no_refuter_reason: str = "",
    extra_ints: tuple[str, ...] = (),
    extra_bools: tuple[str, ...] = (),
    extra_assume: Callable[[Arith, Vars], Any] | None = None,
    extra_text: str = "",
    hints: Callable[[Arith, Vars], list] | None = None,
    explain: Callable[[dict], dict] | None = None,
) -> Theorem:
    """A theorem over one group's well-formed geometry (``encoding.well_formed``)
    and any extra symbols it names."""
    def assume(ar: Arith, v: Vars) -> Any:
        base = well_formed(ar, v)
        return base if extra_assume is None else ar.and_(base, extra_assume(ar, v))

    return Theorem(
        name=name,
        category=category,
        statement=statement,
        assumptions_text=WF_TEXT + (f"; {extra_text}" if extra_text else ""),
        ints=GEOMETRY_INTS + extra_ints,
        bools=GEOMETRY_BOOLS + extra_bools,
        assume=assume,
        claim=claim,
        target=target,
        expected=expected,
        refuters=refuters,
        no_refuter_reason=no_refuter_reason,
        hints=hints,
        cost=GEOMETRY_COST + extra_ints,
        explain=explain,
    )
