"""A known bug's release range by a targeted search per release
(``diff_tests/ranges.py``): the example and the programs around it, and the
range the releases' answers give beside the one ``model/known.py`` records."""

from __future__ import annotations

from kvspec.diff_tests.ranges_manager import ENGINE_LEVEL, MANAGER_LEVEL
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
        # Where kvspec built the KVCacheConfig, the record and every row say so (never engine reach).
        level = record.get("level", ENGINE_LEVEL)
        assert level in (ENGINE_LEVEL, MANAGER_LEVEL)
        assert all(r.get("level", ENGINE_LEVEL) == level for r in record["releases"]), bug.name
        assert sorted(rows, key=release_key) == [r["release"] for r in record["releases"]]


FIXTURES = __import__("pathlib").Path(__file__).resolve().parents[1] / "fixtures"


def test_the_example_file_says_the_level_it_is_searched_at():
    """An engine program is searched through the engine; a stateful program
    or a registration/lookup case, whose KVCacheConfig kvspec built, at the
    manager level (``diff_tests/ranges_manager.py``); a stored finding names
    either."""
    import json

    from kvspec.diff_tests.ranges import read_example
    from kvspec.model.case import Case
    from kvspec.model.program import Program

    assert isinstance(read_example(FIXTURES / "program_engine_second_full_attention_group.json"), EngineProgram)
    assert isinstance(read_example(FIXTURES / "program_sliding_window_not_zeroed.json"), Program)
    assert isinstance(read_example(FIXTURES / "case_sliding_window_partial_hit_assertion.json"), Case)
    finding = FIXTURES / "finding_engine_mamba_estimate_0.34.0.json"
    assert isinstance(read_example(finding), EngineProgram) and "inputs" in json.loads(finding.read_text())


def test_a_stateful_programs_variants_are_its_pools_and_prompt_lengths():
    import json

    from kvspec.diff_tests.ranges_manager import program_variants
    from kvspec.model.program import Program

    example = Program.from_dict(json.loads(
        (FIXTURES / "program_external_blocks_evict_a_later_groups_hit.json").read_text()))
    around = program_variants(example, POOL_DELTAS, LENGTH_DELTAS)
    assert around[0] == example and len(around) == len(POOL_DELTAS) * len(LENGTH_DELTAS)
    assert {p.num_blocks for p in around} == {example.num_blocks + d for d in POOL_DELTAS}
    assert all(p.config == example.config and len(p.ops) == len(example.ops) for p in around)
    arrivals = [i for i, op in enumerate(example.ops) if op["do"] == "arrive"]
    for program in around:
        # One length change for every prompt: a resend stays a resend, connector tokens within the prompt.
        changes = {len(program.ops[i]["tokens"]) - len(example.ops[i]["tokens"]) for i in arrivals
                   if len(example.ops[i]["tokens"]) > 1}
        assert len(changes) == 1
        assert all(op.get("external", 0) <= len(op["tokens"]) for op in program.ops if op["do"] == "arrive")
    r4 = [op for op in around[-1].ops if op.get("id") in ("r4", "r6")]
    assert r4[0]["tokens"] == r4[1]["tokens"]


def test_a_cases_variants_are_its_prompt_lengths_only():
    """A case's pool follows from its context: its variants change the last
    prefill chunk, and a probe shares no more than the writer holds."""
    import json

    from kvspec.diff_tests.ranges_manager import CASE_SEARCH_CASES, searched_cases, case_variants
    from kvspec.model.case import Case

    example = Case.from_dict(json.loads(
        (FIXTURES / "case_second_full_attention_group_untrimmed_per_request.json").read_text()))
    around = case_variants(example, LENGTH_DELTAS)
    assert around[0] == example
    assert [c.prompt_len for c in around] == [1, 2, 17]  # a one-token prompt keeps its token
    assert all(c.config == example.config and c.probe is not None and c.probe.shared <= c.writer_tokens
               for c in around)
    assert all(c.steps[1:] == example.steps[1:] for c in around)
    # The targeted search: the same requests on every run, on the example's configuration, probed as it is.
    searched = searched_cases(example)
    assert searched == searched_cases(example) and len(searched) == CASE_SEARCH_CASES
    assert all(c.config == example.config and c.probe is not None for c in searched)
