"""The lookup side, specified once: where a later request's cache hit may land.

Registration (``model.spec``) says how many computed tokens a group hands to
``cache_blocks``; this module says what a later request's
``find_longest_cache_hit`` needs from a group for a hit to land at a point,
so that the two can be checked against each other (the contract: every hit
the lookup can reach finds its blocks, and the tokens it reuses are the
later request's own). Written against ``model.arith.Arith`` like the spec,
so it runs on integers and builds Z3 terms.

Vocabulary (per group, the same ``BoundaryInputs`` as registration):
  * a *landing point* is a hit length the coordinator can return: a
    multiple of ``hit_alignment`` (H under partial hash hits, S otherwise);
  * an EAGLE group matches ``eagle_drop_tail`` tokens past the landing point
    and then drops them so that they are recomputed; the later request
    shares those tokens with the writer (their hashes matched);
  * the tokens a hit at ``landing`` needs this group to have registered
    are ``lookup_need`` = landing (+ the drop tail for an EAGLE group).

The multi-module MTP question of #52419 is stated here too: a position kept
from the writer's cache holds draft-layer KV computed with the writer's
tokens up to ``num_prefill_lookahead`` positions past it (vLLM's own account
of the prefill lookahead); the later request only shares the tokens below
the drop tail, so the reuse is stale exactly when the lookahead reaches past
the tail.
"""

from __future__ import annotations

from typing import Any

from .arith import Arith
from .spec import BoundaryInputs, finalized_tokens, hashed_tokens

__all__ = [
    "hit_alignment",
    "eagle_drop_tail",
    "lookup_need",
    "final_extent",
    "shared_by_hit",
    "draft_dependency_end",
    "stale_draft_reuse",
    "dense_group_hit",
    "dense_lookup_hit",
    "group_reach",
    "hit_blocks",
]


def hit_blocks(ar: Arith, landing: Any, block_size: Any) -> Any:
    """The blocks every group's answer to a hit of ``landing`` tokens holds:
    ``cdiv(landing, block)``, whatever the group's kind (sliding-window and
    Mamba groups pad with null blocks, so one hit is one block count per
    group)."""
    return ar.div(landing + block_size - 1, block_size)


def hit_alignment(ar: Arith, p: BoundaryInputs) -> Any:
    """Hit lengths are multiples of this: the hash block under partial hash
    hits (fine-grained hits), the scheduler block otherwise."""
    return ar.ite(p.partial, p.H, p.S)


def eagle_drop_tail(ar: Arith, p: BoundaryInputs, fine_grained: Any = True) -> Any:
    """Tokens an EAGLE group matches past a landing point and then drops.

    One hash unit for a group that can look up inside its block under partial
    hits (full attention, Mamba), one of its own blocks otherwise.  This is the
    smallest tail: without partial hits the drop is followed by rounding down
    to S, which removes more only when the match was not S-aligned.
    """
    return ar.ite(ar.and_(p.partial, fine_grained, p.B > p.H), p.H, p.B)


def lookup_need(ar: Arith, p: BoundaryInputs, landing: Any, fine_grained: Any = True) -> Any:
    """Tokens of this group a hit at ``landing`` must find registered."""
    return landing + ar.ite(p.eagle, eagle_drop_tail(ar, p, fine_grained), ar.const(0))


def final_extent(ar: Arith, p: BoundaryInputs) -> Any:
    """Tokens whose KV in this group is final after ``n`` computed tokens: an
    EAGLE (draft) group's last reprefillable positions may still be rewritten;
    a target group's KV is final as soon as it is computed."""
    return ar.ite(p.eagle, finalized_tokens(ar, p), p.n)


def shared_by_hit(ar: Arith, p: BoundaryInputs, landing: Any, fine_grained: Any = True) -> Any:
    """Tokens the later request provably shares with the writer after a hit at
    ``landing``: every token this group's matched hashes cover."""
    return lookup_need(ar, p, landing, fine_grained)


def draft_dependency_end(ar: Arith, position: Any, lookahead: Any) -> Any:
    """The last writer token the draft-layer KV at ``position`` was computed
    with: vLLM's drafter reads ``num_prefill_lookahead`` tokens past a
    position (the tokens lookahead block hashes cover)."""
    return position + lookahead


def stale_draft_reuse(ar: Arith, p: BoundaryInputs, landing: Any, fine_grained: Any = True) -> Any:
    """Whether a hit at ``landing > 0`` keeps draft-layer KV that depends on a
    token the later request need not share.

    The last kept position is ``landing - 1``; its draft KV was written with
    the writer's tokens up to ``landing - 1 + L`` (for plain EAGLE, L = 1: the
    next token, which the drop tail always covers).  The later request shares
    the tokens below ``shared_by_hit``.
    """
    last_dependency = draft_dependency_end(ar, landing - 1, p.L)
    return ar.and_(p.eagle, landing > 0,
                   last_dependency >= shared_by_hit(ar, p, landing, fine_grained))


def dense_group_hit(ar: Arith, p: BoundaryInputs, candidate: Any, reach: Any,
                    fine_grained: Any = True) -> Any:
    """The hit one group allows below ``candidate`` when every block below
    ``reach`` tokens is cached and shared (a full-attention group: its cached
    blocks form a prefix): the largest landing point whose need fits, or 0."""
    unit = hit_alignment(ar, p)
    need_past = lookup_need(ar, p, ar.const(0), fine_grained)
    limit = ar.min(candidate, ar.round_down(reach, p.B) - need_past)
    return ar.max(ar.const(0), ar.round_down(ar.max(ar.const(0), limit), unit))


def dense_lookup_hit(ar: Arith, groups: list[BoundaryInputs], reaches: list[Any],
                     max_hit: Any) -> Any:
    """The hit a later request gets when every group is dense: the largest
    landing point at most ``max_hit`` that every group allows."""
    hit = max_hit
    for p, reach in zip(groups, reaches):
        hit = dense_group_hit(ar, p, hit, reach)
    return hit


def group_reach(ar: Arith, registered_tokens: Any, shared_prefix: Any, later_total: Any,
                H: Any) -> Any:
    """Tokens below which a group's blocks are cached *and* match the later
    request: what the writer registered, the shared prefix, and the later
    request's own hashed tokens."""
    return ar.min(registered_tokens, ar.min(shared_prefix, hashed_tokens(ar, later_total, H)))
