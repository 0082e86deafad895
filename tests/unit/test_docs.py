"""The manual builds with warnings as errors, and its reference is the code's.

MkDocs (with the Material theme, in the test extra) builds the site into a
temporary directory with ``--strict``: a broken link or anchor, a page left
out of the navigation or a generator error fails.  The reference pages are
generated at build time by ``docs/generate.py`` (an MkDocs hook), so a page
cannot go stale; the tests below also hold a few of them to the code.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import mkdocs  # noqa: F401  (the test extra installs it: without it this module fails, never skips)
import material  # noqa: F401
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("kvspec_docs_generate", ROOT / "docs" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_manual_builds_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                          str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]
    for page in _generator().PAGES:
        assert (tmp_path / "site" / page.replace(".md", "") / "index.html").exists(), page


def test_the_generated_reference_is_the_code():
    from kvspec.model.known import KNOWN_BUGS
    from kvspec.model.outcome import Outcome
    from kvspec.model.state import INVARIANTS
    from kvspec.proofs.catalog import CATALOG
    from kvspec.subjects.mutation import ALL_MUTANTS

    pages = _generator().pages()
    for outcome in Outcome:
        assert f"| {outcome.exit_code} | {outcome.name.lower()} |" in pages["reference/exit-codes.md"]
    assert all(f"`{t.name}`" in pages["reference/theorems.md"] for t in CATALOG)
    assert all(f"`{i.name}`" in pages["reference/invariants.md"] for i in INVARIANTS)
    assert all(f"`{m.name}`" in pages["reference/mutants.md"] for m in ALL_MUTANTS)
    assert all(b.summary.split()[0] in pages["reference/known-bugs.md"] for b in KNOWN_BUGS)
    from kvspec.cli import COMMANDS

    assert all(f"## kvspec {name}" in pages["reference/cli.md"] for name in COMMANDS)


def test_a_result_file_must_match_its_command(tmp_path, monkeypatch):
    generate = _generator()
    name, command = generate.RESULTS["mutants"]
    monkeypatch.setattr(generate, "RESULTS_DIR", tmp_path)
    rows = [{"mutant": "refloor_50062", "model": "REFUTED", "status": "killed", "fuzz": "killed",
             "cases_to_kill": 3, "seconds_to_kill": 0.5}]
    result = {"schema": "kvspec.mutants/1", "status": "COMPLETE", "vllm": "0.34.0", "seed": 0,
              "max_examples": 300, "seconds": 1.0, "mutants": rows}
    import json

    (tmp_path / name).write_text(json.dumps(result))
    page = generate.kill_matrix()
    assert command in page and "refloor_50062" in page and "1 of 1 killed" in page
    (tmp_path / name).write_text(json.dumps({**result, "seed": 7}))
    try:
        generate.kill_matrix()
    except ValueError as e:
        assert "--seed 7" in str(e)
    else:
        raise AssertionError("a result made with other settings than its command was rendered")


def _slug(heading: str) -> str:
    """The anchor Python-Markdown's table of contents gives a heading."""
    text = re.sub(r"[^\w\s-]", "", heading).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_the_front_page_links_resolve():
    """README.md sits outside the site: its links into the manual are checked here."""
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path if path else ROOT / "README.md"
        assert target.exists(), link
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(), flags=re.M)
            assert anchor in {_slug(h) for h in headings}, link


def test_a_committed_history_is_rendered_with_its_command(tmp_path, monkeypatch):
    import json

    from kvspec.model.capabilities import Capabilities

    generate = _generator()
    name, command = generate.RESULTS["history"]
    monkeypatch.setattr(generate, "RESULTS_DIR", tmp_path)
    assert "Not measured yet" in generate.history()
    row = {"version": "0.34.0", "status": "conforms", "cases": 10, "rule": "r",
           "capabilities": Capabilities().as_dict(), "failure": None, "lookup": {"cases": 7, "failure": None},
           "stateful": {"examples": 3, "operations": 40, "failure": None}, "symbolic": {"status": "VERIFIED"}}
    (tmp_path / name).write_text(json.dumps(
        {"schema": "kvspec.history/1", "status": "INCOMPLETE", "seed": 0, "max_examples": 300,
         "planned": ["0.23.0", "0.34.0"], "releases": [row]}))
    page = generate.history()
    assert command in page and "Status: INCOMPLETE, 1 of 2 releases" in page
    assert "| 0.34.0 |" in page and "VERIFIED" in page
    # The status is a RunStatus: a result file with another word fails the build.
    (tmp_path / name).write_text(json.dumps(
        {"schema": "kvspec.history/1", "status": "DONE", "seed": 0, "max_examples": 300,
         "planned": ["0.23.0", "0.34.0"], "releases": [row]}))
    with pytest.raises(ValueError, match="'DONE' is not a valid RunStatus"):
        generate.history()
