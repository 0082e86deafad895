"""What the CI recipes run, run here: the recipe's own `kvspec check` line
(its budget cut, ``SUITE_BUDGET``) in a directory laid out like a vLLM
checkout (its `vllm/` package), on the unmodified 0.33.0 and on the #50062
mutant of it."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.model.outcome import Outcome
from kvspec.subjects.provision import ensure_release

from tests.support import assert_no_discrepancy_but_known, check_command, mutant_tree


def _checkout(tmp_path: Path, tree: Path) -> Path:
    checkout = tmp_path / "vllm-checkout"
    checkout.mkdir()
    (checkout / "vllm").symlink_to(tree / "vllm", target_is_directory=True)
    return checkout


# The recipe's budget (1000 examples per differential) cut for the suite's
# time; every other word of its command line is run as written, and a seed
# added.
SUITE_BUDGET = "100"
SUITE_SEED = "0"


def _run_recipe(checkout: Path) -> subprocess.CompletedProcess:
    argv = shlex.split(check_command("github-actions"))
    argv[0] = str(Path(sys.executable).with_name("kvspec"))
    budget = argv.index("--max-examples") + 1
    assert int(argv[budget]) >= int(SUITE_BUDGET), argv  # a cut, never a raise
    argv[budget] = SUITE_BUDGET
    # The recipe draws a fresh seed each run (new coverage in a user's CI);
    # the suite fixes one, so what it asserts does not depend on the draw.
    argv += ["--seed", SUITE_SEED]
    return subprocess.run(argv, cwd=checkout, capture_output=True, text=True, timeout=1200)


@pytest.mark.parametrize("which", ["release", "mutant"])
def test_the_recipe_command_on_a_checkout(which, tmp_path):
    tree = ensure_release("0.33.0") if which == "release" else mutant_tree("0.33.0", "refloor_50062")
    checkout = _checkout(tmp_path, tree)
    run = _run_recipe(checkout)
    results = checkout / "kvspec-results"
    report = (results / "report.md").read_text()
    fuzz = json.loads((results / "fuzz.json").read_text())
    prove = json.loads((results / "prove.json").read_text())
    assert prove["summary"]["unexpected"] == 0
    # kvspec check runs every differential: the lookup one (registration
    # and lookup, in two jobs), the stateful one and the engine one.
    runs = {s["differential"]: s for s in fuzz["subjects"]}
    assert sorted(runs) == ["engine", "lookup", "stateful"] and len(fuzz["subjects"]) == 3
    subject = runs["lookup"]
    assert subject["jobs"] == 2
    if which == "release":
        assert run.returncode == Outcome.OK.exit_code, run.stdout[-3000:] + run.stderr[-3000:]
        assert report.startswith("# kvspec check: OK")
        assert prove["real_code"][0]["status"] == "VERIFIED"
        assert_no_discrepancy_but_known(runs["lookup"])
        # Nothing is kept out of the draw: a known vLLM bug met is recognised and said.
        assert runs["stateful"]["verdict"].startswith("no invariant broken")
        assert set(runs["stateful"]["known_met"]) <= {"mamba_estimate_below_allocation_after_connector_load"}
        # The engine ran vLLM's real Scheduler with the release's defaults among its draws.
        assert runs["engine"]["verdict"].startswith("no invariant broken through vLLM's scheduler")
        assert set(runs["engine"]["known_met"]) <= {"mamba_estimate_below_allocation_after_connector_load"}
        assert "0" in runs["engine"]["engine_settings"]["retention_interval"]
        assert "AsyncScheduler" in runs["engine"]["engine_settings"]["scheduler_class"]
        # The OK verdict names the known vLLM bugs the run met (never a bare "no discrepancy" over them).
        met = {**runs["lookup"]["known_met"], **runs["stateful"]["known_met"], **runs["engine"]["known_met"]}
        (verdict,) = [line for line in run.stdout.splitlines() if line.startswith("VERDICT")]
        assert all(name in verdict for name in met) and (not met or "known vLLM bugs met" in verdict), verdict
    else:
        assert run.returncode == Outcome.FINDING.exit_code, run.stdout[-3000:] + run.stderr[-3000:]
        assert report.startswith("# kvspec check: FINDING")
        assert prove["real_code"][0]["status"] == "REFUTED"
        assert subject["finding"]["category"] == "under_registration"
        assert "vLLM observed" in report or "observed" in report
