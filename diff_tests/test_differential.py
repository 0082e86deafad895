"""The spec against real vLLM releases: no discrepancy may be reported.

A discrepancy here would be either a vLLM bug or a false alarm of the
oracle; both must be looked at, never silenced.
"""

from __future__ import annotations

from hypothesis import given, strategies as st

from oracles.oracle import compare

from .strategies import batches


def test_release_conforms(subject):
    caps = subject.capabilities
    counted = {"cases": 0}

    @given(data=st.data())
    def conforms(data):
        batch = data.draw(batches(caps))
        for case, reply in zip(batch, subject.run_many([c.to_worker() for c in batch])):
            counted["cases"] += 1
            found = compare(case, caps, reply)
            assert not found, f"{case.describe()}: {[d.summary() for d in found]}"

    conforms()
    assert counted["cases"] >= 2 * 200  # the property really ran the subject


def test_seed_geometry_on_real_vllm(subject):
    """vLLM's own #52419 geometry: [22, 22] on every release since 0.28."""
    from model.corpus import case as corpus_case
    from oracles.case import Case, prefill

    seed = corpus_case("seed_52419")
    reply = subject.run(Case(seed.config, 22, (prefill(22),)).to_worker())
    assert reply["ok"], reply
    assert reply["calls"][0]["num_tokens"] == list(seed.expected["spec"])
    assert reply["regime"]["partial_hash_hits"] is True
