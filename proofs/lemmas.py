"""Floor-division lemmas, each proved on its own, then instantiated as hints.

Each lemma is an implication over fresh integer symbols.  Instantiating a
universally proved lemma on subterms of a query is sound, and it spares the
solver rediscovering the fact inside a nonlinear query.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs

from kvspec.model.arith import Arith

__all__ = ["Lemma", "LEMMAS", "lemma"]


@attrs.frozen
class Lemma:
    name: str
    statement: str
    params: tuple[str, ...]
    # body(ar, *params) -> an implication, true for all integers
    body: Callable[..., Any]

    def instance(self, ar: Arith, *terms: Any) -> Any:
        return self.body(ar, *terms)


def _div_monotone(ar: Arith, x: Any, y: Any, d: Any) -> Any:
    return ar.implies(ar.and_(d >= 1, x <= y), ar.div(x, d) <= ar.div(y, d))


def _div_bounds(ar: Arith, x: Any, d: Any) -> Any:
    q = ar.div(x, d)
    return ar.implies(d >= 1, ar.and_(q * d <= x, x < q * d + d))


def _step_past(ar: Arith, x: Any, y: Any, d: Any) -> Any:
    return ar.implies(ar.and_(d >= 1, x + d <= y), ar.div(x, d) + 1 <= ar.div(y, d))


def _multiple_exact(ar: Arith, w: Any, d: Any) -> Any:
    return ar.implies(d >= 1, ar.div(w * d, d) == w)


def _coarser_round_down(ar: Arith, x: Any, h: Any, m: Any) -> Any:
    # Rounding to h first does not change a floor to a multiple of h.
    return ar.implies(
        ar.and_(h >= 1, m >= 1),
        ar.div(ar.round_down(x, h), m * h) == ar.div(x, m * h),
    )


def _shift_by_multiple(ar: Arith, x: Any, w: Any, d: Any) -> Any:
    return ar.implies(d >= 1, ar.div(x + w * d, d) == ar.div(x, d) + w)


def _div_by_one(ar: Arith, x: Any) -> Any:
    return ar.div(x, ar.const(1)) == x


def _non_negative(ar: Arith, x: Any, d: Any) -> Any:
    return ar.implies(ar.and_(d >= 1, x >= 0), ar.div(x, d) >= 0)


LEMMAS: tuple[Lemma, ...] = (
    Lemma("div_monotone", "d >= 1 and x <= y imply x/d <= y/d", ("x", "y", "d"), _div_monotone),
    Lemma("div_bounds", "d >= 1 implies (x/d)*d <= x < (x/d)*d + d", ("x", "d"), _div_bounds),
    Lemma("step_past", "d >= 1 and x + d <= y imply x/d + 1 <= y/d", ("x", "y", "d"), _step_past),
    Lemma("multiple_exact", "d >= 1 implies (w*d)/d = w", ("w", "d"), _multiple_exact),
    Lemma("coarser_round_down", "h, m >= 1 imply ((x/h)*h)/(m*h) = x/(m*h)",
          ("x", "h", "m"), _coarser_round_down),
    Lemma("shift_by_multiple", "d >= 1 implies (x + w*d)/d = x/d + w", ("x", "w", "d"),
          _shift_by_multiple),
    Lemma("div_by_one", "x/1 = x", ("x",), _div_by_one),
    Lemma("div_non_negative", "d >= 1 and x >= 0 imply x/d >= 0", ("x", "d"), _non_negative),
)

_BY_NAME = {lemma.name: lemma for lemma in LEMMAS}


def lemma(name: str) -> Lemma:
    return _BY_NAME[name]
