"""Ask vLLM's own tests first: does the release's test suite already catch a finding?

Before kvspec proposes a regression test, the release's own CPU tests of the
registration boundary (``vllm_tests.SUITE``, from its source distribution)
run against the subject in its runtime, laid out as in vLLM's repository.
For a kvspec mutant the same tests run on the unmutated release too: a test
that fails on the mutant and passes on the release *catches* the finding,
and then kvspec offers no new test (it would duplicate that one).  The
release's own run depends only on its tree, its tests and the runtime, so it
is recorded under the test cache and reused, said so with its date.  A
source tree's tests run on the tree alone: there is no release to compare
with, so every failure is reported, as a failure of the tree's own tests.
Registration and stateful findings ask through the one stage
(``completion.vllm_tests_stage``).  A published release is not asked, and
its finding records why (``model.finding.VLLM_TESTS_NOT_ASKED``): its own
tests are the baseline a failure would be compared with.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kvspec.emit.vllm_tests import KEPT, SUITE
from kvspec.model.finding import VLLM_TESTS_NOT_ASKED

__all__ = ["ask_vllm_tests", "suite_files", "covering_module", "engine_test_module", "caught_by", "not_asked", "already_caught"]

# No model hub, no accelerator: the suite's tests build their managers by hand.
_OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu"}


def suite_files(tests_root: Path | None) -> list[str]:
    """The suite's files this release (or tree) has."""
    if tests_root is None:
        return []
    return [name for name in SUITE if (Path(tests_root) / name).is_file()]


def covering_module(tests_root: Path | None, call: str = "cache_blocks") -> str | None:
    """The release's test module that already covers the area: of the suite's
    files, the one that names ``call`` (what the emitted test drives) most."""
    best, most = None, 0
    for name in suite_files(tests_root):
        count = (Path(tests_root) / name).read_text(errors="replace").count(call)
        if count > most:
            best, most = name, count
    return best


def engine_test_module(tests_root: Path | None, call: str) -> str | None:
    """The release's test module an engine finding's test extends: vLLM's
    tests of the Scheduler (``tests/v1/core/test_scheduler.py``) where the
    cached copy keeps it; else the suite's module that names ``call`` most."""
    from kvspec.emit.vllm_tests import SCHEDULER_TESTS

    if tests_root is not None and (Path(tests_root) / SCHEDULER_TESTS).is_file():
        return SCHEDULER_TESTS
    return covering_module(tests_root, call)


def _lay_out(dest: Path, tests_root: Path) -> None:
    """The suite and its helpers under ``dest`` as in vLLM's repository."""
    for name in KEPT:
        if name.startswith("tests/") and (tests_root / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(tests_root / name, dest / name)
    site = tests_root / "site"
    if site.is_dir():  # the helpers' pure-Python extras (vllm_tests.HELPER_EXTRAS)
        for entry in site.iterdir():
            if not (dest / entry.name).exists():
                (dest / entry.name).symlink_to(entry)


def _run(subject, tests_root: Path, files: list[str]) -> dict[str, Any]:
    from kvspec.subjects.testrun import run_pytest_files

    with tempfile.TemporaryDirectory(prefix="kvspec-vllm-tests-") as scratch:
        _lay_out(Path(scratch), tests_root)
        started = time.perf_counter()
        result = run_pytest_files(subject, scratch, files, env=_OFFLINE)
    passed = result.pop("passed")
    failing = [*result["failed"], *result["errors"]]
    # The most telling test first: one whose every parametrisation fails
    # names the behaviour; one of many parametrisations is a side effect.
    result["failed"] = sorted(result["failed"], key=lambda n: (-_share_failing(n, failing, passed), n))
    return {**result, "passed": len(passed), "tests": len(passed) + len(failing) + len(result["skipped"]),
            "seconds": round(time.perf_counter() - started, 2)}


def _share_failing(node: str, failing: list[str], passed: list[str]) -> float:
    """Of the test function's parametrisations, the share that fails."""
    function = node.split("[", 1)[0]
    fails = sum(1 for n in failing if n.split("[", 1)[0] == function)
    return fails / (fails + sum(1 for n in passed if n.split("[", 1)[0] == function))


def _baseline_key(release, tests_root: Path, files: list[str]) -> str:
    """What the release's own run depends on: its tree's content, the test
    files' bytes and the runtime."""
    from kvspec.subjects.provision import tree_digest
    from kvspec.subjects.subject import resolve_subject

    python, tree = resolve_subject(release)
    digest = hashlib.sha256()
    digest.update(f"{python}\0{tree_digest(Path(tree))}\0".encode())
    for name in files:
        digest.update(name.encode() + b"\0" + hashlib.sha256((tests_root / name).read_bytes()).digest())
    return digest.hexdigest()[:24]


def _baseline(release, tests_root: Path, files: list[str]) -> dict[str, Any]:
    """The release's own run of ``files``: recorded once, then reused."""
    record = tests_root / "baselines" / f"{_baseline_key(release, tests_root, files)}.json"
    try:
        recorded = json.loads(record.read_text())
        if isinstance(recorded, dict) and recorded.get("files") == files:
            return {**recorded, "reused": True}
    except (OSError, ValueError):
        pass
    result = {**_run(release, tests_root, files), "files": files,
              "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if result["outcome"] != "error":  # a run that could not finish is never recorded
        record.parent.mkdir(parents=True, exist_ok=True)
        partial = record.with_suffix(".partial")
        partial.write_text(json.dumps(result, sort_keys=True))
        os.replace(partial, record)
    return {**result, "reused": False}


def caught_by(subject_run: dict[str, Any], baseline: dict[str, Any] | None) -> list[str]:
    """The tests that fail on the subject and pass on the release (with no
    release to compare with, every test that fails on the subject)."""
    failing = [*subject_run.get("failed", ()), *subject_run.get("errors", ())]  # most telling first
    if baseline is None:
        # Without a release to compare with, only a test's own failure counts
        # (an error may be the tree's test environment, not its code).
        return list(subject_run.get("failed", ()))
    broken_there = {*baseline.get("failed", ()), *baseline.get("errors", ())}
    if baseline.get("outcome") == "error":
        return []  # the release's run did not finish: nothing can be said to pass there
    return [n for n in failing if n not in broken_there]


def not_asked(why: str) -> dict[str, Any]:
    """The record of a finding vLLM's tests were not asked about, and why
    (a key of ``VLLM_TESTS_NOT_ASKED``: the report says it, never silence)."""
    return {"asked": False, "why_not": why, "reason": VLLM_TESTS_NOT_ASKED[why], "caught_by": []}


def already_caught(asked: dict[str, Any] | None) -> bool:
    """Whether a test of vLLM's own catches the finding (then kvspec proposes none)."""
    return bool(asked and asked.get("caught_by"))


def ask_vllm_tests(subject, tests_root: Path | None) -> dict[str, Any]:
    """The suite on the subject (and, for a mutant, on its release): what
    fails, what catches the finding.  A release, the current environment or
    a tree without the tests is not asked, and the record says why."""
    from kvspec.subjects.subject import release

    if subject.kind not in ("mutant", "source"):
        return not_asked("release" if subject.kind == "release" else "current")
    files = suite_files(tests_root)
    if not files:
        return not_asked("no_tests")
    started = time.perf_counter()
    base = release(subject.version) if subject.kind == "mutant" else None
    with ThreadPoolExecutor(max_workers=2) as pool:
        baseline = pool.submit(_baseline, base, tests_root, files) if base is not None else None
        here = _run(subject, Path(tests_root), files)
        there = baseline.result() if baseline is not None else None
    if there is not None:
        there = {**there, "against": f"unmutated {base.label}"}
    return {"asked": True, "files": files, "subject": here, "baseline": there, "caught_by": caught_by(here, there),
            "command": "pytest " + " ".join(files), "seconds": round(time.perf_counter() - started, 2)}
