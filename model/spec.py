"""The registration boundary, specified once.

``registration_bound`` is *the* specification; everything else in kvspec
(proofs, oracles, reports) evaluates this one function, on integers or as Z3
terms.  It is written against ``model.arith.Arith`` only: no Python ``if``,
``min``, ``max`` or ``//`` touches a value.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs

from .arith import INT, Arith
from .domain import CoordinatorConfig, GroupRegistration

__all__ = [
    "BoundaryInputs",
    "RegistrationRule",
    "RegistrationSteps",
    "RuleSteps",
    "SPEC_STEPS",
    "StepsRule",
    "registration_steps",
    "registration_bound",
    "matchable_prefix",
    "finalized_tokens",
    "reprefillable_tokens",
    "registered_full_blocks",
    "hashed_tokens",
    "inputs_for_group",
    "evaluate_config",
]


@attrs.define
class BoundaryInputs:
    """Everything one group's bound depends on, as ints/bools or Z3 terms.

    n: computed tokens (``num_computed_tokens``); S: ``scheduler_block_size``;
    H: ``hash_block_size``; B: the group manager's ``block_size``;
    L: ``num_prefill_lookahead``; eagle: the manager's ``use_eagle``;
    partial: the coordinator's ``enable_partial_hash_hits``.
    """

    n: Any
    S: Any
    H: Any
    B: Any
    L: Any
    eagle: Any
    partial: Any


RegistrationRule = Callable[[Arith, BoundaryInputs], Any]


def reprefillable_tokens(ar: Arith, p: BoundaryInputs) -> Any:
    """Tokens multi-module MTP may prefill again: ``max(0, L - 1)``."""
    return ar.max(ar.const(0), p.L - 1)


def finalized_tokens(ar: Arith, p: BoundaryInputs) -> Any:
    """Computed tokens whose KV is final (not re-prefillable)."""
    return ar.max(ar.const(0), p.n - reprefillable_tokens(ar, p))


def matchable_prefix(ar: Arith, x: Any, p: BoundaryInputs) -> Any:
    """Largest prefix of ``x`` tokens a future cache hit could match.

    Without partial hash hits, hits land on scheduler-block boundaries.  With
    them there is no rounding at all: every token is a potential boundary for
    registration purposes (rounding even to the hash block would re-register a
    Mamba tail that copy-on-write has made private).
    """
    registration_unit = ar.ite(p.partial, ar.const(1), p.S)
    return ar.round_down(x, registration_unit)


@attrs.frozen
class RegistrationSteps:
    """The named intermediate values of one group's bound: the derivation a
    report shows beside the number (cached, finalized, aligned(finalized),
    the EAGLE bound, which branch applies, the bound)."""

    cached: Any
    finalized: Any
    aligned_finalized: Any
    eagle_bound: Any
    eagle_branch: Any
    bound: Any


StepsRule = Callable[[Arith, BoundaryInputs], RegistrationSteps]


def eagle_lookahead(ar: Arith, finalized: Any, aligned_finalized: Any, p: BoundaryInputs) -> Any:
    """An EAGLE group's bound: one block past the matchable boundary of its
    finalized tokens, never past them (``min(finalized, aligned + B)``)."""
    return ar.min(finalized, aligned_finalized + p.B)


def eagle_branch_applies(ar: Arith, p: BoundaryInputs, cached: Any) -> Any:
    """The EAGLE bound applies to an EAGLE group once a boundary is matchable."""
    return ar.and_(p.eagle, cached > 0)


def non_eagle_bound(ar: Arith, p: BoundaryInputs, cached: Any) -> Any:
    """Any other group registers the matchable prefix itself."""
    return cached


@attrs.frozen
class RuleSteps:
    """The rule's steps, each a function of its own.  The specification is
    ``SPEC_STEPS``; a wrong variant (``model.variants``) replaces exactly one
    step, so it models exactly one mistake and the rest stays the spec's."""

    matchable: Callable[[Arith, Any, BoundaryInputs], Any] = matchable_prefix
    # How the finalized tokens are aligned; None: the same ``matchable`` step.
    matchable_finalized: Callable[[Arith, Any, BoundaryInputs], Any] | None = None
    finalized: Callable[[Arith, BoundaryInputs], Any] = finalized_tokens
    eagle_bound: Callable[[Arith, Any, Any, BoundaryInputs], Any] = eagle_lookahead
    applies: Callable[[Arith, BoundaryInputs, Any], Any] = eagle_branch_applies
    non_eagle: Callable[[Arith, BoundaryInputs, Any], Any] = non_eagle_bound


SPEC_STEPS = RuleSteps()


def registration_steps(ar: Arith, p: BoundaryInputs, steps: RuleSteps = SPEC_STEPS) -> RegistrationSteps:
    """How many of the computed tokens this group registers in the hash map.

    Intent: register the largest prefix a future hit could match.  An EAGLE
    group matches one block past a hit boundary and then drops it, so it also
    registers that one lookahead block -- but never past the finalized tokens,
    and only once there is a matchable boundary at all.
    """
    cached = steps.matchable(ar, p.n, p)
    finalized = steps.finalized(ar, p)
    aligned_finalized = (steps.matchable_finalized or steps.matchable)(ar, finalized, p)
    eagle_bound = steps.eagle_bound(ar, finalized, aligned_finalized, p)
    eagle_branch = steps.applies(ar, p, cached)
    return RegistrationSteps(cached, finalized, aligned_finalized, eagle_bound, eagle_branch,
                             ar.ite(eagle_branch, eagle_bound, steps.non_eagle(ar, p, cached)))


def registration_bound(ar: Arith, p: BoundaryInputs) -> Any:
    """The specification: the bound of ``registration_steps``."""
    return registration_steps(ar, p).bound


def hashed_tokens(ar: Arith, total_tokens: Any, H: Any) -> Any:
    """Tokens covered by the request's block hashes (whole hash blocks)."""
    return ar.round_down(total_tokens, H)


def registered_full_blocks(ar: Arith, tokens_to_cache: Any, hashed: Any, B: Any) -> Any:
    """Full blocks of size ``B`` a manager registers for a bound of
    ``tokens_to_cache``: only blocks whose tokens are all hashed count."""
    return ar.div(ar.min(tokens_to_cache, hashed), B)


def inputs_for_group(
    config: CoordinatorConfig,
    group: int,
    n: int,
    *,
    partial: bool | None = None,
    eagle: bool | None = None,
    lookahead: int | None = None,
) -> BoundaryInputs:
    """Concrete inputs of one group of ``config`` after ``n`` computed tokens.

    The regime, EAGLE flag and lookahead come from the configuration's own
    derivation unless a caller that knows better (a subject without partial
    hits, say) overrides them explicitly.
    """
    return BoundaryInputs(
        n=n,
        S=config.scheduler_block_size,
        H=config.hash_block_size,
        B=config.groups[group].block_size,
        L=config.num_prefill_lookahead if lookahead is None else lookahead,
        eagle=config.effective_eagle[group] if eagle is None else eagle,
        partial=config.partial_hash_hits if partial is None else partial,
    )


def evaluate_config(
    config: CoordinatorConfig,
    n: int,
    total_tokens: int,
    rule: RegistrationRule = registration_bound,
    *,
    steps: StepsRule | None = None,
    partial: bool | None = None,
    eagle: tuple[bool, ...] | None = None,
    lookahead: int | None = None,
    hashed: int | None = None,
) -> tuple[GroupRegistration, ...]:
    """Per-group registration of ``rule`` at one ``cache_blocks(n)`` call.

    The derivation is filled in when the rule's steps are known: the spec's
    own, or ``steps`` (which then defines the bound and ``rule`` is unused).
    ``hashed``: the tokens the request's block hashes cover, when known (under
    lookahead block hashes they stop ``num_hash_lookahead_tokens`` short of
    the request's tokens); else every whole hash block of ``total_tokens``.
    """
    if not 0 <= n <= total_tokens:
        raise ValueError(f"need 0 <= n <= total_tokens, got n={n}, total={total_tokens}")
    if steps is None and rule is registration_bound:
        steps = registration_steps
    results = []
    hashed = hashed_tokens(INT, total_tokens if hashed is None else hashed, config.hash_block_size)
    for i, group in enumerate(config.groups):
        p = inputs_for_group(config, i, n, partial=partial, lookahead=lookahead,
                             eagle=None if eagle is None else eagle[i])
        derivation = None if steps is None else steps(INT, p)
        bound = rule(INT, p) if derivation is None else derivation.bound
        results.append(
            GroupRegistration(
                group=i,
                tokens_to_cache=bound,
                registered_full_blocks=registered_full_blocks(INT, bound, hashed, group.block_size),
                eagle=bool(p.eagle),
                cached=None if derivation is None else derivation.cached,
                finalized=None if derivation is None else derivation.finalized,
                aligned_finalized=None if derivation is None else derivation.aligned_finalized,
                eagle_bound=None if derivation is None else derivation.eagle_bound,
                eagle_branch=None if derivation is None else bool(derivation.eagle_branch),
            )
        )
    return tuple(results)
