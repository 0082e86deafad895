"""The worker reuses a KVCacheManager across cases of one geometry, freed and
reset between them (``subjects/vllm_side/manager_driver.py``: ``_recorded_manager``).  That must
be invisible: on real vLLM every reply, registration and lookup alike, equals
the reply of a manager built for the case alone (``KVSPEC_FRESH_MANAGERS=1``)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, seed, settings

from kvspec.model.known import known_bugs, recognise_all
from kvspec.model.replies import record_of
from kvspec.oracles.lookup import check_case
from kvspec.pytest_plugin import DEFAULT_RELEASES
from kvspec.subjects.process import SubjectProcess
from kvspec.subjects.subject import release

from kvspec.diff_tests.strategies import batches, lookup_batches
from kvspec.model.requests import Stream


def generated_cases(capabilities, count: int = 150):
    """``count`` batches of each kind, fixed by seed: about 10,000 cases."""
    drawn = []
    for strategy in (batches(capabilities), lookup_batches(capabilities)):
        @settings(max_examples=count, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck))
        @seed(20261205)
        @given(batch=strategy)
        def collect(batch):
            drawn.append(batch)

        collect()
    return drawn


def _replies(proc, drawn, raw=None):
    """Each reply's record (``raw``, if given, gets the replies themselves)."""
    out = []
    for batch in drawn:
        for reply in proc.stream(Stream.of(batch)):
            record = record_of(reply)
            record.pop("seconds")  # the only field that may differ
            out.append(record)
            if raw is not None:
                raw.append(reply)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("version", DEFAULT_RELEASES)
def test_reused_managers_answer_as_new_ones(version, kvspec_release, monkeypatch):
    reusing = kvspec_release(version)
    drawn = generated_cases(reusing.capabilities)
    cases = [case for batch in drawn for case in batch]
    before = reusing.stats()
    reused_replies = _replies(reusing, drawn)
    after = reusing.stats()

    monkeypatch.setenv("KVSPEC_FRESH_MANAGERS", "1")
    with SubjectProcess(release(version)) as fresh:
        raw: list = []
        fresh_replies = _replies(fresh, drawn, raw)
        fresh_stats = fresh.stats()

    assert len(reused_replies) == len(fresh_replies) == len(cases)
    # Every case ran, but for the known vLLM bugs of the release some meet
    # (0.33.0 on: the sliding-window EAGLE crash), each recognised by its mechanism.
    failing = [(case, reply) for case, reply in zip(cases, raw) if not reply.ok]
    known = known_bugs(version)
    unknown = [case.describe() for case, reply in failing
               if not recognise_all(known, check_case(case, reusing.capabilities, reply))]
    assert not unknown, unknown[:3]
    assert len(failing) * 20 < len(cases), f"{len(failing)} of {len(cases)} cases crashed"
    differing = [(case.describe(), a, b) for case, a, b in zip(cases, reused_replies, fresh_replies) if a != b]
    assert not differing, f"{len(differing)} of {len(cases)} replies differ; first: {differing[0]}"
    # Not vacuous: the reusing worker did reuse, the other built a manager per case.
    assert after["reuse_managers"] and not fresh_stats["reuse_managers"]
    assert after["cases"] - before["cases"] == fresh_stats["cases"] == len(cases)
    assert fresh_stats["managers_built"] == len(cases)
    assert (after["managers_built"] - before["managers_built"]) * 5 < len(cases)
