"""Named variants of the registration rule, written against the same interface.

Each variant models one real or plausible way the rule has been (or could
be) written.  Correct shapes must prove equivalent to the specification;
historical shapes are equivalent only under the restriction of their era;
wrong variants must be refuted, and they double as the known-wrong
witnesses that keep the theorems from being vacuous.
"""

from __future__ import annotations

import enum
import functools
from typing import Any, Callable

import attrs

from .errors import UnknownName
from .arith import Arith
from .spec import (
    SPEC_STEPS,
    BoundaryInputs,
    RegistrationRule,
    StepsRule,
    registration_bound,
    registration_steps,
    reprefillable_tokens,
)

__all__ = ["Conformance", "Variant", "VARIANTS", "variant", "CORRECT", "WRONG"]


class Conformance(str, enum.Enum):
    CORRECT = "correct"  # equivalent to the specification everywhere
    HISTORICAL = "historical"  # equivalent under the restriction of its era
    WRONG = "wrong"  # differs somewhere the spec says it must not


@attrs.frozen
class Variant:
    name: str
    summary: str  # one line: what it models
    rule: RegistrationRule
    conformance: Conformance
    # For HISTORICAL variants: the restriction (over BoundaryInputs) under
    # which they match the specification.
    restriction: Callable[[Arith, BoundaryInputs], Any] | None = None
    restriction_text: str = ""
    # The variant's derivation (its named intermediate values), when it has
    # the spec's shape; reports show it beside the spec's.
    steps: StepsRule | None = None


def _align_cacheable(ar: Arith, x: Any, p: BoundaryInputs) -> Any:
    # The #52419 helper: identity under partial hash hits, else round_down(x, S).
    return ar.ite(p.partial, x, ar.round_down(x, p.S))


def _floor_to_scheduler(ar: Arith, x: Any, p: BoundaryInputs) -> Any:
    return ar.round_down(x, p.S)


def fix_52419(ar: Arith, p: BoundaryInputs) -> Any:
    cached = _align_cacheable(ar, p.n, p)
    finalized = ar.max(ar.const(0), p.n - reprefillable_tokens(ar, p))
    eagle = ar.min(finalized, _align_cacheable(ar, finalized, p) + p.B)
    return ar.ite(ar.and_(p.eagle, cached > 0), eagle, cached)


def cacheable_tokens_032(ar: Arith, p: BoundaryInputs) -> Any:
    # get_num_cacheable_tokens: the EAGLE case returns early; the reprefillable
    # count is the coordinator's attribute max(0, lookahead - 1).
    cached = _align_cacheable(ar, p.n, p)
    reprefillable = ar.ite(p.L > 1, p.L - 1, ar.const(0))
    finalized = ar.ite(p.n > reprefillable, p.n - reprefillable, ar.const(0))
    early = ar.and_(p.eagle, cached > 0)
    return ar.ite(early, ar.min(finalized, _align_cacheable(ar, finalized, p) + p.B), cached)


def pre_partial_hits_023(ar: Arith, p: BoundaryInputs) -> Any:
    aligned = _floor_to_scheduler(ar, p.n, p)
    eagle = ar.min(p.n, aligned + p.B)
    return ar.ite(ar.and_(p.eagle, aligned > 0), eagle, aligned)


def partial_hits_026(ar: Arith, p: BoundaryInputs) -> Any:
    aligned = _align_cacheable(ar, p.n, p)
    eagle = ar.min(p.n, aligned + p.B)
    return ar.ite(ar.and_(p.eagle, aligned > 0), eagle, aligned)


def _replace(**step) -> StepsRule:
    """The spec with one step replaced (``model.spec.RuleSteps``)."""
    return functools.partial(registration_steps, steps=attrs.evolve(SPEC_STEPS, **step))


def _aligned_plus(unit: str) -> Callable:
    def bound(ar: Arith, fin: Any, aligned: Any, p: BoundaryInputs) -> Any:
        return ar.min(fin, aligned + getattr(p, unit))
    return bound


def _round_to_hash(ar: Arith, x: Any, p: BoundaryInputs) -> Any:
    return ar.ite(p.partial, ar.round_down(x, p.H), ar.round_down(x, p.S))


def _lookahead_condition(ar: Arith, fin: Any, aligned: Any, p: BoundaryInputs) -> Any:
    return ar.ite(fin - ar.round_down(fin, p.S) <= p.B, fin, ar.round_down(fin, p.S))


# Each wrong variant: (name, summary, the one step it replaces).
_WRONG_STEPS = (
    ("regression_50062", "#50062: EAGLE bound re-floored to S even under partial hits",
     dict(matchable_finalized=_floor_to_scheduler)),
    ("round_to_hash_block", "partial hits round to the hash block instead of not at all",
     dict(matchable=_round_to_hash)),
    ("lookahead_dropped", "EAGLE groups lose the lookahead block",
     dict(eagle_bound=lambda ar, fin, aligned, p: aligned)),
    ("finalized_ignored", "EAGLE clamp uses n, not the finalized tokens",
     dict(eagle_bound=lambda ar, fin, aligned, p: ar.min(p.n, aligned + p.B))),
    ("eagle_guard_always", "EAGLE branch taken even with no matchable boundary (guard >= 0)",
     dict(applies=lambda ar, p, cached: ar.and_(p.eagle, cached >= 0))),
    ("reprefillable_off_by_one", "reprefillable tokens = lookahead, not lookahead - 1",
     dict(finalized=lambda ar, p: ar.max(ar.const(0), p.n - p.L))),
    ("eagle_rule_everywhere", "the EAGLE lookahead rule applied to every group",
     dict(applies=lambda ar, p, cached: cached > 0)),
    ("floor_non_eagle_under_partial", "non-EAGLE groups floored to S under partial hits",
     dict(non_eagle=lambda ar, p, cached: _floor_to_scheduler(ar, p.n, p))),
    ("missing_clamp_at_zero", "finalized = n - reprefillable without the clamp at zero",
     dict(finalized=lambda ar, p: p.n - reprefillable_tokens(ar, p))),
    ("lookahead_unclamped", "EAGLE lookahead not clamped to the finalized tokens",
     dict(eagle_bound=lambda ar, fin, aligned, p: aligned + p.B)),
    ("lookahead_scheduler_block", "EAGLE lookahead of a scheduler block, not the group block",
     dict(eagle_bound=_aligned_plus("S"))),
    ("lookahead_as_condition", "EAGLE keeps its tail only if it fits the lookahead block",
     dict(eagle_bound=_lookahead_condition)),
    ("reprefillable_added", "sign error: reprefillable tokens added instead of subtracted",
     dict(finalized=lambda ar, p: p.n + reprefillable_tokens(ar, p))),
)


def _no_partial_no_reprefill(ar: Arith, p: BoundaryInputs) -> Any:
    return ar.and_(ar.not_(p.partial), p.L <= 1)


def _no_reprefill(ar: Arith, p: BoundaryInputs) -> Any:
    return p.L <= 1


def _bound_of(name: str, steps: StepsRule) -> RegistrationRule:
    def rule(ar: Arith, p: BoundaryInputs) -> Any:
        return steps(ar, p).bound

    rule.__name__ = name
    return rule


def _wrong(name: str, summary: str, step: dict[str, Callable]) -> Variant:
    steps = _replace(**step)
    return Variant(name, summary, _bound_of(name, steps), Conformance.WRONG, steps=steps)


VARIANTS: tuple[Variant, ...] = (
    Variant("spec", "the specification itself (sanity: equivalent to itself)",
            registration_bound, Conformance.CORRECT, steps=registration_steps),
    Variant("fix_52419", "the #52419 fix: one _align_cacheable helper for both bounds",
            fix_52419, Conformance.CORRECT),
    Variant("cacheable_tokens_032", "0.32+ get_num_cacheable_tokens(n, group_id), early EAGLE return",
            cacheable_tokens_032, Conformance.CORRECT),
    Variant("pre_partial_hits_023", "0.23-0.25: floor to S; EAGLE min(n, floor + B); no partial hits",
            pre_partial_hits_023, Conformance.HISTORICAL, _no_partial_no_reprefill,
            "no partial hash hits and no reprefillable tokens (num_prefill_lookahead <= 1)"),
    Variant("partial_hits_026", "0.26-0.27: partial-hit aware, no reprefillable tokens yet",
            partial_hits_026, Conformance.HISTORICAL, _no_reprefill,
            "no reprefillable tokens (num_prefill_lookahead <= 1)"),
    *(_wrong(name, summary, step) for name, summary, step in _WRONG_STEPS),
)

_BY_NAME = {v.name: v for v in VARIANTS}
CORRECT = tuple(v for v in VARIANTS if v.conformance is Conformance.CORRECT)
WRONG = tuple(v for v in VARIANTS if v.conformance is Conformance.WRONG)


def variant(name: str) -> Variant:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnknownName(f"unknown variant {name!r}; known: {', '.join(_BY_NAME)}") from None
