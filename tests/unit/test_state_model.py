"""model.state: every invariant holds of a consistent state and catches the
one defect it is about (hand-built states, so each test can fail), and
model.program refuses what a worker must never be sent."""

from __future__ import annotations

from collections import Counter

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvspec.model.capabilities import expected_regime
from kvspec.model.case import InvalidCase
from kvspec.model.domain import CoordinatorConfig, KVCacheGroup
from kvspec.model.finding import Category
from kvspec.model.program import Program
from kvspec.model.replies import OpAnswer, record_of
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
        tables=(Table("r0", 0, (1, 2), 2), Table("r0", 1, (3,)), Table("r1", 0, (1, 4), 1)),
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
    changed = _state(tables=(Table("r0", 0, (1, 5), 2), Table("r0", 1, (3,)), Table("r1", 0, (1, 4), 1)))
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
    # The rule names the group whose blocks miss the hit, by kind (the mechanism, as data).
    (missized,) = [v for i, v in check_transition(_transition(_state(), lookups=(extra_block,)))
                   if i.name == "hit_groups"]
    assert missized.group_kinds == (CONFIG.groups[0].kind,) and "group 0" in missized.message
    unregistered = attrs.evolve(ok, group_blocks=((1, 3), (3,)))
    assert Category.STATE_HIT_GROUPS in _broken(_transition(_state(), lookups=(unregistered,)))



def test_a_connector_lookup_whose_groups_diverged_may_leave_a_lagging_group_short():
    """0.27+ get_computed_blocks_for_connector answers full attention's hit
    while a Mamba group whose states end earlier holds fewer blocks (the
    scheduler reconciles, or the connector's load supplies the state): not a
    hit_groups finding when the worker says the lookup diverged; full
    attention must still hold cdiv(hit, block), and no group more."""
    lagging = Lookup("r2", hit=4, group_blocks=((1, 2), ()), num_tokens=9, before=(1,), after=(1,))
    assert Category.STATE_HIT_GROUPS in _broken(_transition(_state(), lookups=(lagging,)))
    diverged = attrs.evolve(lagging, diverged=True)
    assert Category.STATE_HIT_GROUPS not in _broken(_transition(_state(), lookups=(diverged,)))
    short_attention = attrs.evolve(diverged, group_blocks=((1,), ()))
    assert Category.STATE_HIT_GROUPS in _broken(_transition(_state(), lookups=(short_attention,)))
    too_many = attrs.evolve(diverged, group_blocks=((1, 2), (3, 4)))
    assert Category.STATE_HIT_GROUPS in _broken(_transition(_state(), lookups=(too_many,)))


def test_a_full_attention_group_short_of_the_hit_is_named_by_the_lookup_and_recognised_so():
    """Full attention holding fewer blocks than the hit counts tokens as
    computed without their KV: the rule says how many, and whose hit (the
    connector's per-group lookup takes its deepest group's); each wording is
    the known bug of that lookup, never the second group left untrimmed."""
    from kvspec.model.known import known_bugs

    short = Lookup("r2", hit=4, group_blocks=((1,), (3,)), num_tokens=9, before=(1,), after=(1,))

    def message(lookup):
        (found,) = [v for i, v in check_transition(_transition(_state(), lookups=(lookup,))) if i.name == "hit_groups"]
        return f"state_hit_groups: hit_groups: {found.message}", found.group_kinds

    words, kinds = message(short)
    assert "holds 1 blocks, short of the hit of 4 tokens" in words and "2 tokens counted computed" in words
    assert kinds == (CONFIG.groups[0].kind,)
    assert [b.name for b in known_bugs("0.25.1", Category.STATE_HIT_GROUPS, words)] == [
        "hybrid_lookup_full_attention_short_of_mamba_hit"]
    words, _ = message(attrs.evolve(short, diverged=True))
    assert "short of the connector lookup's hit (its deepest group's) of 4 tokens" in words
    assert [b.name for b in known_bugs("0.26.0", Category.STATE_HIT_GROUPS, words)] == [
        "connector_lookup_takes_deepest_group_hit"]


def test_reset_leak_and_zeroing():
    idle = _state(tables=(), blocks=tuple(attrs.evolve(b, ref_cnt=0) for b in _state().blocks),
                  free_queue=(1, 2, 3, 4, 5, 6, 7), num_free=7)
    assert Category.STATE_RESET in _broken(_transition(idle, before=idle, op="reset", reset_succeeded=False,
                                                       running={}))
    assert Category.STATE_RESET in _broken(_transition(_state(), op="reset", reset_succeeded=True))
    leaked = attrs.evolve(idle, free_queue=(1, 2, 3, 4, 5, 6), num_free=6)
    assert Category.STATE_LEAK in _broken(_transition(leaked, running={}))
    assert Category.STATE_ZEROING in _broken(_transition(_state(), handed_for_zeroing=(1,)))
    grown = _state(tables=(Table("r0", 0, (1, 2, 5), 2), Table("r0", 1, (3,)), Table("r1", 0, (1, 4), 1)))
    assert Category.STATE_ZEROING not in _broken(_transition(grown, handed_for_zeroing=(5,)))


def test_every_invariant_has_its_own_category_and_the_scope_says_what_is_not_checked():
    categories = [i.category for i in INVARIANTS]
    assert len(set(categories)) == len(categories)
    assert all(c.is_state for c in categories)
    text = scope_text()
    assert all(i.name in text for i in INVARIANTS) and all(o in text for o in OUT_OF_SCOPE)


def test_state_is_read_from_the_workers_compact_snapshot():
    # Blocks 2-5 are left out (no reference, no key); the free queue comes as runs,
    # a block queued twice starting a run of its own.
    data = {"null_block": 0, "num_free": 5, "num_blocks": 6, "free_runs": [[2, 5], [5, 5]],
            "blocks": [[1, 1, [7]]], "hash_map": [[7, 1]], "tables": [["r0", 0, [1], 1]]}
    state = ManagerState.from_dict(data)
    assert state.held() == {1: 1} and state.tables_of("r0")[0].blocks == (1,)
    assert state.free_queue == (2, 3, 4, 5, 5) and state.blocks[3] == Block(3, 0)
    assert [i.category for i, _ in check_transition(_transition(state, before=state, running={"r0": 1}))] == [
        Category.STATE_FREE_LIST]


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


def test_a_stateful_finding_renders_and_round_trips():
    """A stateful finding (program, scope, the failing answer) goes through the
    same reports as any other, and says it was made on a program."""
    from kvspec.diff_tests.property import Failure
    from kvspec.diff_tests.stateful import StatefulResult
    from kvspec.model.finding import Finding
    from kvspec.oracles.registration import Discrepancy
    from kvspec.report.finding import render_markdown, render_text
    from kvspec.findings.stateful import stateful_finding

    program = Program(CONFIG, 16, 64, [{"do": "arrive", "id": "r0", "tokens": [1, 2, 3]}, {"do": "schedule"}])
    found = Discrepancy(Category.STATE_HIT_GROUPS, None, None, detail="hit_groups: request r0: group 1 ...")
    result = StatefulResult(subject={"kind": "release", "version": "0.28.0", "label": "vllm 0.28.0"},
                            capabilities=CAPS, seed=1, failure=Failure(program, (found,), {"state": {}}),
                            programs_to_first_failure=3, seconds_to_first_failure=0.2)
    finding = stateful_finding(result, versions={"kvspec": "0"})
    again = Finding.from_dict(finding.to_dict())
    assert Program.from_dict(again.inputs["program"]) == program
    assert "not checked" in again.compared["scope"]
    text, markdown = render_text(again), render_markdown(again)
    assert "arrive r0 (3 tokens)" in text and "state-hit-groups" in text
    assert "own program only" in markdown


@st.composite
def _compact_snapshots(draw):
    """Arbitrary compact snapshots of a small pool, consistent or not."""
    n = draw(st.integers(2, 9))
    ids = st.integers(0, n - 1)
    listed = draw(st.dictionaries(ids, st.tuples(st.integers(-1, 3), st.lists(st.integers(0, 3), max_size=2)),
                                  max_size=n))
    queue = sorted(draw(st.lists(ids, max_size=n + 1)))
    runs = [[i, i] for i in queue]
    tables = draw(st.lists(st.tuples(st.sampled_from(["r0", "r1"]), st.integers(0, 1),
                                     st.lists(ids, max_size=4), st.integers(0, 4)), max_size=3,
                           unique_by=lambda t: t[:2]))
    return {"null_block": 0, "num_free": draw(st.integers(0, n)), "num_blocks": n, "free_runs": runs,
            "blocks": [[i, ref, sorted(set(keys))] for i, (ref, keys) in sorted(listed.items()) if ref or keys],
            "hash_map": draw(st.lists(st.tuples(st.integers(0, 3), ids), max_size=4, unique=True)),
            "tables": [list(t) for t in sorted(tables)]}


@settings(max_examples=500, deadline=None)
@given(_compact_snapshots())
def test_the_pool_rules_read_from_a_compact_snapshot_flag_exactly_the_bad_blocks(data):
    # The rules skip idle blocks by set arithmetic; held against the rules'
    # plain statement over every block of the pool.
    state = ManagerState.from_dict(data)
    ref = {i: 0 for i in range(data["num_blocks"])}
    ref.update({i: r for i, r, _ in data["blocks"]})
    queued = {i for i, _ in data["free_runs"]}
    held = {i: sum(t[2].count(i) for t in data["tables"]) for i in ref}
    blocks = [i for i in ref if i != data["null_block"]]
    free_bad = [i for i in blocks if (ref[i] == 0 and i not in queued) or (ref[i] > 0 and i in queued) or ref[i] < 0]
    count_bad = [i for i in blocks if ref[i] != held[i]]
    found = {name: [int(m.message.split()[1]) for i, m in check_transition(_transition(state, before=state)) if i.name == name]
             for name in ("free_iff_unreferenced", "ref_counts")}
    assert found["free_iff_unreferenced"] == sorted(free_bad)[:3]
    assert found["ref_counts"] == sorted(count_bad)[:3]


def _compact(**changes):
    data = {"null_block": 0, "num_free": 3, "num_blocks": 5, "free_runs": [[2, 4]],
            "blocks": [[1, 1, [7]]], "hash_map": [[7, 1]], "tables": [["r0", 0, [1], 1]]}
    data.update(changes)
    return data


def test_an_unchanged_broken_state_is_still_caught_when_first_seen():
    # The oracle skips a rule over parts the worker sent as "same" only once
    # the state they came from was held to it: a state broken from the start
    # (here a block neither referenced nor free) fails on the first operation.
    from kvspec.oracles.state import StateOracle

    program = Program(CONFIG, 5, 128)
    broken = _compact(num_free=2, free_runs=[[3, 4]])  # block 2: no reference, not free
    oracle = StateOracle(program, CAPS, broken)
    sent = {"result": {}, "running": {"r0": 1}, "waiting": [], "handed_for_zeroing": [],
            "state": {**{k: v for k, v in broken.items() if k not in ("free_runs", "blocks", "hash_map",
                                                                        "tables")},
                      "same": ["free_runs", "blocks", "hash_map", "tables"]}}
    answer, found = oracle.checked({"do": "schedule"}, OpAnswer.parse(sent))
    assert [d.category for d in found] == [Category.STATE_FREE_BLOCKS]
    assert answer.state["free_runs"] == [[3, 4]] and record_of(answer)["state"]["free_runs"] == [[3, 4]]
    assert "same" not in answer.state and "same" in sent["state"]  # the kept answer is made whole, a new one


def test_a_rule_over_unchanged_parts_of_a_checked_state_is_not_run_again():
    state = _state(free_queue=(5, 6), num_free=2)  # block 7 leaked
    again = attrs.evolve(state)  # new object, the same field values (the very objects)
    assert Category.STATE_FREE_BLOCKS in _broken(_transition(again, before=state))
    skipped = check_transition(_transition(again, before=state), before_checked=True)
    assert Category.STATE_FREE_BLOCKS not in {i.category for i, _ in skipped}
    # A part that changed is read again, even with the same values.
    moved = attrs.evolve(state, free_queue=tuple(state.free_queue))
    moved = attrs.evolve(moved, free_queue=tuple(list(state.free_queue)))
    rerun = check_transition(_transition(moved, before=state), before_checked=True)
    assert Category.STATE_FREE_BLOCKS in {i.category for i, _ in rerun}


def test_a_failing_program_is_reduced_to_the_operations_it_needs():
    from kvspec.diff_tests.reduce import reduce_program

    ops = [{"do": "schedule"}, {"do": "arrive", "id": "r0", "tokens": [1, 2]}, {"do": "schedule"},
           {"do": "finish", "id": "r0"}, {"do": "arrive", "id": "r1", "tokens": [3]}, {"do": "reset"},
           {"do": "schedule"}]
    program = Program(CONFIG, 40, 128, tuple(ops))
    seen = []

    def fails(candidate):
        # Stands in for a replay on vLLM: the failure needs r1 to arrive and a step after it.
        seen.append(candidate.ops)
        names = [op.get("id") if op["do"] == "arrive" else op["do"] for op in candidate.ops]
        return "r1" in names and "schedule" in names[names.index("r1"):]

    reduced, reruns = reduce_program(program, fails)
    assert [op["do"] for op in reduced.ops] == ["arrive", "schedule"] and reduced.ops[0]["id"] == "r1"
    assert reruns == len(seen)
    # Dropping an arrival drops what names that request: no candidate finishes r0 without it.
    assert not any({"do": "finish", "id": "r0"} in c and not any(op.get("id") == "r0" and op["do"] == "arrive"
                                                                 for op in c) for c in seen)


def test_with_prefix_caching_off_nothing_is_registered_and_every_lookup_misses():
    off = attrs.evolve(CONFIG, enable_caching=False)
    unkeyed = _state(blocks=tuple(Block(b.id, b.ref_cnt) for b in _state().blocks), hash_map=())
    assert _broken(_transition(unkeyed, before=unkeyed, config=off)) == set()
    # The consistent cached state of the other tests is a defect once caching is off.
    assert Category.STATE_HASH_MAP in _broken(_transition(_state(), config=off))
    miss = Lookup("r2", hit=0, group_blocks=((), ()), num_tokens=9, before=(1,), after=(1,))
    assert _broken(_transition(unkeyed, before=unkeyed, config=off, lookups=(miss,))) == set()
    hit = attrs.evolve(miss, hit=4, group_blocks=((1, 2), (3,)))
    assert Category.STATE_HIT_BOUNDS in _broken(_transition(unkeyed, before=unkeyed, config=off, lookups=(hit,)))


def test_a_fresh_attention_block_on_a_mamba_layout_must_be_handed_out_for_zeroing():
    # CONFIG has a Mamba group, so vLLM zeroes new attention blocks (#51749).
    grown = _state(tables=(Table("r0", 0, (1, 2, 5), 2), Table("r0", 1, (3,)), Table("r1", 0, (1, 4), 1)))
    assert Category.STATE_ZEROING_MISSED in _broken(_transition(grown))
    assert Category.STATE_ZEROING_MISSED not in _broken(_transition(grown, handed_for_zeroing=(5,)))
    # A block a lookup gave the request holds cached data: not zeroed.
    hit = Lookup("r0", hit=6, group_blocks=((1, 2, 5), (3,)), num_tokens=9)
    assert Category.STATE_ZEROING_MISSED not in _broken(_transition(grown, lookups=(hit,)))
    # A request given connector tokens may have its load-bound blocks left alone.
    loaded = Lookup("r0", hit=0, group_blocks=((), ()), num_tokens=9, external=4)
    assert Category.STATE_ZEROING_MISSED not in _broken(_transition(grown, lookups=(loaded,)))
    # Without a Mamba group vLLM zeroes nothing.
    attention_only = CoordinatorConfig((KVCacheGroup("full_attention", 2), KVCacheGroup("sliding_window", 4, sliding_window=4)), 4, 2)
    assert Category.STATE_ZEROING_MISSED not in _broken(_transition(grown, config=attention_only))


def test_a_block_held_by_two_groups_at_once_is_caught():
    assert Category.STATE_ONE_GROUP not in _broken(_transition(_state()))  # r0 and r1 share block 1 in group 0
    aliased = _state(tables=(Table("r0", 0, (1, 2), 2), Table("r0", 1, (3,)), Table("r1", 0, (1, 3), 1)))
    assert Category.STATE_ONE_GROUP in _broken(_transition(aliased))


def test_the_stateful_scope_names_what_the_draw_reaches():
    # The verdict's scope says what programs are drawn from: one-group models
    # of every kind and prefix caching off must really be drawn, and said.
    from hypothesis import HealthCheck, given, settings

    from kvspec.diff_tests.stateful import draw_scope, geometries
    from kvspec.model.domain import GroupKind

    seen: set[str] = set()

    @settings(max_examples=600, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(geometries(CAPS))
    def draw(program):
        groups = program.config.groups
        if len(groups) == 1:
            seen.add(f"one {groups[0].kind.value}")
        if not program.config.enable_caching:
            seen.add("caching off")
            assert not any(g.kind is GroupKind.MAMBA_ALIGN for g in groups)

    draw()
    assert seen == {"one full_attention", "one sliding_window", "one mamba_align", "caching off"}
    scope = draw_scope()
    assert "full attention three times in five, else sliding window or Mamba" in scope
    assert "prefix caching off in one attention-only program in eight" in scope


def test_a_block_evict_blocks_named_must_not_stay_findable():
    """evict_blocks (a failed KV load): every named block, in use or free,
    loses its keys and leaves the map (hand-made transitions)."""
    # Legal: block 2 (held by r0) and block 5 (free, never keyed) evicted; block 2's key gone both ways.
    evicted = _state(blocks=_state().blocks[:2] + (Block(2, 1),) + _state().blocks[3:], hash_map=(("k1", 1),))
    assert check_transition(_transition(evicted, evicted=(2, 5))) == []
    # Broken: block 2 named by evict_blocks keeps its key in the map and on the block.
    broken = _broken(_transition(_state(), evicted=(2,)))
    assert broken == {Category.STATE_EVICTED_FINDABLE}
    # Broken one way only: the block forgot its key, the map still names it (the
    # map rule sees the disagreement too; the eviction rule names the evicted block).
    half = _state(blocks=evicted.blocks)
    found = {(i.name, m.message.split(" was")[0]) for i, m in check_transition(_transition(half, evicted=(2,)))}
    assert ("evicted_unfindable", "block 2") in found
    # Without an evict_blocks call the rule says nothing of keyed blocks.
    assert Category.STATE_EVICTED_FINDABLE not in _broken(_transition(_state()))


# -- free-queue order (vLLM's eviction contract) --------------------------------------

def _pool(queue: tuple[int, ...], keyed: set[int], tables=()) -> ManagerState:
    """Blocks 0-9 on one full-attention group: the queued ones free, ``keyed``
    ones cached, each table slot one reference."""
    held = {b: sum(t.blocks.count(b) for t in tables) for b in range(10)}
    blocks = tuple(Block(i, held[i], (f"k{i}",) if i in keyed else ()) for i in range(10))
    return ManagerState(null_block=0, num_free=len(queue), free_queue=queue, blocks=blocks,
                        hash_map=tuple((f"k{i}", i) for i in sorted(keyed)), tables=tuple(tables))


ONE_GROUP = CoordinatorConfig((KVCacheGroup("full_attention", 2),), 2, 2)


def _order_broken(before: ManagerState, after: ManagerState, **changes) -> bool:
    fields = dict(config=ONE_GROUP, regime=expected_regime(ONE_GROUP, CAPS), running={})
    fields.update(changes)
    return bool(check_transition(_transition(after, before=before, **fields), only=["free_order"]))


def test_allocation_takes_the_queues_head():
    r0 = Table("r0", 0, (5,))
    before = _pool((5, 6, 7), set())
    assert not _order_broken(before, _pool((6, 7), set(), [r0]), running={"r0": 1})
    # Taking the tail (most recently freed) instead breaks LRU eviction.
    assert _order_broken(before, _pool((5, 6), set(), [Table("r0", 0, (7,))]), running={"r0": 1})


def test_a_hit_is_taken_where_it_lies_and_survivors_keep_their_order():
    before = _pool((5, 6, 7, 8), {6})
    hit = Lookup("r0", hit=2, group_blocks=((6,),), num_tokens=3)
    after = _pool((5, 7, 8), {6}, [Table("r0", 0, (6,))])
    assert not _order_broken(before, after, lookups=(hit,), running={"r0": 2})
    # The same queue without a lookup that returned block 6: not a head taken.
    assert _order_broken(before, after, running={"r0": 2})
    # Survivors swapped.
    assert _order_broken(before, _pool((5, 8, 7), {6}, [Table("r0", 0, (6,))]), lookups=(hit,),
                         running={"r0": 2})


def test_a_freed_requests_blocks_join_tail_first():
    r0 = Table("r0", 0, (1, 2, 3), 3)
    before = _pool((5, 6, 7), {1, 2, 3}, [r0])
    freed = dict(op="finish", request="r0", gone=("r0",))
    # Cached blocks join the tail, the table's last block first.
    assert not _order_broken(before, _pool((5, 6, 7, 3, 2, 1), {1, 2, 3}), **freed)
    assert _order_broken(before, _pool((5, 6, 7, 1, 2, 3), {1, 2, 3}), **freed)  # head first
    assert _order_broken(before, _pool((3, 2, 1, 5, 6, 7), {1, 2, 3}), **freed)  # cached ones ahead of the LRU
    assert _order_broken(before, _pool((5, 3, 2, 1, 6, 7), {1, 2, 3}), **freed)  # among the survivors


def test_keyless_freed_blocks_may_join_either_end_but_tail_first():
    r0 = Table("r0", 0, (1, 2, 3))
    before = _pool((5, 6, 7), set(), [r0])
    freed = dict(op="finish", request="r0", gone=("r0",))
    assert not _order_broken(before, _pool((3, 2, 1, 5, 6, 7), set()), **freed)  # 0.26+: reused first
    assert not _order_broken(before, _pool((5, 6, 7, 3, 2, 1), set()), **freed)  # 0.23-0.25
    assert _order_broken(before, _pool((1, 2, 3, 5, 6, 7), set()), **freed)


def test_a_block_shared_with_a_running_request_is_not_freed_with_the_table():
    # r1 still holds block 1: only 3 and 2 reach count 0, in that order.
    r0, r1 = Table("r0", 0, (1, 2, 3), 3), Table("r1", 0, (1, 4), 1)
    before = _pool((5, 6), {1, 2, 3}, [r0, r1])
    after = _pool((5, 6, 3, 2), {1, 2, 3}, [r1])
    assert not _order_broken(before, after, op="finish", request="r0", gone=("r0",), running={"r1": 3})


def test_a_block_taken_and_freed_again_within_one_operation():
    # r0 is given block 5 from the head, then preempted in the same step:
    # 5 comes back (keyless: to the head on 0.26+), 6 and 7 keep their order.
    r0 = Table("r0", 0, (1,))
    before = _pool((5, 6, 7), set(), [r0])
    assert not _order_broken(before, _pool((5, 1, 6, 7), set()), gone=("r0",))
    # With nothing freed, 5 cannot have left and come back: 7 was taken from the tail.
    assert _order_broken(_pool((5, 6, 7), set()), _pool((5, 6), set(), [Table("r1", 0, (7,))]), running={"r1": 1})


def test_the_free_queue_is_read_in_queue_order_from_descending_and_ascending_runs():
    from kvspec.subjects.vllm_side.state_reader import queue_runs

    queue = [5, 4, 3, 7, 8, 9, 9, 2, 1]
    assert queue_runs(queue) == [[5, 3], [7, 9], [9, 9], [2, 1]]
    data = _compact(num_free=9, num_blocks=10, free_runs=queue_runs(queue))
    assert list(ManagerState.from_dict(data).free_queue) == queue


def test_a_mamba_layouts_step_may_take_and_free_a_block_unseen():
    # MambaManager frees, within one allocation, state blocks it took from the
    # head (seen on vLLM 0.28 and 0.34, two-group Mamba layouts): no table shows them.
    mamba = CoordinatorConfig((KVCacheGroup("mamba_align", 2),), 2, 2)
    fields = dict(config=mamba, regime=expected_regime(mamba, CAPS), running={"r0": 1})
    before, after = _pool((5, 6, 7), set()), _pool((5, 7), set(), [Table("r0", 0, (6,))])
    assert not _order_broken(before, after, **fields)
    assert _order_broken(before, after, running={"r0": 1})  # one full-attention group: 5 was passed over


def test_a_block_taken_and_released_at_the_steps_end_may_look_like_a_survivor():
    # vLLM 0.34.0, Mamba "align" + full attention: a step takes 3 and 4 for
    # r0, frees r1's passed-over Mamba state 6 (cached: to the tail), takes 5
    # as a copy-on-write block that gets the source's keys, and releases it at
    # the step's end (cached: to the tail again).  5 looks like a survivor
    # with 6 ahead of it; taken and returned is what explains the queue.
    hybrid = CoordinatorConfig((KVCacheGroup("mamba_align", 2), KVCacheGroup("full_attention", 2)), 2, 2)
    fields = dict(config=hybrid, regime=expected_regime(hybrid, CAPS), running={"r0": 3, "r1": 5})
    r1 = Table("r1", 0, (6, 7))
    before = _pool((3, 4, 5), {5, 6}, [r1])
    after = _pool((6, 5), {5, 6}, [Table("r0", 0, (3,)), Table("r0", 1, (4,)), Table("r1", 0, (0, 7))])
    assert not _order_broken(before, after, **fields)
    # No allocation, no block comes back: a finish putting cached 6 ahead of 5 breaks LRU.
    finish = dict(op="finish", request="r1", gone=("r1",), running={})
    assert _order_broken(_pool((5,), {5, 6}, [Table("r1", 0, (6,))]), _pool((6, 5), {5, 6}), **finish)


# -- the sliding window the next step reads ---------------------------------------------

SWA = CoordinatorConfig((KVCacheGroup("full_attention", 2), KVCacheGroup("sliding_window", 2, sliding_window=4)), 2, 2)


def _window_broken(sliding: tuple[int, ...], computed: int, peak: int = 0) -> bool:
    tables = (Table("r0", 0, tuple(range(10, 10 + _blocks(computed)))), Table("r0", 1, sliding))
    held = Counter(b for t in tables for b in t.blocks if b != 0)
    blocks = tuple(Block(i, held[i]) for i in range(30))
    after = ManagerState(null_block=0, num_free=0, free_queue=(), blocks=blocks, hash_map=(), tables=tables)
    t = _transition(after, before=after, config=SWA, regime=expected_regime(SWA, CAPS), running={"r0": computed},
                    peaks={"r0": peak} if peak else {})
    return bool(check_transition(t, only=["window_held"]))


def _blocks(tokens: int) -> int:
    return -(-tokens // 2)


def test_a_sliding_window_table_holds_the_window_the_next_step_reads():
    # Window 4, block 2, 7 computed: the next token (position 7) reads 4..7,
    # slots 2 and 3; vLLM may have freed slots 0 and 1 (skipped tokens 0..3).
    assert not _window_broken((0, 0, 21, 22), 7)
    assert _window_broken((0, 0, 0, 22), 7)  # slot 2 freed one block too early
    assert _window_broken((0, 0, 21), 7)  # slot 3 missing
    assert not _window_broken((20, 0, 21, 22), 7)  # freeing late is not checked


def test_the_window_is_the_one_of_the_most_tokens_the_request_had_computed():
    # 5 computed now, 9 before a rollback: vLLM may have freed for 9 (slots 0..2).
    assert not _window_broken((0, 0, 0), 5, peak=9)
    assert _window_broken((0, 0, 0), 5)


def test_the_oracle_carries_a_requests_peak_until_it_stops_running():
    from kvspec.oracles.state import StateOracle

    def state(sliding):
        fa, held = list(range(10, 15)), [b for b in sliding if b]
        blocks = [[b, 1, []] for b in fa + held]
        return {"null_block": 0, "num_free": 0, "num_blocks": 30, "free_runs": [], "blocks": blocks,
                "hash_map": [], "tables": [["r0", 0, fa, 0], ["r0", 1, list(sliding), 0]]}

    def window_alarm(oracle, op, computed, sliding, preempted=()):
        answer = {"result": {"preempted": list(preempted)}, "running": {"r0": computed}, "waiting": [],
                  "handed_for_zeroing": [], "state": state(sliding)}
        return [d for d in oracle.check(op, OpAnswer.parse(answer)) if d.category is Category.STATE_WINDOW]

    oracle = StateOracle(Program(SWA, 30, 128), CAPS, state((0, 0, 0, 23, 24)))
    assert not window_alarm(oracle, {"do": "schedule"}, 9, (0, 0, 0, 23, 24))
    # Truncated to 5 (a failed load): slots 1-2 were freed for 9, legitimately.
    assert not window_alarm(oracle, {"do": "evict", "id": "r0"}, 5, (0, 0, 0, 23, 24))
    # Preempted and running again within the step: its peak starts over at 5.
    assert window_alarm(oracle, {"do": "schedule"}, 5, (0, 0, 0, 23, 24), preempted=["r0"])


def _mamba_broken(slots: tuple[int, ...], computed: int, peak: int | None = None) -> bool:
    """One request on a Mamba group of block 4 (blocks 1-3 real, 0 null)."""
    config = CoordinatorConfig((KVCacheGroup("mamba_align", 4),), 4, 4)
    blocks = tuple(Block(i, 1 if i in slots and i else 0) for i in range(4))
    free = tuple(i for i in range(1, 4) if i not in slots)
    after = ManagerState(null_block=0, num_free=len(free), free_queue=free, blocks=blocks, hash_map=(),
                         tables=(Table("r0", 0, slots),))
    t = _transition(after, before=after, config=config, regime=expected_regime(config, CAPS),
                    running={"r0": computed}, peaks={"r0": peak} if peak else {})
    return bool(check_transition(t, only=["mamba_state_held"]))


def test_a_mamba_table_holds_the_block_of_the_running_state():
    # Block 4: 9 computed tokens keep their state in slot 2 (tokens 8..11);
    # the slots before it may have been freed (null) once the state moved on.
    assert not _mamba_broken((0, 0, 3), 9)
    assert not _mamba_broken((0, 0, 3), 12)
    assert _mamba_broken((0, 3, 0), 9)  # the state's block freed, an old one kept
    assert _mamba_broken((0, 3), 9)  # the state's slot missing
    assert not _mamba_broken((0, 3), 8)  # 8 tokens: slot 1
    # A count that fell (a failed load) is not checked: the slot lies in what was allocated for more.
    assert not _mamba_broken((0, 0, 3), 5, peak=9)
    assert _mamba_broken((0, 0, 3), 5)


def test_a_failure_met_but_not_reported_by_hypothesis_is_a_flaky_finding():
    """A run whose machine met a violation and whose Hypothesis test then
    ended without raising (its replay passed) is never a clean run: the
    first failure met is the finding, marked flaky."""
    from kvspec.diff_tests.property import Failure
    from kvspec.diff_tests.stateful import StatefulResult, run_machine_test
    from kvspec.oracles.registration import Discrepancy

    program = Program(CONFIG, 16, 64, [{"do": "arrive", "id": "r0", "tokens": [1, 2, 3]}, {"do": "schedule"}])
    found = Discrepancy(Category.STATE_HIT_GROUPS, None, None, detail="hit_groups: request r0: group 1 ...")
    met = [Failure(program, (found,), {"state": {}})]
    result = StatefulResult(subject={"kind": "release", "version": "0.28.0", "label": "vllm 0.28.0"},
                            capabilities=CAPS, seed=1)
    run_machine_test(lambda: None, result, met)
    assert result.failure is not None and result.failure.flaky and result.failure.case == program
    clean = StatefulResult(subject=result.subject, capabilities=CAPS, seed=1)
    run_machine_test(lambda: None, clean, [])
    assert clean.failure is None
