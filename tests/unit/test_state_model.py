"""model.state: every invariant holds of a consistent state and catches the
one defect it is about (hand-built states, so each test can fail), and
model.program refuses what a worker must never be sent."""

from __future__ import annotations

import attrs
import pytest

from kvspec.model.capabilities import expected_regime
from kvspec.model.case import InvalidCase
from kvspec.model.domain import CoordinatorConfig, KVCacheGroup
from kvspec.model.finding import Category
from kvspec.model.program import Program
from kvspec.model.state import (INVARIANTS, OUT_OF_SCOPE, Block, Lookup, ManagerState, Table, Transition,
                                check_transition, scope_text)

from ..support import capabilities

CONFIG = CoordinatorConfig((KVCacheGroup("full_attention", 2), KVCacheGroup("mamba_align", 4)), 4, 2)
CAPS = capabilities("0.34.0")


def _state(**changes) -> ManagerState:
    """Two requests: r0 holds blocks 1-2 (full attention) and 3 (Mamba); r1
    shares block 1 and holds 4; blocks 1 and 2 are cached; 5-7 are free."""
    base = ManagerState(
        null_block=0, num_free=3, free_queue=(5, 6, 7),
        blocks=(Block(0, 0), Block(1, 2, ("k1",)), Block(2, 1, ("k2",)), Block(3, 1), Block(4, 1),
                Block(5, 0), Block(6, 0), Block(7, 0)),
        hash_map=(("k1", 1), ("k2", 2)),
        tables=(Table("r0", 0, (1, 2), 2), Table("r0", 1, (0, 3)), Table("r1", 0, (1, 4), 1)),
    )
    return attrs.evolve(base, **changes)


def _transition(after: ManagerState, before: ManagerState | None = None, **changes) -> Transition:
    fields = dict(op="schedule", request=None, before=before if before is not None else _state(), after=after,
                  config=CONFIG, regime=expected_regime(CONFIG, CAPS), capabilities=CAPS,
                  running={"r0": 4, "r1": 3})
    fields.update(changes)
    return Transition(**fields)


def _broken(t: Transition) -> set[Category]:
    return {invariant.category for invariant, _ in check_transition(t)}


def test_a_consistent_state_breaks_nothing():
    assert check_transition(_transition(_state())) == []


@pytest.mark.parametrize("after, category", [
    (dict(num_free=2), Category.STATE_FREE_LIST),
    (dict(free_queue=(5, 6, 6), num_free=3), Category.STATE_FREE_LIST),
    (dict(free_queue=(5, 6), num_free=2), Category.STATE_FREE_BLOCKS),  # block 7: no reference, not free
    (dict(free_queue=(4, 5, 6, 7), num_free=4), Category.STATE_FREE_BLOCKS),  # held and free
    (dict(hash_map=(("k1", 1),)), Category.STATE_HASH_MAP),  # block 2 owns k2, the map lost it
    (dict(hash_map=(("k1", 1), ("k2", 2), ("k9", 0))), Category.STATE_HASH_MAP),  # the null block mapped
])
def test_each_pool_defect_is_caught(after, category):
    assert category in _broken(_transition(_state(**after)))


def test_a_reference_count_off_by_one_is_caught():
    blocks = list(_state().blocks)
    blocks[1] = Block(1, 1, ("k1",))  # two tables hold it
    assert Category.STATE_REF_COUNT in _broken(_transition(_state(blocks=tuple(blocks))))


def test_tables_append_only_and_covering():
    changed = _state(tables=(Table("r0", 0, (1, 5), 2), Table("r0", 1, (0, 3)), Table("r1", 0, (1, 4), 1)))
    assert Category.STATE_TABLE_APPEND_ONLY in _broken(_transition(changed))
    nulled = _state(tables=(Table("r0", 0, (1, 2), 2), Table("r0", 1, (0, 0)), Table("r1", 0, (1, 4), 1)))
    # A slot turning null is what sliding-window and Mamba groups do (reference counts aside).
    assert Category.STATE_TABLE_APPEND_ONLY not in _broken(_transition(nulled))
    assert Category.STATE_TABLE_COVERAGE in _broken(_transition(_state(), running={"r0": 5, "r1": 3}))


def test_a_freed_request_must_be_forgotten_by_every_group():
    t = _transition(_state(), op="finish", request="r1", gone=("r1",), running={"r0": 4})
    assert Category.STATE_FORGET in _broken(t)


def test_lookups_are_pure_bounded_and_agree_across_groups():
    ok = Lookup("r2", hit=4, group_blocks=((1, 2), (3,)), num_tokens=9, before=(1,), after=(1,))
    assert _broken(_transition(_state(), lookups=(ok,))) == set()
    impure = attrs.evolve(ok, after=(2,))
    assert Category.STATE_LOOKUP_PURITY in _broken(_transition(_state(), lookups=(impure,)))
    too_long = attrs.evolve(ok, hit=10, group_blocks=((1, 2, 5, 6, 7), (3, 4, 5)))
    assert Category.STATE_HIT_BOUNDS in _broken(_transition(_state(), lookups=(too_long,)))
    extra_block = attrs.evolve(ok, hit=0, group_blocks=((1,), ()))  # the 0.23-0.28 second-group defect
    assert Category.STATE_HIT_GROUPS in _broken(_transition(_state(), lookups=(extra_block,)))
    unregistered = attrs.evolve(ok, group_blocks=((1, 3), (3,)))
    assert Category.STATE_HIT_GROUPS in _broken(_transition(_state(), lookups=(unregistered,)))


def test_reset_leak_and_zeroing():
    idle = _state(tables=(), blocks=tuple(attrs.evolve(b, ref_cnt=0) for b in _state().blocks),
                  free_queue=(1, 2, 3, 4, 5, 6, 7), num_free=7)
    assert Category.STATE_RESET in _broken(_transition(idle, before=idle, op="reset", reset_succeeded=False,
                                                       running={}))
    assert Category.STATE_RESET in _broken(_transition(_state(), op="reset", reset_succeeded=True))
    leaked = attrs.evolve(idle, free_queue=(1, 2, 3, 4, 5, 6), num_free=6)
    assert Category.STATE_LEAK in _broken(_transition(leaked, running={}))
    assert Category.STATE_ZEROING in _broken(_transition(_state(), handed_for_zeroing=(1,)))
    grown = _state(tables=(Table("r0", 0, (1, 2, 5), 2), Table("r0", 1, (0, 3)), Table("r1", 0, (1, 4), 1)))
    assert Category.STATE_ZEROING not in _broken(_transition(grown, handed_for_zeroing=(5,)))


def test_every_invariant_has_its_own_category_and_the_scope_says_what_is_not_checked():
    categories = [i.category for i in INVARIANTS]
    assert len(set(categories)) == len(categories)
    assert all(c.is_state for c in categories)
    text = scope_text()
    assert all(i.name in text for i in INVARIANTS) and all(o in text for o in OUT_OF_SCOPE)


def test_state_round_trips_from_the_worker_shape():
    data = {"null_block": 0, "num_free": 1, "free_queue": [2], "blocks": [[0, 0, []], [1, 1, ["a"]], [2, 0, []]],
            "hash_map": [["a", 1]], "tables": [["r0", 0, [1], 1]]}
    state = ManagerState.from_dict(data)
    assert state.held() == {1: 1} and state.tables_of("r0")[0].blocks == (1,)


@pytest.mark.parametrize("ops, why", [
    ([{"do": "launch"}], "unknown operation"),
    ([{"do": "arrive", "id": "r0; import os", "tokens": [1]}], "plain name"),
    ([{"do": "arrive", "id": "r0", "tokens": ["x"]}], "token ids"),
    ([{"do": "schedule", "budget": -1}], "whole number"),
    ([{"do": "schedule", "drafts": True}], "whole number"),
])
def test_programs_refuse_what_a_worker_must_never_be_sent(ops, why):
    with pytest.raises(InvalidCase, match=why):
        Program(CONFIG, 16, 64, ops)


def test_a_program_round_trips_and_describes_itself():
    program = Program(CONFIG, 16, 64, [{"do": "arrive", "id": "r0", "tokens": [1, 2, 3], "external": 2},
                                        {"do": "schedule", "budget": 8, "drafts": 2, "accepted": 1}], 4)
    again = Program.from_dict(program.as_dict())
    assert again == program
    assert "a connector offers 2 more" in program.describe() and "retention=4" in program.describe()
    with pytest.raises(InvalidCase):
        Program.from_dict({"config": {"groups": "nope"}})
