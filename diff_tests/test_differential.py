"""The spec against real vLLM: no discrepancy may be reported.

A discrepancy here would be either a vLLM bug or a false alarm of the
oracle; both must be looked at, never silenced.  The subjects are chosen with
the plugin's options (``--kvspec-vllm``, ``--kvspec-vllm-src``,
``--kvspec-current``; by default the releases CI provisions), the number of
examples by ``--kvspec-profile``.  The property is a plain module-level
Hypothesis test, so coverage-guided engines (HypoFuzz) can run it too.
"""

from __future__ import annotations

from hypothesis import given, strategies as st

from oracles.oracle import compare

from .strategies import batches


@given(data=st.data())
def test_release_conforms(kvspec_subject, kvspec_stats, data):
    caps = kvspec_subject.capabilities
    batch = data.draw(batches(caps))
    kvspec_stats["examples"] += 1
    for index, reply in enumerate(kvspec_subject.stream([c.to_worker() for c in batch])):
        case = batch[index]
        kvspec_stats["cases"] += 1
        kvspec_stats["cache_blocks_calls"] += len(reply.get("calls", ()))
        found = compare(case, caps, reply)
        if found:
            kvspec_stats["discrepancies"] += 1
        # The first failing case fails the example (the stream drains itself on close);
        # the kvspec_stats fixture checks afterwards that the whole budget ran.
        assert not found, f"{case.describe()}: {[d.summary() for d in found]}"


def test_seed_geometry_on_real_vllm(kvspec_subject):
    """vLLM's own #52419 geometry: [22, 22] on every release since 0.28."""
    from model.corpus import case as corpus_case
    from oracles.case import Case, prefill

    seed = corpus_case("seed_52419")
    reply = kvspec_subject.run(Case(seed.config, 22, (prefill(22),)).to_worker())
    assert reply["ok"], reply
    assert reply["calls"][0]["num_tokens"] == list(seed.expected["spec"])
    assert reply["regime"]["partial_hash_hits"] is True
