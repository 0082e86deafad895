"""A known bug's release range by a targeted search per release
(``diff_tests/ranges.py``): the example and the programs around it, and the
range the releases' answers give beside the one ``model/known.py`` records."""

from __future__ import annotations

from kvspec.diff_tests.ranges import LENGTH_DELTAS, POOL_DELTAS, needed_kinds, release_range, variants
from kvspec.model.engine import EngineProgram, EngineSetup
from kvspec.model.known import KNOWN_BUGS

ESTIMATE = next(b for b in KNOWN_BUGS if b.name == "mamba_estimate_below_allocation_after_connector_load")
ALIGNED = next(b for b in KNOWN_BUGS if b.name == "mamba_align_block_aligned_prompt_replay_state_missing")


def test_the_example_comes_first_then_pools_and_prompt_lengths_around_it():
    example = EngineProgram(EngineSetup(model="toy-nemotron-h", num_gpu_blocks=22),
                            ({"do": "arrive", "id": "r0", "tokens": [1, 2, 3], "max_tokens": 1}, {"do": "step"},
                             {"do": "arrive", "id": "r1", "tokens": [1, 2, 3], "max_tokens": 1}, {"do": "step"}))
    around = variants(example)
    assert around[0] == example and len(around) == len(POOL_DELTAS) * len(LENGTH_DELTAS)
    assert {p.setup.num_gpu_blocks for p in around} == {22 + d for d in POOL_DELTAS}
    lengths = {len(p.ops[0]["tokens"]) for p in around}
    assert lengths == {3 + d for d in LENGTH_DELTAS}
    # The same tokens for every request: a resend stays a resend.
    assert all(p.ops[0]["tokens"] == p.ops[2]["tokens"] for p in around)
    assert all(p.ops[1] == {"do": "step"} for p in around)


def test_the_range_is_the_releases_shown_and_held_against_the_known_entry():
    rows = [{"release": "0.27.1", "status": "not expressible"}, {"release": "0.28.0", "status": "shown"},
            {"release": "0.31.0", "status": "shown"}, {"release": "0.32.0", "status": "not shown"},
            {"release": "0.33.0", "status": "unknown"}]
    found = release_range(rows, ALIGNED)
    assert found["first_shown"] == "0.28.0" and found["last_shown"] == "0.31.0"
    assert found["undecided"] == ["0.27.1", "0.33.0"] and found["not_shown"] == ["0.32.0"]
    assert found["agrees_with_known_entry"] and found["known_entry"] == {"first": "0.23.0", "fixed_in": "0.32.0"}
    # A release the entry says carries it, where the whole search showed nothing: said, for model/known.py.
    found = release_range(rows[:1] + [{"release": "0.30.0", "status": "not shown"}], ALIGNED)
    assert not found["agrees_with_known_entry"] and found["disagrees_on"] == ["0.30.0"]
    assert needed_kinds(ESTIMATE) == frozenset({"mamba_align"}) and needed_kinds(ALIGNED) == frozenset()


def test_each_known_bug_dated_by_a_search_agrees_with_its_record():
    """A known bug whose range a targeted search per release gave names the
    record (with the command that made it), and the entry says what the
    search decided: every release shown is one the entry says carries it,
    every release the whole search held is one it says does not."""
    import json
    from pathlib import Path

    from kvspec.model.about import release_key

    root = Path(__file__).resolve().parents[2]
    searched = [b for b in KNOWN_BUGS if b.range_search]
    assert {b.name for b in searched} >= {ESTIMATE.name, ALIGNED.name, "second_full_attention_group_untrimmed"}
    for bug in searched:
        record = json.loads((root / bug.range_search).read_text())
        assert record["bug"] == bug.name and record["command"].startswith("python -m kvspec.diff_tests.ranges ")
        rows = {r["release"]: r["status"] for r in record["releases"]}
        assert all(bug.carried_by(v) for v, s in rows.items() if s == "shown"), (bug.name, rows)
        assert not any(bug.carried_by(v) for v, s in rows.items() if s == "not shown"), (bug.name, rows)
        assert record["range"]["agrees_with_known_entry"] and rows
        assert sorted(rows, key=release_key) == [r["release"] for r in record["releases"]]
