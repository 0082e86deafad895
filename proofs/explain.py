"""What the solver knows about a finding: loss, worst case, reachability.

A finding's subject is first *diagnosed*: the model variant (if any) that
reproduces its observations at every call.  For a diagnosed variant the
catalog's theorems about it are run now (a verdict is never assumed), and
their conditions and closed forms -- the very functions Z3 proved -- are
evaluated at the finding's inputs, so the report can say "the proved formula
predicts 4 tokens lost here, 4 were lost".
"""

from __future__ import annotations

from typing import Any

import attrs

from kvspec.model.domain import CoordinatorConfig
from kvspec.model.finding import Category, Explanation, GroupRow, TheoremRef
from kvspec.model.spec import reprefillable_tokens, inputs_for_group
from kvspec.model.arith import INT
from kvspec.model.variants import variant

from .catalog import WORST_CASE_S_MAX, theorem
from .concrete import group_vars
from .runner import run_theorem

__all__ = ["ExplanationSpec", "EXPLAINED", "WorstCaseScope", "explain", "intended_drops", "worst_case_scope"]


@attrs.frozen
class ExplanationSpec:
    """The catalog's theorems about one wrong variant, and what they map to."""

    variant: str
    reachability: str  # iff-theorem: the variant differs from the spec exactly when ...
    block_reachability: str | None = None
    loss: str | None = None  # closed form of spec - variant
    worst_case: str | None = None
    # The declared bound on S the worst case was proved under (None: unbounded).
    worst_case_s_max: int | None = None


# The deployment knobs of a finding are not written here per rule: they are
# generated from the deployment profiles' derivations and the release's own
# code when the finding's reach is assessed (kvspec/reach.py fills
# Explanation.knobs), so they say what the finding's release does.

EXPLAINED: dict[str, ExplanationSpec] = {
    "regression_50062": ExplanationSpec(
        "regression_50062",
        reachability="reachability.regression_tokens",
        block_reachability="reachability.regression_blocks",
        loss="loss.regression_closed_form",
        worst_case="loss.regression_worst_case",
        worst_case_s_max=WORST_CASE_S_MAX,
    ),
}


@attrs.frozen
class WorstCaseScope:
    """Whether a proved worst case covers a finding's geometry."""

    bounds: str  # what it was proved over, e.g. "S <= 64"
    covers: bool
    # Outside the bounds: what the proved closed form (n - R) mod S - B, over
    # unbounded integers, gives at the finding's S and B instead.
    here: str | None = None


def worst_case_scope(diagnosis: str | None, S: int, B: int) -> WorstCaseScope | None:
    """The bounds of ``diagnosis``'s proved worst case against a finding at
    scheduler block ``S`` and group block ``B`` (None: no bounded worst case)."""
    spec = EXPLAINED.get(diagnosis or "")
    if spec is None or spec.worst_case is None or spec.worst_case_s_max is None:
        return None
    bounds = f"S <= {spec.worst_case_s_max}"
    if S <= spec.worst_case_s_max:
        return WorstCaseScope(bounds, True)
    # (n - R) mod S is at most S - 1, so the closed form is at most S - 1 - B.
    here = (f"at this finding's S = {S} and B = {B} the proved closed form (n - R) mod S - B "
            f"is at most S - 1 - B = {max(0, S - 1 - B)} tokens per call")
    return WorstCaseScope(bounds, False, here)


def _ref(name: str, known: dict[str, Any] | None) -> TheoremRef:
    """The theorem's verdict: from this run's results when it has them, else run now."""
    result = (known or {}).get(name) or run_theorem(theorem(name))
    return TheoremRef(name, result.statement, result.status.value, result.as_expected,
                      round(result.seconds, 3))


def intended_drops(config: CoordinatorConfig, n: int, rows: tuple[GroupRow, ...], *,
                   partial: bool, lookahead: int) -> tuple[str, ...]:
    """Where the spec itself registers fewer than the n computed tokens, and why."""
    out = []
    for row in rows:
        if row.expected_tokens is None or row.expected_tokens >= n:
            continue
        p = inputs_for_group(config, row.group, n, partial=partial, eagle=row.eagle,
                             lookahead=lookahead)
        R = reprefillable_tokens(INT, p)
        reasons = []
        if not partial:
            reasons.append(f"without partial hash hits, hits land on multiples of S = "
                           f"{config.scheduler_block_size}")
        if row.eagle and R:
            reasons.append(f"R = {R} reprefillable tokens are not final (multi-module MTP)")
        out.append(f"group {row.group}: the spec registers {row.expected_tokens} of {n} computed "
                   f"tokens by design ({'; '.join(reasons) or 'EAGLE lookahead clamp'})")
    return tuple(out)


def explain(
    config: CoordinatorConfig,
    n: int | None,
    total_tokens: int | None,
    rows: tuple[GroupRow, ...],
    category: Category,
    diagnosis: str | None,
    *,
    partial: bool,
    lookahead: int,
    known: dict[str, Any] | None = None,
) -> Explanation:
    nature = {Category.UNDER_REGISTRATION: "regression",
              Category.OVER_REGISTRATION: "safety"}.get(category, "other")
    if diagnosis and variant(diagnosis).restriction_text:
        nature = f"historical: right only when {variant(diagnosis).restriction_text}"
    summary = variant(diagnosis).summary if diagnosis else (
        "no model variant reproduces the subject's observations")
    drops = () if n is None else intended_drops(config, n, rows, partial=partial, lookahead=lookahead)
    if diagnosis is None or n is None:
        return Explanation(diagnosis, summary, nature, intended_drop=drops)
    spec = EXPLAINED.get(diagnosis)
    if spec is None:
        # No closed form in the catalog: the refuted conformance theorem and
        # the loss measured at this call are what we know.
        gap = next((r.token_gap for r in rows if r.differs and r.token_gap is not None), None)
        return Explanation(
            diagnosis, summary, nature, loss_observed=gap,
            theorems=(_ref(f"conformance.{diagnosis}", known),), intended_drop=drops)

    row = next(r for r in rows if r.differs and r.token_gap is not None)
    v = group_vars(config, row.group, n, total_tokens, partial=partial, eagle=row.eagle,
                   lookahead=lookahead)
    reach = theorem(spec.reachability)
    reachable = bool(reach.target.fn(INT, v))
    R = reprefillable_tokens(INT, inputs_for_group(config, row.group, n, lookahead=lookahead,
                                                    partial=partial, eagle=row.eagle))
    tail = (n - R) % config.scheduler_block_size
    reach_text = (
        f"{reach.statement}. Here (group {row.group}): partial hits {'on' if partial else 'off'}, "
        f"EAGLE {'yes' if row.eagle else 'no'}, n = {n} > R = {R}: {n > R}, "
        f"(n - R) mod S = {tail} > B = {row.block_size}: {tail > row.block_size} -- "
        f"{'reachable' if reachable else 'not reachable'}"
    )
    theorems = [_ref(spec.reachability, known)]
    if spec.block_reachability:
        theorems.append(_ref(spec.block_reachability, known))
    loss_formula = loss_predicted = worst = None
    if spec.loss:
        loss = theorem(spec.loss)
        loss_formula = f"{loss.target.name} tokens per call where reachable, 0 elsewhere"
        loss_predicted = int(loss.target.fn(INT, v))
        theorems.append(_ref(spec.loss, known))
    scope = None
    if spec.worst_case:
        worst = theorem(spec.worst_case).statement
        theorems.append(_ref(spec.worst_case, known))
        scope = worst_case_scope(diagnosis, config.scheduler_block_size, row.block_size)
    return Explanation(
        diagnosis, summary, nature,
        loss_formula=loss_formula, loss_predicted=loss_predicted, loss_observed=row.token_gap,
        worst_case=worst, worst_case_bounds=scope and scope.bounds,
        worst_case_covers=scope and scope.covers, worst_case_here=scope and scope.here,
        reachability=reach_text, reachable_here=reachable,
        theorems=tuple(theorems), intended_drop=drops,
    )
