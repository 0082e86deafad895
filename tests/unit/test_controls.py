"""A recorded control run is reused only when everything it depended on is
unchanged, only when it was clean, and every output says it was reused."""

from __future__ import annotations

import attrs
import pytest

from kvspec.controls import add_database_state, database_state, is_control, recall, remember
from kvspec.diff_tests.fuzz import FuzzResult
from kvspec.diff_tests.property import Tally
from kvspec.model.outcome import Outcome
from kvspec.report.fuzz import fuzz_document, render_markdown
from kvspec.subjects.subject import mutant_subject, release
from kvspec.usecases.fuzz import FuzzRun, FuzzSettings, SubjectRun

from tests.support import capabilities

KEY = {"layout": 1, "release": "0.33.0", "differential": "registration", "seed": 0, "max_examples": 2000,
       "jobs": 1, "hash_schemes": ["legacy"], "include_known": False, "versions": {"kvspec": "0.1.0"},
       "kvspec_code": "c0de", "runtime": "/rt/python", "tree": "7ree"}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSPEC_CACHE", str(tmp_path / "cache"))


def _clean() -> FuzzResult:
    return FuzzResult(subject={"label": "vllm 0.33.0", "vllm_version": "0.33.0"},
                      capabilities=capabilities("0.33.0"), seed=0,
                      tally=Tally(examples=2000, cases=53832, calls=213714, deployment_cases=2225),
                      seconds=36.0, hash_schemes=("legacy",), schemes_left_out=("lookahead",),
                      deployment_configs=15)


def test_only_a_release_beside_its_own_mutant_is_a_control():
    subjects = [release("0.33.0"), release("0.34.0"), mutant_subject("0.33.0", "refloor_50062")]
    assert [is_control(s, subjects) for s in subjects] == [True, False, False]


def test_a_clean_control_is_reused_with_what_it_found_and_when(tmp_path):
    db = tmp_path / "examples"
    before = database_state(str(db))
    remember(KEY, before, _clean())
    found = recall(KEY, before)
    assert found is not None
    result, recorded = found
    assert result.as_dict() == _clean().as_dict() and recorded.endswith("UTC")
    # Any part of the key changed: run again.
    assert recall({**KEY, "seed": 1}, before) is None
    assert recall({**KEY, "tree": "other"}, before) is None
    assert recall({**KEY, "kvspec_code": "changed"}, before) is None


def test_a_control_that_found_or_stopped_is_never_recorded():
    state = "none"
    remember(KEY, state, attrs.evolve(_clean(), stopped=Outcome.INTERRUPTED, stopped_why="interrupted"))
    assert recall(KEY, state) is None
    remember(KEY, state, attrs.evolve(_clean(), scope_reduction="no lookahead hashes"))
    assert recall(KEY, state) is None
    # A Redis database cannot be fingerprinted: never reused there.
    assert database_state("redis://localhost:6379/0") is None
    remember(KEY, None, _clean())
    assert recall(KEY, None) is None


def test_saved_failures_the_record_never_saw_make_the_control_run_again(tmp_path):
    db = tmp_path / "examples"
    empty = database_state(str(db))
    remember(KEY, empty, _clean())
    # The mutant's failure saved by the same command: that state is added at its end.
    (db / "k1").mkdir(parents=True)
    (db / "k1" / "v1").write_text("x")
    after = database_state(str(db))
    assert after != empty and recall(KEY, after) is None
    add_database_state(KEY, after)
    assert recall(KEY, after) is not None and recall(KEY, empty) is not None
    # A failure saved later by another command (perhaps the release's): not reused.
    (db / "k2").mkdir()
    (db / "k2" / "v2").write_text("y")
    assert recall(KEY, database_state(str(db))) is None


def test_every_output_says_the_control_was_reused():
    sentence = "control: vllm 0.33.0, reused from 2026-12-06 17:40 UTC (same seed, ...)"
    run = FuzzRun(FuzzSettings(), ["vllm 0.33.0"], [SubjectRun(_clean(), reused=sentence)])
    assert fuzz_document(run)["subjects"][0]["control_reused"] == sentence
    markdown = render_markdown(run)
    assert "no discrepancy (reused control, below)" in markdown and sentence in markdown


def test_a_recorded_value_is_reused_only_for_the_same_tree_and_when_kept(monkeypatch, tmp_path):
    from kvspec.controls import recorded_value

    tree = {"digest": "t1"}
    monkeypatch.setattr("kvspec.subjects.subject.resolve_subject", lambda s: ("/py", str(tmp_path)))
    monkeypatch.setattr("kvspec.subjects.provision.tree_digest", lambda root: tree["digest"])
    calls = []

    def compute(value):
        return lambda: calls.append(value) or value

    subject = mutant_subject("0.33.0", "refloor_50062")
    unknown = {"status": "UNKNOWN"}
    definite = lambda v: v["status"] != "UNKNOWN"  # noqa: E731
    assert recorded_value("symbolic", subject, {}, compute(unknown), keep=definite) == (unknown, None)
    refuted = {"status": "REFUTED"}
    assert recorded_value("symbolic", subject, {}, compute(refuted), keep=definite) == (refuted, None)
    value, recorded = recorded_value("symbolic", subject, {}, compute({"status": "VERIFIED"}), keep=definite)
    assert value == refuted and recorded.endswith("UTC") and calls == [unknown, refuted]
    tree["digest"] = "t2"  # another tree: computed again
    assert recorded_value("symbolic", subject, {}, compute(refuted), keep=definite)[1] is None
