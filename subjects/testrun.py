"""Running pytest against a subject's vLLM: one file (the regression tests
kvspec emits: passed, failed or error), or a set of files laid out as in
vLLM's repository (the release's own tests), each test's outcome read from
pytest's JUnit XML."""

from __future__ import annotations

import os
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from typing import Any

from .subject import Subject, interpreter_args, resolve_subject, subject_env

__all__ = ["run_pytest", "run_pytest_files", "junit_outcomes"]

# pytest in the subject's interpreter with the named tree first on sys.path
# (never PYTHONPATH: see subjects.subject).
_PYTEST = ("import os, sys; tree = os.environ.get('KVSPEC_SUBJECT_TREE'); "
           "tree and sys.path.insert(0, tree); import pytest; raise SystemExit(pytest.main(sys.argv[1:]))")
# -c os.devnull: files are run on their own, never under the configuration
# of a project they happen to sit in (kvspec's own pyproject adds options
# that only kvspec's pytest plugin knows, and the runtime has no kvspec).
_QUIET = ("-q", "-p", "no:cacheprovider", "-p", "no:warnings", "-c", os.devnull)


def _pytest(subject: Subject, args: list[str], cwd: str, timeout: float,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess | None:
    python, root = resolve_subject(subject)
    try:
        return subprocess.run([python, *interpreter_args(root), "-c", _PYTEST, *_QUIET, *args],
                              capture_output=True, text=True, timeout=timeout,
                              env={**subject_env(root), **(env or {})}, cwd=cwd, start_new_session=True)
    except subprocess.TimeoutExpired:
        return None


def run_pytest(subject: Subject, test_file: str, timeout: float = 600,
               env: dict[str, str] | None = None) -> dict[str, Any]:
    test_file = os.path.abspath(test_file)
    out = _pytest(subject, ["--rootdir", os.path.dirname(test_file), test_file], os.path.dirname(test_file),
                  timeout, env)
    if out is None:
        return {"against": subject.label, "outcome": "error", "returncode": None,
                "summary": f"timed out after {timeout:.0f} s"}
    lines = (out.stdout + out.stderr).strip().splitlines()
    outcome = {0: "passed", 1: "failed"}.get(out.returncode, "error")
    return {"against": subject.label, "outcome": outcome, "returncode": out.returncode,
            "summary": lines[-1] if lines else "", "output": "\n".join(lines[-80:])}


def run_pytest_files(subject: Subject, root: str, files: list[str], timeout: float = 300,
                     env: dict[str, str] | None = None) -> dict[str, Any]:
    """``files`` (relative to ``root``, which goes on ``sys.path`` as a
    repository's root does) in one pytest run: the node ids that passed,
    failed and errored.  ``outcome`` is "error" when pytest could not run
    them all (a collection error, a crash, a timeout): then the lists say
    what it did run."""
    root = os.path.abspath(root)
    with tempfile.TemporaryDirectory(prefix="kvspec-junit-") as scratch:
        report = os.path.join(scratch, "junit.xml")
        out = _pytest(subject, ["--rootdir", root, "-o", f"pythonpath={root}", "-o", "junit_family=xunit1",
                                f"--junitxml={report}", *files], root, timeout, env)
        outcomes = junit_outcomes(report) if out is not None else {}
    result: dict[str, Any] = {
        "against": subject.label,
        "passed": sorted(n for n, o in outcomes.items() if o == "passed"),
        "failed": sorted(n for n, o in outcomes.items() if o == "failed"),
        "errors": sorted(n for n, o in outcomes.items() if o == "error"),
        "skipped": sorted(n for n, o in outcomes.items() if o == "skipped"),
    }
    if out is None:
        return {**result, "outcome": "error", "summary": f"timed out after {timeout:.0f} s"}
    lines = (out.stdout + out.stderr).strip().splitlines()
    clean = out.returncode in (0, 1) and not result["errors"]
    outcome = "error" if not clean else ("failed" if result["failed"] else "passed")
    return {**result, "outcome": outcome, "returncode": out.returncode, "summary": lines[-1] if lines else "",
            "output": "\n".join(lines[-40:]) if outcome == "error" else ""}


def junit_outcomes(path: str) -> dict[str, str]:
    """Node id -> passed, failed, error or skipped, from JUnit XML (xunit1:
    each test case names its file)."""
    try:
        tree = ET.parse(path)
    except (OSError, ET.ParseError):
        return {}
    out: dict[str, str] = {}
    for case in tree.iter("testcase"):
        file, name, classname = case.get("file"), case.get("name"), case.get("classname") or ""
        if not file or not name:
            continue
        module = file[:-3].replace("/", ".") if file.endswith(".py") else file
        classes = classname[len(module) + 1:].split(".") if classname.startswith(module + ".") else []
        node = "::".join([file, *classes, name])
        children = {child.tag for child in case}
        if children & {"failure"}:
            out[node] = "failed"
        elif children & {"error"}:
            out[node] = "error"
        elif children & {"skipped"}:
            out[node] = "skipped"
        else:
            out[node] = "passed"
    return out
