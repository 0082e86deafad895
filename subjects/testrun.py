"""Running one pytest file against a subject's vLLM (the regression tests
kvspec emits): passed, failed or error."""

from __future__ import annotations

import os
import subprocess
from typing import Any

from .subject import Subject, interpreter_args, resolve_subject, subject_env

__all__ = ["run_pytest"]

# pytest in the subject's interpreter with the named tree first on sys.path
# (never PYTHONPATH: see subjects.subject).
_PYTEST = ("import os, sys; tree = os.environ.get('KVSPEC_SUBJECT_TREE'); "
           "tree and sys.path.insert(0, tree); import pytest; raise SystemExit(pytest.main(sys.argv[1:]))")


def run_pytest(subject: Subject, test_file: str, timeout: float = 600) -> dict[str, Any]:
    python, root = resolve_subject(subject)
    test_file = os.path.abspath(test_file)
    # -c os.devnull: the file is run on its own, never under the configuration
    # of a project it happens to sit in (kvspec's own pyproject adds options
    # that only kvspec's pytest plugin knows, and the runtime has no kvspec).
    try:
        out = subprocess.run(
            [python, *interpreter_args(root), "-c", _PYTEST, "-q", "-p", "no:cacheprovider",
             "-p", "no:warnings", "-c", os.devnull, "--rootdir", os.path.dirname(test_file), test_file],
            capture_output=True, text=True, timeout=timeout, env=subject_env(root),
            cwd=os.path.dirname(test_file), start_new_session=True)
    except subprocess.TimeoutExpired:
        return {"against": subject.label, "outcome": "error", "returncode": None,
                "summary": f"timed out after {timeout:.0f} s"}
    lines = (out.stdout + out.stderr).strip().splitlines()
    outcome = {0: "passed", 1: "failed"}.get(out.returncode, "error")
    return {"against": subject.label, "outcome": outcome, "returncode": out.returncode,
            "summary": lines[-1] if lines else "", "output": "\n".join(lines[-80:])}
