"""Theorems of the lookup side: registration against what a hit needs.

Extra symbols: ``j`` (the landing point is ``j`` hit-alignment units, j >= 1)
and ``F`` (the group looks up inside its block under partial hits: full
attention and Mamba; not sliding window).  A hit at a landing point is
*reachable from the writer* when the group registered what it needs
(``lookup_need`` <= the bound) within the writer's hashed tokens.

* ``lookup.*``: the contract of issue 5.  No lost hits (every landing point
  whose need is final and hashed is registered) holds.  No waste (every
  registered block is read by some hit once the writer is done) holds for
  non-EAGLE groups and fails for EAGLE groups at the request's end, by less
  than one scheduler block.
* ``mtp.*``: the multi-module MTP question #52419 left open.  The guard
  ``S >= num_prefill_lookahead`` protects a reused position only when the
  EAGLE drop tail is a whole scheduler block; the tail is the hash block under
  partial hits (and the group's block when B < S), so a hit can keep
  draft-layer KV computed from writer tokens the later request does not
  share, exactly when ``L > drop tail``.  Real vLLM (0.28-0.34, legacy hashes)
  shows stale reuse in exactly those configurations once the writer is
  prefilled as its own scheduler chunks it (``subjects/drivers/mtp.py``): a
  hit lands at ``M - tail`` only where a Mamba state exists, and the prompt
  checkpoint the scheduler materializes is that landing.  (A single-chunk
  writer made no such state and showed whole-block tails only, which is why
  S=4, H=2, L=3, B=4 once looked like a counterexample to this theorem.)
  The impact is on speculative acceptance: draft KV only feeds proposals.
"""

from __future__ import annotations

from typing import Any, Callable

from kvspec.model.arith import INT, Arith
from kvspec.model.lookup import draft_dependency_end, eagle_drop_tail, final_extent, hit_alignment, lookup_need
from kvspec.model.spec import BoundaryInputs, hashed_tokens, registered_full_blocks, registration_bound
from kvspec.model.variants import variant

from .encoding import Vars, decode_geometry, inputs
from .geometry import geometry_theorem
from .lemmas import lemma
from .theorem import Target, Theorem
from .verdict import Status

__all__ = ["LOOKUP_THEOREMS"]

TailRule = Callable[[Arith, BoundaryInputs, Any], Any]

LANDING_TEXT = "landing = j * alignment, j >= 1"
SPEC = Target("spec", registration_bound)


def _rule(name: str) -> Target:
    return Target(name, variant(name).rule)


def _landing(ar: Arith, v: Vars) -> Any:
    return v.j * hit_alignment(ar, inputs(v))


def _need(ar: Arith, v: Vars, tail: TailRule = eagle_drop_tail, landing: Any = None) -> Any:
    p = inputs(v)
    landing = _landing(ar, v) if landing is None else landing
    return landing + ar.ite(v.E, tail(ar, p, v.F), ar.const(0))


def _rounding_hints(ar: Arith, v: Vars) -> list:
    """Floor facts the waste theorems need about n, t and the three block
    sizes (instances of proved lemmas)."""
    hashed = ar.round_down(v.t, v.H)
    facts = [lemma("coarser_round_down").instance(ar, v.t, v.H, v.m * v.k),
             lemma("coarser_round_down").instance(ar, v.t, v.H, v.m),
             lemma("coarser_round_down").instance(ar, v.n, v.H, v.m)]
    for d in (v.H, v.B, v.S):
        facts += [lemma("div_monotone").instance(ar, v.n, v.t, d),
                  lemma("div_monotone").instance(ar, v.n, hashed, d),
                  lemma("div_bounds").instance(ar, v.n, d),
                  lemma("div_bounds").instance(ar, v.t, d),
                  lemma("div_bounds").instance(ar, hashed, d)]
    return facts


def _positive_landing(ar: Arith, v: Vars) -> Any:
    return v.j >= 1


# --- the contract ----------------------------------------------------------------

def _no_lost_hits(ar: Arith, v: Vars, f: Callable) -> Any:
    p = inputs(v)
    need = lookup_need(ar, p, _landing(ar, v), v.F)
    usable = ar.and_(need <= final_extent(ar, p), need <= hashed_tokens(ar, v.t, v.H))
    return ar.implies(usable, f(ar, p) >= need)


def _read_at_the_end(ar: Arith, v: Vars) -> Any:
    """Tokens the longest hit reachable once the writer has computed all ``t``
    tokens reads, rounded up to the group's blocks (a hit inside a block
    reads that block): 0 when no landing point fits."""
    done = inputs(v, n=v.t)
    usable = ar.min(final_extent(ar, done), hashed_tokens(ar, v.t, v.H))
    tail = lookup_need(ar, done, ar.const(0), v.F)
    landing = ar.round_down(ar.max(ar.const(0), usable - tail), hit_alignment(ar, done))
    read = ar.ite(landing >= 1, landing + tail, ar.const(0))
    return ar.div(read + v.B - 1, v.B) * v.B


def _registered(ar: Arith, v: Vars, f: Callable) -> Any:
    return registered_full_blocks(ar, f(ar, inputs(v)), hashed_tokens(ar, v.t, v.H), v.B) * v.B


def _no_waste(ar: Arith, v: Vars, f: Callable) -> Any:
    return _registered(ar, v, f) <= _read_at_the_end(ar, v)


def _non_eagle_no_waste(ar: Arith, v: Vars, f: Callable) -> Any:
    return ar.implies(ar.not_(v.E), _no_waste(ar, v, f))


def _waste_at_most_one_scheduler_block(ar: Arith, v: Vars, f: Callable) -> Any:
    return _registered(ar, v, f) - _read_at_the_end(ar, v) <= v.S


# --- multi-module MTP: draft KV reused past what is shared -------------------------

def _stale(ar: Arith, v: Vars, tail: TailRule, landing: Any) -> Any:
    """The kept position ``landing - 1`` holds draft KV written with the
    writer's tokens up to ``landing - 1 + L``; the later request shares only
    the tokens its matched hashes cover (``landing + tail``)."""
    return ar.and_(v.E, landing >= 1,
                   draft_dependency_end(ar, landing - 1, v.L) >= _need(ar, v, tail, landing))


def _reachable(ar: Arith, v: Vars, tail: TailRule, landing: Any,
               n: Any = None, total: Any = None) -> Any:
    """The writer (``n`` computed tokens of ``total``; the query's own by
    default) registered what the hit needs."""
    n = v.n if n is None else n
    total = v.t if total is None else total
    need = _need(ar, v, tail, landing)
    return ar.and_(need <= registration_bound(ar, inputs(v, n=n)), need <= hashed_tokens(ar, total, v.H))


def _no_stale_reuse(restriction: Callable[[Arith, Vars], Any] | None = None) -> Callable:
    def claim(ar: Arith, v: Vars, tail: TailRule) -> Any:
        landing = _landing(ar, v)
        unsafe = ar.and_(_reachable(ar, v, tail, landing), _stale(ar, v, tail, landing))
        if restriction is not None:
            unsafe = ar.and_(restriction(ar, v), unsafe)
        return ar.not_(unsafe)
    return claim


def _witness_n(ar: Arith, v: Vars) -> Any:
    """A writer long enough to have registered the first landing point's need
    (at most two scheduler blocks): three scheduler blocks past the
    reprefillable tokens, all computed."""
    return 3 * v.S + v.L


def _stale_iff(ar: Arith, v: Vars, condition: Callable) -> Any:
    """Stale reuse at a reachable hit implies ``condition``; ``condition``
    implies a witness: the first landing point, after a long enough writer."""
    landing = _landing(ar, v)
    holds = condition(ar, v)
    only_if = ar.implies(ar.and_(_reachable(ar, v, eagle_drop_tail, landing),
                                 _stale(ar, v, eagle_drop_tail, landing)), holds)
    first = hit_alignment(ar, inputs(v))
    n = _witness_n(ar, v)
    witness = ar.and_(_reachable(ar, v, eagle_drop_tail, first, n=n, total=n),
                      _stale(ar, v, eagle_drop_tail, first))
    return ar.and_(only_if, ar.implies(holds, witness))


def _lookahead_past_tail(ar: Arith, v: Vars) -> Any:
    return ar.and_(v.E, v.L > eagle_drop_tail(ar, inputs(v), v.F))


def _lookahead_past_scheduler_block(ar: Arith, v: Vars) -> Any:
    return ar.and_(v.E, v.L > v.S)


def _lookahead_past_group_block(ar: Arith, v: Vars) -> Any:
    return ar.and_(v.E, v.L > v.B)


def _one_token_tail(ar: Arith, p: BoundaryInputs, fine_grained: Any) -> Any:
    return ar.const(1)


def _hash_block_tail(ar: Arith, p: BoundaryInputs, fine_grained: Any) -> Any:
    return p.H


def _lookahead_hash_extent(ar: Arith, p: BoundaryInputs, fine_grained: Any) -> Any:
    # vLLM 0.33's lookahead block hashes: no drop; the kept block's hash also
    # covers the L tokens after it, so the later request shares them.
    return p.L


def _short_lookahead_hash_extent(ar: Arith, p: BoundaryInputs, fine_grained: Any) -> Any:
    return p.L - 1


def _partial(ar: Arith, v: Vars) -> Any:
    return v.P


def _whole_scheduler_block_tail(ar: Arith, v: Vars) -> Any:
    return ar.and_(ar.not_(v.P), v.B == v.S)


def _reading(values: dict[str, Any]) -> dict[str, Any]:
    """A decoded counterexample in the lookup's words: where the hit lands,
    what the EAGLE group matches and drops, what the writer registered."""
    v = Vars(values)
    p = inputs(v)
    landing = _landing(INT, v)
    tail = eagle_drop_tail(INT, p, v.F) if v.E else 0
    if v.P and v.B > v.H:
        kind = "full attention or Mamba" if v.F else "sliding window (no lookup inside its block)"
    else:
        kind = "any kind"
    lines = [f"group: {kind}, block {v.B}, EAGLE {'yes' if v.E else 'no'}; hits land on multiples of "
             f"{hit_alignment(INT, p)} ({'H: partial hash hits' if v.P else 'S'})",
             f"writer: {v.n} of {v.t} tokens computed; registers {registration_bound(INT, p)} tokens "
             f"({_registered(INT, v, registration_bound) // v.B} full blocks); once it is done, the "
             f"longest hit a later request can reach reads {_read_at_the_end(INT, v)} tokens"]
    if v.E:
        lines.append(f"a hit at {landing} matches {landing + tail} tokens and drops the last {tail}; "
                     f"the later request shares tokens 0..{landing + tail - 1}")
        if v.L:
            lines.append(f"kept position {landing - 1}: its draft KV read the writer's tokens up to "
                         f"{draft_dependency_end(INT, landing - 1, v.L)} (lookahead L = {v.L})")
    config = decode_geometry(values)
    return {"config": config.describe(), "calls": [], "reading": lines}


def _theorem(name: str, category: str, statement: str, claim: Callable, target: Target,
             **kwargs: Any) -> Theorem:
    extra_text = LANDING_TEXT + (f"; {kwargs.pop('extra_text')}" if "extra_text" in kwargs else "")
    return geometry_theorem(name, category, statement, claim, target, extra_ints=("j",),
                            extra_bools=("F",), extra_assume=_positive_landing,
                            extra_text=extra_text, explain=_reading, **kwargs)


TAIL = Target("eagle_drop_tail", eagle_drop_tail)

LOOKUP_THEOREMS: tuple[Theorem, ...] = (
    _theorem("lookup.no_lost_hits", "lookup",
             "every landing point whose need (landing + EAGLE drop tail) is final and hashed is "
             "registered: no hit a later request could get is lost",
             _no_lost_hits, SPEC,
             refuters=(_rule("regression_50062"), _rule("floor_non_eagle_under_partial"),
                       _rule("lookahead_as_condition"))),
    _theorem("lookup.no_waste.non_eagle", "lookup",
             "a non-EAGLE group registers only blocks that some hit reads once the writer is done",
             _non_eagle_no_waste, SPEC, hints=_rounding_hints,
             refuters=(_rule("eagle_rule_everywhere"),)),
    _theorem("lookup.no_waste", "lookup",
             "every registered block is read by some hit once the writer is done (it is not: an "
             "EAGLE group's last blocks can be unreachable when the request ends)",
             _no_waste, SPEC, expected=Status.REFUTED, hints=_rounding_hints,
             no_refuter_reason="expected to be refuted"),
    _theorem("lookup.waste_at_most_one_scheduler_block", "lookup",
             "what no hit ever reads is at most one scheduler block (exactly one when the "
             "scheduler block is a single attention block and the request ends inside it)",
             _waste_at_most_one_scheduler_block, SPEC,
             refuters=(_rule("lookahead_unclamped"), _rule("reprefillable_added"))),
    _theorem("mtp.no_stale_draft_reuse", "mtp",
             "with the guard S >= L, no reachable hit keeps draft KV that depends on a token the "
             "later request does not share (it does not hold)",
             _no_stale_reuse(), TAIL, expected=Status.REFUTED,
             no_refuter_reason="expected to be refuted"),
    _theorem("mtp.no_stale_draft_reuse.partial_hits", "mtp",
             "under partial hash hits, the guard S >= L prevents stale draft-KV reuse (it does not: "
             "hits land on hash blocks and the drop tail is H)",
             _no_stale_reuse(_partial), TAIL, expected=Status.REFUTED,
             no_refuter_reason="expected to be refuted"),
    _theorem("mtp.no_stale_draft_reuse.scheduler_block_tail", "mtp",
             "without partial hits and with B = S (the drop tail is a whole scheduler block), the "
             "guard S >= L prevents stale draft-KV reuse: #52419's justification, where it applies",
             _no_stale_reuse(_whole_scheduler_block_tail), TAIL,
             refuters=(Target("a hash-block tail", _hash_block_tail),
                       Target("a one-token tail", _one_token_tail))),
    _theorem("mtp.lookahead_hashes_prevent_stale_reuse", "mtp",
             "with lookahead block hashes (each hash covers the L tokens after its block; vLLM 0.33's "
             "default, no drop) no hit keeps stale draft KV, and L tokens are needed",
             _no_stale_reuse(), Target("hashes cover L tokens past each block", _lookahead_hash_extent),
             refuters=(Target("hashes cover L - 1 tokens past each block", _short_lookahead_hash_extent),)),
    _theorem("mtp.stale_reuse_reachability", "mtp",
             "a reachable hit reuses stale draft KV iff EAGLE and L > drop tail (H under partial "
             "hits for full attention and Mamba, the group's block B otherwise)",
             _stale_iff, Target("EAGLE and L > drop tail", _lookahead_past_tail),
             refuters=(Target("EAGLE and L > S (what the guard assumes)", _lookahead_past_scheduler_block),
                       Target("EAGLE and L > B", _lookahead_past_group_block))),
)
