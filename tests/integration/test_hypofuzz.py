"""Continuous fuzzing: kvspec's differential property under HypoFuzz, the
coverage-guided engine for Hypothesis tests, for a bounded time.

HypoFuzz collects the property through pytest (the plugin's options choose
the subject and the shared database), fuzzes it, and keeps its corpus and
failures in that database, where a plain pytest run replays them first.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from hypofuzz.database.models import Report

import kvspec.diff_tests as diff_tests

from tests.support import interruptible, mutant_tree
from kvspec.subjects.provision import ensure_release


# Both runs name the property by the same node id, which (with --pyargs from
# another directory) needs the rootdir to be where kvspec's packages live:
# HypoFuzz and pytest then key the database alike.  The folder as imported,
# links not followed (in a checkout kvspec/diff_tests links to diff_tests/),
# as the manual's recipe computes it.
ROOTDIR = str(Path(diff_tests.__file__).parent.parent)


def _hypofuzz(tree: Path, database: Path, cwd: Path, seconds: float,
              enough=lambda: False) -> subprocess.CompletedProcess:
    """``hypothesis fuzz`` on the property until ``enough()`` holds (polled
    every 2 s) or for at most ``seconds``, then ^C: a loaded machine gets
    more time, never a different verdict."""
    command = [str(Path(sys.executable).with_name("hypothesis")), "fuzz", "--no-dashboard", "-n", "1", "--",
               "--pyargs", "kvspec.diff_tests.test_differential", "-k", "test_release_conforms",
               "--rootdir", ROOTDIR, "--kvspec-vllm-src", str(tree), "--kvspec-database", str(database),
               "-p", "no:cacheprovider"]
    proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, preexec_fn=interruptible)
    deadline = time.monotonic() + seconds
    while proc.poll() is None and time.monotonic() < deadline and not enough():
        time.sleep(2)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)  # the engine runs until stopped
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # a loaded machine: what it wrote so far is what is judged
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(command, proc.returncode, out, "")


def _reports(database: Path) -> list[Report]:
    """HypoFuzz's progress reports, read back from the directory database."""
    reports = []
    for value in database.rglob("*"):
        if value.is_file():
            report = Report.from_json(value.read_bytes())
            if report is not None:
                reports.append(report)
    return reports


def _status(report: Report, name: str) -> int:
    """How many examples of the report ended with Hypothesis's status ``name``."""
    return sum(n for status, n in report.status_counts.items() if status.name == name)


def _executed(database: Path) -> tuple[int, int]:
    """Examples run and behaviours seen in HypoFuzz's latest report (0, 0: none yet)."""
    try:
        reports = _reports(database)
    except (OSError, ValueError):  # a report being written as it is read
        return 0, 0
    if not reports:
        return 0, 0
    latest = max(reports, key=lambda r: r.elapsed_time)
    return sum(latest.status_counts.values()), latest.behaviors


def test_hypofuzz_fuzzes_the_release_for_a_bounded_time(tmp_path):
    database = tmp_path / "db"
    # Until some 40 examples have run (about 1,500 differential cases), at
    # most 240 s: on a busy machine the worker's start-up alone takes tens of seconds.
    run = _hypofuzz(ensure_release("0.33.0"), database, tmp_path, seconds=240,
                    enough=lambda: _executed(database)[0] > 40)
    assert "using 1 process to fuzz 1 test" in run.stdout, run.stdout[-3000:]
    reports = _reports(database)
    assert reports, "HypoFuzz saved no progress report"
    latest = max(reports, key=lambda r: r.elapsed_time)
    # Failures are judged from HypoFuzz's own counts, not its last line:
    # "Found a failing input for every test!" is printed whenever its worker
    # hub returns, the ^C that ends this run included.
    assert _status(latest, "INTERESTING") == 0, run.stdout[-3000:]
    assert latest.nodeid == f"diff_tests/test_differential.py::test_release_conforms[src:{ensure_release('0.33.0')}]"
    executed = sum(latest.status_counts.values())
    # An example is a batch of up to 128 requests (about 38 on average), and
    # HypoFuzz traces coverage: 20 examples are some 750 differential cases.
    assert executed > 20 and latest.behaviors > 0, latest


def test_hypofuzz_finds_the_50062_mutant_and_pytest_replays_it_first(tmp_path):
    tree = mutant_tree("0.33.0", "refloor_50062")
    database = tmp_path / "db"
    run = _hypofuzz(tree, database, tmp_path, seconds=300)
    assert "Found a failing input for every test!" in run.stdout, run.stdout[-3000:]
    assert any(_status(report, "INTERESTING") for report in _reports(database)), run.stdout[-3000:]

    replay = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "kvspec.diff_tests.test_differential",
         "-k", "test_release_conforms", "--rootdir", ROOTDIR, "--kvspec-vllm-src", str(tree),
         "--kvspec-database", str(database),
         "--kvspec-profile", "dev", "--hypothesis-show-statistics", "-p", "no:cacheprovider"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert replay.returncode == 1, replay.stdout[-3000:]
    statistics = replay.stdout[replay.stdout.index("Hypothesis Statistics"):]
    reuse = statistics[statistics.index("during reuse phase"):]
    # "1 failing examples" (Hypothesis 6.155) or "1 failing, and 0 invalid test cases" (6.170)
    assert re.search(r"\b1 failing\b", reuse.split("\n\n")[0]), statistics
    assert "under_registration" in replay.stdout or "under-registration" in replay.stdout, replay.stdout[-3000:]
