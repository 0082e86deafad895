"""The whole catalog through `kvspec prove`: verdicts, vacuity, JSON, snapshot."""

import json
import re

import pytest

from kvspec.model.outcome import Outcome
from kvspec.cli import main
from kvspec.model.variants import VARIANTS, Conformance

from tests.support import assert_snapshot


@pytest.fixture(scope="module")
def prove_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("prove") / "prove.json"
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(["prove", "--quiet", "--json", str(out)])
    return code, buffer.getvalue(), json.loads(out.read_text())


def by_name(doc):
    return {t["name"]: t for t in doc["theorems"]}


def test_exit_code_and_summary(prove_run):
    code, _, doc = prove_run
    assert code == Outcome.OK.exit_code
    assert doc["schema"] == "kvspec.prove/1"
    assert doc["summary"]["unknown"] == 0
    assert doc["summary"]["unexpected"] == 0


def test_every_variant_has_its_verdict(prove_run):
    theorems = by_name(prove_run[2])
    for v in VARIANTS:
        t = theorems[f"conformance.{v.name}"]
        if v.conformance is Conformance.CORRECT:
            assert t["status"] == "PROVED", v.name
        else:
            assert t["status"] == "REFUTED", v.name
            cx = t["counterexample"]
            assert cx["replayed"] and cx["minimal"], v.name
            assert cx["domain"]["calls"], v.name
        if v.conformance is Conformance.HISTORICAL:
            assert theorems[f"conformance.{v.name}.in_era"]["status"] == "PROVED"


def test_vacuity_checks(prove_run):
    for t in prove_run[2]["theorems"]:
        vac = t["vacuity"]
        assert vac["assumptions_satisfiable"] == "PROVED", t["name"]
        assert not vac["not_refuted_by"], t["name"]
        if t["category"] in ("safety", "no-loss", "monotonicity", "reachability", "loss", "lookup",
                             "mtp") and t["expected"] == "PROVED":
            assert vac["refuted_by"], f"{t['name']} could not fail"


def test_regression_minimal_counterexample(prove_run):
    cx = by_name(prove_run[2])["conformance.regression_50062"]["counterexample"]
    values = cx["values"]
    assert (values["n"], values["S"], values["H"], values["B"], values["L"]) == (2, 3, 1, 1, 0)
    call = cx["domain"]["calls"][0]
    assert call["spec"]["tokens"] == [2, 2]
    assert call["regression_50062"]["tokens"] == [1, 2]


def normalise(text: str) -> str:
    # The padding goes too: a slow machine's 10.23s is one column wider than 9.22s.
    return re.sub(r" +\d+\.\d\ds", " T.TTs", text)


def test_table_snapshot(prove_run):
    assert_snapshot("prove_table.txt", normalise(prove_run[1]))


def test_unknown_theorem_is_usage_error(capsys):
    assert main(["prove", "--theorem", "no.such"]) == Outcome.USAGE.exit_code
    assert "unknown theorem 'no.such'" in capsys.readouterr().err


def test_an_exhausted_budget_is_unknown_never_proved(capsys, tmp_path):
    # 10,000 resource units cannot finish the block-level proof: UNKNOWN, the
    # same on any machine; the JSON records the budget the theorem had.
    out_json = tmp_path / "prove.json"
    code = main(["prove", "--quiet", "--rlimit", "10000", "--theorem", "monotone.blocks_in_n",
                 "--json", str(out_json)])
    out = capsys.readouterr().out
    assert code == Outcome.UNKNOWN.exit_code
    row = out.splitlines()[1].split()
    assert row[:3] == ["monotone.blocks_in_n", "UNKNOWN", "PROVED"]  # verdict, then expected
    assert "budget of 10,000 resource units per check ran out" in out
    (result,) = json.loads(out_json.read_text())["theorems"]
    assert result["budget"]["rlimit_per_check"] == 10_000 and result["status"] == "UNKNOWN"


def test_the_wall_clock_is_only_a_safety_net_and_says_so(capsys):
    code = main(["prove", "--quiet", "--timeout", "0.001", "--theorem", "monotone.blocks_in_n"])
    out = capsys.readouterr().out
    assert code == Outcome.UNKNOWN.exit_code
    assert "safety net of 0.001 s expired (the machine, not the budget)" in out


def test_the_budget_spent_is_the_same_on_every_run():
    """Resource units, not seconds: two runs of a theorem spend exactly the same."""
    from kvspec.proofs.catalog import theorem
    from kvspec.proofs.runner import run_theorem

    first, again = (run_theorem(theorem("reachability.regression_tokens"), vacuity=False) for _ in range(2))
    assert first.resources == again.resources and first.resources["most_per_check"] > 0


def test_ctrl_c_during_a_check_is_an_interrupt_not_an_unknown():
    """Z3 takes SIGINT itself while it solves and answers "unknown": kvspec
    raises it as KeyboardInterrupt (found when a Ctrl-C during a finding's
    explanation was swallowed and the fuzz run said COMPLETE)."""
    import os
    import signal
    import threading

    import z3

    from kvspec.proofs.runner import check, new_solver

    ctx = z3.Context()
    x, y, z = z3.Ints("x y z", ctx=ctx)
    solver = new_solver(ctx, 10**12)  # a budget far beyond the interrupt
    solver.set("timeout", 60_000)
    solver.add(x * x * x + y * y * y == z * z * z, x > 1, y > 1, z > 1)  # no cubes sum to a cube: hard
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            check(solver)
    finally:
        timer.cancel()
