"""The hit-length differential: a later request's hit on real vLLM.

Each request (the writer) runs its steps; then a later request sharing a
prefix of the writer's tokens calls vLLM's ``get_computed_blocks``.  The
registration is compared as in ``test_differential``; the hit is held to the
lookup contract on every layout and predicted exactly on full-attention
layouts (``oracles/lookup.py``).  Then the quality side: lookup-side mutants
of real release trees, which leave registration alone, must be found.
"""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from diff_tests.fuzz import fuzz_subject
from oracles.lookup import check_case
from kvspec.mutants_command import mutant_tree
from kvspec.pytest_plugin import DEFAULT_RELEASES
from oracles.lookup import exact_lookup_applies
from oracles.mutants import LOOKUP_MUTANTS
from oracles.subject import SubjectProcess, source_tree

from .strategies import lookup_batches


@given(data=st.data())
def test_later_requests_hit_what_the_spec_predicts(kvspec_subject, kvspec_stats, data):
    caps = kvspec_subject.capabilities
    batch = data.draw(lookup_batches(caps))
    kvspec_stats["examples"] += 1
    for key in ("lookups", "exact_lookups", "nonzero_hits"):
        kvspec_stats.setdefault(key, 0)
    for index, reply in enumerate(kvspec_subject.stream([c.to_worker() for c in batch])):
        case = batch[index]
        kvspec_stats["cases"] += 1
        kvspec_stats["cache_blocks_calls"] += len(reply.get("calls", ()))
        if "probe" in reply:
            kvspec_stats["lookups"] += 1
            kvspec_stats["exact_lookups"] += exact_lookup_applies(case)
            kvspec_stats["nonzero_hits"] += reply["probe"]["hit"] > 0
        found = check_case(case, caps, reply)
        if found:
            kvspec_stats["discrepancies"] += 1
        assert not found, f"{case.describe()}: {[d.summary() for d in found]}"


@pytest.mark.parametrize("version", DEFAULT_RELEASES)
@pytest.mark.parametrize("operator", LOOKUP_MUTANTS, ids=lambda op: op.name)
def test_lookup_mutants_are_found_and_genuine(operator, version, kvspec_release):
    """Each lookup-side mutant is killed by the hit-length differential, and
    its minimal case is genuine: the unmodified release, on that same case,
    agrees with the spec and returns a different hit than the mutant."""
    tree = mutant_tree(version, operator)
    with SubjectProcess(source_tree(str(tree))) as buggy:
        result = fuzz_subject(buggy, max_examples=1000, seed=0, lookup=True)
    finding = result.failure
    assert finding is not None, f"{operator.name} on {version} survived {result.cases} cases"
    assert finding.category in ("lookup_contract", "hit_mismatch"), finding.category
    assert finding.case.probe is not None

    fixed = kvspec_release(version)
    fixed_reply = fixed.run(finding.case.to_worker())
    assert check_case(finding.case, fixed.capabilities, fixed_reply) == []
    assert fixed_reply["probe"]["hit"] != finding.reply["probe"]["hit"]
