"""The lookup model (``model/lookup.py``): both backends agree, and the rules
say what vLLM's lookup is documented to do on hand-worked geometries."""

from __future__ import annotations

import attrs
import pytest
import z3
from hypothesis import given, settings, strategies as st

from kvspec.model.arith import INT, Z3Arith
from kvspec.model.domain import CoordinatorConfig, GroupKind, KVCacheGroup
from kvspec.model.lookup import (dense_group_hit, eagle_drop_tail, final_extent, group_reach, hit_alignment,
                          lookup_need, stale_draft_reuse)
from kvspec.model.spec import BoundaryInputs
from kvspec.model.case import Case, LookupProbe, decode, prefill
from kvspec.model.requests import case_message

from tests.support import boundary_inputs


def _symbolic(p: BoundaryInputs, ctx) -> BoundaryInputs:
    return BoundaryInputs(
        n=z3.IntVal(p.n, ctx), S=z3.IntVal(p.S, ctx), H=z3.IntVal(p.H, ctx),
        B=z3.IntVal(p.B, ctx), L=z3.IntVal(p.L, ctx),
        eagle=z3.BoolVal(p.eagle, ctx), partial=z3.BoolVal(p.partial, ctx))


def _value(term):
    term = z3.simplify(term)
    if z3.is_bool(term):
        assert z3.is_true(term) or z3.is_false(term), term
        return z3.is_true(term)
    assert z3.is_int_value(term), f"did not reduce to a numeral: {term}"
    return term.as_long()


RULES = {
    "hit_alignment": lambda ar, p, j, r, f: hit_alignment(ar, p),
    "eagle_drop_tail": lambda ar, p, j, r, f: eagle_drop_tail(ar, p, f),
    "lookup_need": lambda ar, p, j, r, f: lookup_need(ar, p, j * hit_alignment(ar, p), f),
    "final_extent": lambda ar, p, j, r, f: final_extent(ar, p),
    "stale_draft_reuse": lambda ar, p, j, r, f: stale_draft_reuse(ar, p, j * hit_alignment(ar, p), f),
    "dense_group_hit": lambda ar, p, j, r, f: dense_group_hit(ar, p, j * p.S, r, f),
    "group_reach": lambda ar, p, j, r, f: group_reach(ar, r, p.n, j + r, p.H),
}


@pytest.mark.parametrize("name", sorted(RULES))
@settings(max_examples=60, deadline=None)
@given(p=boundary_inputs(), j=st.integers(0, 12), reach=st.integers(0, 200), fine=st.booleans())
def test_backends_agree_on_the_lookup_rules(name, p, j, reach, fine):
    rule = RULES[name]
    ar = Z3Arith()
    symbolic = rule(ar, _symbolic(p, ar.ctx), z3.IntVal(j, ar.ctx), z3.IntVal(reach, ar.ctx),
                    z3.BoolVal(fine, ar.ctx))
    assert _value(symbolic) == rule(INT, p, j, reach, fine)


def _p(S, H, B, *, eagle=False, partial=False, L=0, n=0):
    return BoundaryInputs(n=n, S=S, H=H, B=B, L=L, eagle=eagle, partial=partial)


def test_hits_land_on_hash_blocks_only_under_partial_hits():
    # #52419: partial hash hits let a hit end inside a scheduler block.
    assert hit_alignment(INT, _p(16, 4, 16, partial=True)) == 4
    assert hit_alignment(INT, _p(16, 4, 16, partial=False)) == 16


def test_eagle_drop_tail_is_one_hash_unit_for_fine_grained_groups():
    # Under partial hits a full-attention EAGLE group drops one hash block
    # past the landing point, not one of its own (larger) blocks.
    assert eagle_drop_tail(INT, _p(16, 4, 16, eagle=True, partial=True)) == 4
    # A sliding-window group cannot look up inside its block: a whole block.
    assert eagle_drop_tail(INT, _p(16, 4, 16, eagle=True, partial=True), fine_grained=False) == 16
    # Without partial hits, one of the group's blocks.
    assert eagle_drop_tail(INT, _p(16, 4, 8, eagle=True, partial=False)) == 8
    # A non-EAGLE group needs exactly the landing point.
    assert lookup_need(INT, _p(16, 4, 16, partial=True), 12) == 12
    assert lookup_need(INT, _p(16, 4, 16, eagle=True, partial=True), 12) == 16


def test_dense_group_hit_is_the_largest_landing_point_that_fits():
    # B=8, S=16, no partial hits: 40 cached tokens -> 5 blocks -> hit 32.
    assert dense_group_hit(INT, _p(16, 4, 8), 1000, 40) == 32
    # An EAGLE group also needs its drop tail: 40 -> round to 40, minus 8 -> 32 -> 32.
    assert dense_group_hit(INT, _p(16, 4, 8, eagle=True), 1000, 39) == 16
    # The candidate caps the hit; nothing cached gives 0, never negative.
    assert dense_group_hit(INT, _p(16, 4, 8), 16, 40) == 16
    assert dense_group_hit(INT, _p(16, 4, 8, eagle=True), 1000, 0) == 0


def test_stale_reuse_is_a_lookahead_past_the_drop_tail():
    # Tail 4 (partial hits, H=4): a lookahead of 4 still only reads shared
    # tokens (landing-1+4 < landing+4); 5 would read one the later request
    # need not share.
    p = _p(16, 4, 16, eagle=True, partial=True, L=4)
    assert not stale_draft_reuse(INT, p, 12)
    assert stale_draft_reuse(INT, _p(16, 4, 16, eagle=True, partial=True, L=5), 12)
    # No hit, nothing reused; a target group holds no draft KV.
    assert not stale_draft_reuse(INT, _p(16, 4, 16, eagle=True, partial=True, L=5), 0)
    assert not stale_draft_reuse(INT, _p(16, 4, 16, partial=True, L=5), 12)


def _config():
    return CoordinatorConfig(groups=(KVCacheGroup(GroupKind.FULL_ATTENTION, 4),
                                     KVCacheGroup(GroupKind.FULL_ATTENTION, 8)),
                             scheduler_block_size=8, hash_block_size=4)


def test_a_probe_cannot_share_more_than_the_writer_has():
    writer = Case(_config(), 10, (prefill(10), decode(2, 2)))
    assert writer.writer_tokens == 10 + 1 + 3  # prompt, first output, a decode with 2 accepted
    Case(_config(), 10, (prefill(10), decode(2, 2)), LookupProbe(14, 3))
    with pytest.raises(ValueError, match="shares 15 tokens"):
        Case(_config(), 10, (prefill(10), decode(2, 2)), LookupProbe(15, 1))
    with pytest.raises(ValueError):
        LookupProbe(3, 0)


def test_a_probe_survives_the_round_trip_and_is_described():
    case = Case(_config(), 10, (prefill(10),), LookupProbe(9, 2))
    assert Case.from_dict(case.as_dict()) == case
    assert case_message(case)["probe"] == {"shared": 9, "extra": 2}
    assert case.describe().endswith("then lookup(shared=9, extra=2)")
    assert "probe" not in case_message(Case(_config(), 10, (prefill(10),)))


def test_the_reducer_keeps_the_probe_within_a_shorter_writer():
    from kvspec.diff_tests.reduce import reduce_case

    case = Case(_config(), 12, (prefill(6), prefill(6), decode(), decode()), LookupProbe(14, 5))
    # "Fails" whenever the later request shares at least 8 tokens: the minimum
    # keeps a probe, shrunk to the failing threshold, inside its writer.
    smallest, _ = reduce_case(case, lambda c: c.probe is not None and c.probe.shared >= 8)
    assert smallest.probe == LookupProbe(8, 1)
    assert smallest.probe.shared <= smallest.writer_tokens
    assert smallest.prompt_len <= case.prompt_len


def test_every_group_answers_one_hit_with_cdiv_blocks():
    from kvspec.model.lookup import hit_blocks
    from kvspec.oracles.lookup import group_block_violations

    assert [hit_blocks(INT, h, 4) for h in (0, 1, 4, 5)] == [0, 1, 1, 2]
    config = CoordinatorConfig((KVCacheGroup(GroupKind.FULL_ATTENTION, 1), KVCacheGroup(GroupKind.FULL_ATTENTION, 2),
                                KVCacheGroup(GroupKind.SLIDING_WINDOW, 1, sliding_window=1)), 2, 1)
    case = Case(config, 3, (prefill(3),), LookupProbe(3, 1))
    assert group_block_violations(case, 2, [2, 1, 2]) == []
    # 0.23-0.28: the second full-attention group keeps a block past a hit of 0.
    (found,) = group_block_violations(case, 0, [0, 1, 0])
    assert found.startswith("group 1 (full_attention(block 2)) holds 1 blocks for a hit of 0")
    assert group_block_violations(case, 0, None) == []  # a reply that does not say
    dcp = attrs.evolve(case, config=attrs.evolve(config, dcp_world_size=2))
    assert group_block_violations(dcp, 0, [0, 1, 0]) == []  # a manager's block is not the spec's under DCP
