"""The subject against real vLLM: no discrepancy may be reported.

A discrepancy here would be either a vLLM bug or a false alarm of the
oracle; both must be looked at, never silenced.  The subjects are chosen with
the plugin's options (``--kvspec-vllm``, ``--kvspec-vllm-src``,
``--kvspec-current``; by default the releases CI provisions), the number of
examples by ``--kvspec-profile``.  The properties are plain module-level
Hypothesis tests, so coverage-guided engines (HypoFuzz) can run them too;
their body is ``kvspec fuzz``'s (``kvspec.diff_tests.property``).
"""

from __future__ import annotations

from hypothesis import given, strategies as st

from kvspec.diff_tests.property import run_batch
from kvspec.diff_tests.strategies import batches, lookup_batches
from kvspec.model.case import Case, prefill
from kvspec.model.corpus import case as corpus_case
from kvspec.subjects.protocol import case_message


def _check(subject, tally, batch) -> None:
    failed = run_batch(subject, batch, tally)
    # The first failing case fails the example; the kvspec_stats fixture
    # checks afterwards that the whole budget ran.
    assert failed is None, f"{failed.case.describe()}: {[d.summary() for d in failed.discrepancies]}"


@given(data=st.data())
def test_release_conforms(kvspec_subject, kvspec_stats, data):
    """Registration: every cache_blocks bound is the spec's."""
    _check(kvspec_subject, kvspec_stats, data.draw(batches(kvspec_subject.capabilities)))


@given(data=st.data())
def test_later_requests_hit_what_the_spec_predicts(kvspec_subject, kvspec_stats, data):
    """The hit-length differential: registration as above, then a later
    request's hit, held to the lookup contract on every layout and to the
    spec's exact hit on full-attention layouts."""
    _check(kvspec_subject, kvspec_stats, data.draw(lookup_batches(kvspec_subject.capabilities)))


def test_seed_geometry_on_real_vllm(kvspec_subject):
    """vLLM's own #52419 geometry: [22, 22] on every release since 0.28."""
    seed = corpus_case("seed_52419")
    reply = kvspec_subject.run(case_message(Case(seed.config, 22, (prefill(22),))))
    assert reply["ok"], reply
    assert reply["calls"][0]["num_tokens"] == list(seed.expected["spec"])
    assert reply["regime"]["partial_hash_hits"] is True
