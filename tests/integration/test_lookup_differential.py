"""The hit-length differential's quality side: lookup-side mutants of real
release trees, which leave registration alone, must be found with genuine
minimal cases, and the lookup regression tests kvspec emits must pass on a
correct release.  (The property itself ships with kvspec:
``kvspec.diff_tests.test_differential``.)
"""

from __future__ import annotations

import pytest

from kvspec.diff_tests.fuzz import fuzz_subject
from kvspec.model.known import known_bugs
from kvspec.oracles.lookup import check_case
from kvspec.pytest_plugin import DEFAULT_RELEASES
from kvspec.subjects.mutation import LOOKUP_MUTANTS
from kvspec.subjects.process import SubjectProcess
from kvspec.model.requests import Run
from kvspec.subjects.subject import mutant_subject


@pytest.mark.parametrize("version", DEFAULT_RELEASES)
@pytest.mark.parametrize("operator", LOOKUP_MUTANTS, ids=lambda op: op.name)
def test_lookup_mutants_are_found_and_genuine(operator, version, kvspec_release):
    """Each lookup-side mutant is killed by the hit-length differential, and
    its minimal case is genuine: the unmodified release, on that same case,
    agrees with the subject and returns a different hit than the mutant."""
    with SubjectProcess(mutant_subject(version, operator.name)) as buggy:
        result = fuzz_subject(buggy, max_examples=1000, seed=0, lookup=True)
    finding = result.failure
    assert finding is not None, f"{operator.name} on {version} survived {result.cases} cases"
    assert finding.category in ("lookup_contract", "hit_mismatch"), finding.category
    assert finding.case.probe is not None

    fixed = kvspec_release(version)
    fixed_reply = fixed.run(Run.of(finding.case))
    on_release = check_case(finding.case, fixed.capabilities, fixed_reply)
    if on_release:
        # The release's own known bug (0.28.0: a second full-attention group
        # untrimmed) fails the same case: it masks the mutant, said, never passed.
        known = known_bugs(version, on_release[0].category, on_release[0].summary())
        assert known, f"the minimal case fails on unmutated {version} too: {on_release[0].summary()}"
        pytest.xfail(f"{operator.name} on {version}: its minimal case is the release's own known bug "
                     f"({known[0].name}), which masks the mutant")
    assert fixed_reply["probe"]["hit"] != finding.reply["probe"]["hit"]


def _emitted_lookup_test(proc, case, tmp_path):
    """The regression test kvspec would emit had this case's hit been a
    finding: the pinned hit is the spec's, never the subject's."""
    from kvspec.diff_tests.fuzz import FuzzResult
    from kvspec.diff_tests.property import Failure
    from kvspec.findings.assemble import fuzz_finding
    from kvspec.emit.regression_test import emit_test, test_file_name
    from kvspec.oracles.registration import Discrepancy

    caps = proc.capabilities
    reply = proc.run(Run.of(case))
    assert check_case(case, caps, reply) == [], case.describe()
    stand_in = Discrepancy("lookup_contract", None, None, (), (reply["probe"]["hit"],), detail="stand-in")
    result = FuzzResult(subject=proc.describe(), capabilities=caps, seed=0,
                        failure=Failure(case, (stand_in,), reply))
    finding = fuzz_finding(result, versions={}, explain=False)
    path = tmp_path / test_file_name(finding)
    path.write_text(emit_test(finding, caps))
    return finding, path


@pytest.mark.parametrize("layout", ["mamba-hybrid", "full-attention"])
def test_emitted_lookup_tests_pass_on_the_release(layout, kvspec_release, tmp_path):
    """No false alarm from an emitted lookup test: on a Mamba hybrid (no exact
    model: the test pins the hits the contract admits) and on full attention
    (the spec's exact hit), a correct release passes its own case's test."""
    from kvspec.model.domain import CoordinatorConfig, GroupKind, KVCacheGroup
    from kvspec.model.case import Case, LookupProbe, decode, prefill
    from kvspec.subjects.subject import release
    from kvspec.subjects.testrun import run_pytest

    if layout == "mamba-hybrid":
        groups = (KVCacheGroup(GroupKind.MAMBA_ALIGN, 4), KVCacheGroup(GroupKind.FULL_ATTENTION, 2, eagle=True))
    else:
        groups = (KVCacheGroup(GroupKind.FULL_ATTENTION, 2), KVCacheGroup(GroupKind.FULL_ATTENTION, 4, eagle=True))
    config = CoordinatorConfig(groups=groups, scheduler_block_size=4, hash_block_size=2)
    case = Case(config, 9, (prefill(5), prefill(4), decode(2, 1)), LookupProbe(shared=10, extra=1))
    finding, path = _emitted_lookup_test(kvspec_release("0.33.0"), case, tmp_path)
    pinned = "expected = " if layout == "full-attention" else "admissible = "
    assert pinned in path.read_text()
    if layout == "mamba-hybrid":
        assert finding.inputs["admissible_hits"] and "expected_hit" not in finding.inputs
    outcome = run_pytest(release("0.33.0"), str(path))
    assert outcome["outcome"] == "passed", outcome
    # And it can fail: pin a hit the release does not return.
    from kvspec.emit.regression_test import LOOKUP_ASSERT_MESSAGE

    hit = finding.observations["probe"]["hit"]
    text = path.read_text()
    wrong = (f"expected = {finding.inputs['expected_hit']!r}", f"expected = {hit + 2}") if "expected_hit" in \
        finding.inputs else (f"admissible = {finding.inputs['admissible_hits']!r}", f"admissible = [{hit + 2}]")
    assert text.count(wrong[0]) == 1
    path.write_text(text.replace(*wrong))
    outcome = run_pytest(release("0.33.0"), str(path))
    assert outcome["outcome"] == "failed" and LOOKUP_ASSERT_MESSAGE in outcome["output"], outcome


def test_lookup_mutant_finding_carries_a_verified_regression_test(tmp_path):
    """`kvspec fuzz --lookup` on a lookup-side mutant: the emitted test fails
    on the mutant on its own assertion and passes on the release."""
    import json

    from kvspec.model.outcome import Outcome
    from kvspec.cli import main

    out = tmp_path / "fuzz.json"
    code = main(["fuzz", "--vllm", "0.33.0", "--mutant", "eagle_drop_removed", "--lookup",
                 "--max-examples", "200", "--seed", "0", "--database", "",
                 "--findings-dir", str(tmp_path / "findings"), "--json", str(out)])
    assert code == Outcome.FINDING.exit_code
    control, mutant_run = json.loads(out.read_text())["subjects"]
    assert control["verdict"] == "no discrepancy"
    checks = {c["must"]: c for c in mutant_run["finding"]["regression_test"]["verified"]}
    assert checks["failed"]["as_expected"] and checks["passed"]["as_expected"], checks
