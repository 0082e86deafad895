"""Quality: kvspec finds known bugs planted in real vLLM trees.

The #50062 regression is re-applied to each CI release by a source
transformation; the fuzzer must find it, and the minimal example it reports
must be a genuine discrepancy: the mutant and the unmodified release, run on
that same case, really register different per-group bounds, and the
unmodified release agrees with the subject.
"""

from __future__ import annotations

import pytest

from kvspec.diff_tests.fuzz import fuzz_subject
from kvspec.oracles.registration import compare
from kvspec.pytest_plugin import DEFAULT_RELEASES as SUPPORTED_IN_CI
from kvspec.subjects.process import SubjectProcess
from kvspec.model.requests import Run
from kvspec.subjects.mutation import REGISTRATION_MUTANTS
from kvspec.subjects.subject import mutant_subject
from kvspec.usecases.mutants import kill_matrix


@pytest.mark.parametrize("version", SUPPORTED_IN_CI)
def test_regression_50062_is_found_and_genuine(version, kvspec_release):
    with SubjectProcess(mutant_subject(version, "refloor_50062")) as buggy:
        result = fuzz_subject(buggy, max_examples=500, seed=1)
    finding = result.failure
    assert finding is not None, f"#50062 mutant of {version} survived {result.cases} cases"
    assert finding.category == "under_registration"
    d = finding.discrepancies[0]
    assert list(d.observed_tokens) != list(d.expected_tokens)

    fixed = kvspec_release(version)
    fixed_reply = fixed.run(Run.of(finding.case))
    assert compare(finding.case, fixed.capabilities, fixed_reply) == []
    fixed_tokens = fixed_reply["calls"][d.call]["num_tokens"]
    assert fixed_tokens == list(d.expected_tokens)
    assert fixed_tokens != list(d.observed_tokens)


def test_the_registration_side_has_its_mutants():
    assert len(REGISTRATION_MUTANTS) >= 7


# One test per mutant, so the suite's processes share the matrix (one test of
# all of them was the suite's longest, ending it on one core).
@pytest.mark.parametrize("name", [m.name for m in REGISTRATION_MUTANTS])
def test_every_registration_mutant_of_the_newest_release_is_killed(name):
    """The registration-side mutants, each by the fuzzer or proved equivalent
    (the lookup- and state-side ones are killed in test_lookup_differential
    and test_stateful; the whole matrix is the soak test below)."""
    (row,) = kill_matrix("0.33.0", max_examples=1000, seed=0, names=[name])
    assert row.name == name and row.status in ("killed", "equivalent"), row.as_dict()


@pytest.mark.soak  # ~6 min on 2 cores; opt in with `python -m pytest -m soak`
def test_every_mutant_of_the_newest_release_is_killed():
    rows = kill_matrix("0.33.0", max_examples=1000, seed=0)
    assert len(rows) >= 20
    for row in rows:
        assert row.status in ("killed", "equivalent"), row.as_dict()
