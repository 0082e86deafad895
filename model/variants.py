"""Named variants of the registration rule, written against the same interface.

Each variant models one real or plausible way the rule has been (or could
be) written.  Correct shapes must prove equivalent to the specification;
historical shapes are equivalent only under the restriction of their era;
wrong variants must be refuted, and they double as the known-wrong
witnesses that keep the theorems from being vacuous.
"""

from __future__ import annotations

import enum
from typing import Any, Callable

import attrs

from .arith import Arith
from .spec import (
    BoundaryInputs,
    RegistrationRule,
    RegistrationSteps,
    StepsRule,
    finalized_tokens,
    registration_bound,
    registration_steps,
    reprefillable_tokens,
)

__all__ = ["Verdict", "Variant", "VARIANTS", "variant", "CORRECT", "WRONG"]


class Verdict(str, enum.Enum):
    CORRECT = "correct"  # equivalent to the specification everywhere
    HISTORICAL = "historical"  # equivalent under the restriction of its era
    WRONG = "wrong"  # differs somewhere the spec says it must not


@attrs.frozen
class Variant:
    name: str
    summary: str  # one line: what it models
    rule: RegistrationRule
    verdict: Verdict
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


def _eagle_steps(
    ar: Arith,
    p: BoundaryInputs,
    align: Callable[[Arith, Any, BoundaryInputs], Any] = _align_cacheable,
    eagle_bound: Callable[[Arith, Any, Any, BoundaryInputs], Any] | None = None,
    finalized: Any = None,
    eagle_flag: Any = None,
    guard: Callable[[Any], Any] | None = None,
    non_eagle: Any = None,
    align_finalized: Callable[[Arith, Any, BoundaryInputs], Any] | None = None,
) -> RegistrationSteps:
    """The fix's structure with one piece swapped: wrong variants below each
    replace exactly one piece, so each models exactly one mistake."""
    cached = align(ar, p.n, p)
    fin = finalized_tokens(ar, p) if finalized is None else finalized
    aligned = (align if align_finalized is None else align_finalized)(ar, fin, p)
    if eagle_bound is None:
        bound = ar.min(fin, aligned + p.B)
    else:
        bound = eagle_bound(ar, fin, aligned, p)
    flag = p.eagle if eagle_flag is None else eagle_flag
    applies = ar.and_(flag, cached > 0 if guard is None else guard(cached))
    otherwise = cached if non_eagle is None else non_eagle
    return RegistrationSteps(cached, fin, aligned, bound, applies, ar.ite(applies, bound, otherwise))


def regression_50062(ar: Arith, p: BoundaryInputs) -> RegistrationSteps:
    # The re-derived bound floors to S unconditionally, partial hits or not.
    return _eagle_steps(ar, p, align_finalized=_floor_to_scheduler)


def round_to_hash_block(ar: Arith, p: BoundaryInputs) -> RegistrationSteps:
    def align(ar: Arith, x: Any, p: BoundaryInputs) -> Any:
        return ar.ite(p.partial, ar.round_down(x, p.H), ar.round_down(x, p.S))

    return _eagle_steps(ar, p, align=align)


def lookahead_dropped(ar: Arith, p: BoundaryInputs) -> RegistrationSteps:
    return _eagle_steps(ar, p, eagle_bound=lambda ar, fin, aligned, p: aligned)


def finalized_ignored(ar: Arith, p: BoundaryInputs) -> RegistrationSteps:
    return _eagle_steps(ar, p, eagle_bound=lambda ar, fin, aligned, p: ar.min(p.n, aligned + p.B))


def eagle_guard_always(ar: Arith, p: BoundaryInputs) -> RegistrationSteps:
    return _eagle_steps(ar, p, guard=lambda cached: cached >= 0)


def reprefillable_off_by_one(ar: Arith, p: BoundaryInputs) -> RegistrationSteps:
    return _eagle_steps(ar, p, finalized=ar.max(ar.const(0), p.n - p.L))


def eagle_rule_everywhere(ar: Arith, p: BoundaryInputs) -> RegistrationSteps:
    return _eagle_steps(ar, p, eagle_flag=ar.true())


def floor_non_eagle_under_partial(ar: Arith, p: BoundaryInputs) -> RegistrationSteps:
    return _eagle_steps(ar, p, non_eagle=_floor_to_scheduler(ar, p.n, p))


def missing_clamp_at_zero(ar: Arith, p: BoundaryInputs) -> RegistrationSteps:
    return _eagle_steps(ar, p, finalized=p.n - reprefillable_tokens(ar, p))


def lookahead_unclamped(ar: Arith, p: BoundaryInputs) -> RegistrationSteps:
    return _eagle_steps(ar, p, eagle_bound=lambda ar, fin, aligned, p: aligned + p.B)


def lookahead_scheduler_block(ar: Arith, p: BoundaryInputs) -> RegistrationSteps:
    return _eagle_steps(ar, p, eagle_bound=lambda ar, fin, aligned, p: ar.min(fin, aligned + p.S))


def lookahead_as_condition(ar: Arith, p: BoundaryInputs) -> RegistrationSteps:
    def bound(ar: Arith, fin: Any, aligned: Any, p: BoundaryInputs) -> Any:
        return ar.ite(fin - ar.round_down(fin, p.S) <= p.B, fin, ar.round_down(fin, p.S))

    return _eagle_steps(ar, p, eagle_bound=bound)


def reprefillable_added(ar: Arith, p: BoundaryInputs) -> RegistrationSteps:
    return _eagle_steps(ar, p, finalized=p.n + reprefillable_tokens(ar, p))


def _no_partial_no_reprefill(ar: Arith, p: BoundaryInputs) -> Any:
    return ar.and_(ar.not_(p.partial), p.L <= 1)


def _no_reprefill(ar: Arith, p: BoundaryInputs) -> Any:
    return p.L <= 1


def _bound_of(steps: StepsRule) -> RegistrationRule:
    def rule(ar: Arith, p: BoundaryInputs) -> Any:
        return steps(ar, p).bound

    rule.__name__ = steps.__name__
    return rule


def _wrong(name: str, summary: str, steps: StepsRule) -> Variant:
    return Variant(name, summary, _bound_of(steps), Verdict.WRONG, steps=steps)


VARIANTS: tuple[Variant, ...] = (
    Variant("spec", "the specification itself (sanity: equivalent to itself)",
            registration_bound, Verdict.CORRECT, steps=registration_steps),
    Variant("fix_52419", "the #52419 fix: one _align_cacheable helper for both bounds",
            fix_52419, Verdict.CORRECT),
    Variant("cacheable_tokens_032", "0.32+ get_num_cacheable_tokens(n, group_id), early EAGLE return",
            cacheable_tokens_032, Verdict.CORRECT),
    Variant("pre_partial_hits_023", "0.23-0.25: floor to S; EAGLE min(n, floor + B); no partial hits",
            pre_partial_hits_023, Verdict.HISTORICAL, _no_partial_no_reprefill,
            "no partial hash hits and no reprefillable tokens (num_prefill_lookahead <= 1)"),
    Variant("partial_hits_026", "0.26-0.27: partial-hit aware, no reprefillable tokens yet",
            partial_hits_026, Verdict.HISTORICAL, _no_reprefill,
            "no reprefillable tokens (num_prefill_lookahead <= 1)"),
    _wrong("regression_50062", "#50062: EAGLE bound re-floored to S even under partial hits", regression_50062),
    _wrong("round_to_hash_block", "partial hits round to the hash block instead of not at all", round_to_hash_block),
    _wrong("lookahead_dropped", "EAGLE groups lose the lookahead block", lookahead_dropped),
    _wrong("finalized_ignored", "EAGLE clamp uses n, not the finalized tokens", finalized_ignored),
    _wrong("eagle_guard_always", "EAGLE branch taken even with no matchable boundary (guard >= 0)", eagle_guard_always),
    _wrong("reprefillable_off_by_one", "reprefillable tokens = lookahead, not lookahead - 1", reprefillable_off_by_one),
    _wrong("eagle_rule_everywhere", "the EAGLE lookahead rule applied to every group", eagle_rule_everywhere),
    _wrong("floor_non_eagle_under_partial", "non-EAGLE groups floored to S under partial hits", floor_non_eagle_under_partial),
    _wrong("missing_clamp_at_zero", "finalized = n - reprefillable without the clamp at zero", missing_clamp_at_zero),
    _wrong("lookahead_unclamped", "EAGLE lookahead not clamped to the finalized tokens", lookahead_unclamped),
    _wrong("lookahead_scheduler_block", "EAGLE lookahead of a scheduler block, not the group block", lookahead_scheduler_block),
    _wrong("lookahead_as_condition", "EAGLE keeps its tail only if it fits the lookahead block", lookahead_as_condition),
    _wrong("reprefillable_added", "sign error: reprefillable tokens added instead of subtracted", reprefillable_added),
)

_BY_NAME = {v.name: v for v in VARIANTS}
CORRECT = tuple(v for v in VARIANTS if v.verdict is Verdict.CORRECT)
WRONG = tuple(v for v in VARIANTS if v.verdict is Verdict.WRONG)


def variant(name: str) -> Variant:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown variant {name!r}; known: {', '.join(_BY_NAME)}") from None
