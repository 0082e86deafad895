"""Snapshot tests of every renderer on one fixed finding (a real #50062 run, stored),
and the properties a reviewer relies on: impact first, exact labels, no
machine-local path in Markdown, a readable plot, an emitted test that passes
vLLM's own ruff configuration."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

import attrs
import pytest

from kvspec.model.finding import Finding, Reach
from kvspec.model.outcome import Outcome
from kvspec.report.finding import render_markdown, render_text
from kvspec.report.fuzz import render_markdown as render_fuzz_markdown
from kvspec.report.plot import plot_data, render_png, render_svg
from kvspec.emit.regression_test import ASSERT_MESSAGE, FILE_NAME, emit_test, pytest_command
from kvspec.emit.vllm_tests import Idiom

from tests.support import FIXTURES, assert_snapshot, capabilities

FIXTURE = FIXTURES / "finding_refloor_50062.json"
HELPERS = {"helpers": "tests.v1.core.test_prefix_caching"}


@pytest.fixture
def finding() -> Finding:
    return Finding.from_dict(json.loads(FIXTURE.read_text()))


@pytest.fixture
def caps():
    """0.33.0's capabilities with the keyword names its worker reports."""
    return attrs.evolve(capabilities("0.33.0"),
                        manager_keywords=["kv_cache_config", "max_model_len", "scheduler_block_size",
                                          "hash_block_size", "max_in_flight_tokens", "enable_caching",
                                          "use_eagle", "num_hash_lookahead_tokens", "num_prefill_lookahead",
                                          "log_stats", "dcp_world_size"],
                        request_keywords=["request_id", "prompt_token_ids", "sampling_params",
                                          "pooling_params", "block_hasher", "arrival_time"])


def _with_helpers(finding: Finding) -> Finding:
    """The finding as a run on 0.33.0 records it: its tests' helpers known."""
    return attrs.evolve(finding, regression_test={**finding.regression_test, "idiom": HELPERS})


def test_text(finding):
    text = render_text(finding)
    assert text.startswith("IMPACT: For this finding's own geometry only (no deployment profile assessed), "
                           "a request whose computed tokens end at n = 2 leaves 1 of its 2 registrable tokens")
    assert_snapshot("finding.txt", text + "\n")


def test_markdown(finding):
    text = render_markdown(_with_helpers(finding))
    assert text.startswith("**Impact:** For this finding's own geometry only")
    assert_snapshot("finding.md", text)


def test_markdown_leads_with_the_deployment_assessment_when_there_is_one(finding):
    reach = Reach(summary="On Nemotron-H with an EAGLE3 drafter and legacy hashes, a 4,000-token request "
                          "leaves 1,011 tokens unregistered at its end.",
                  profiles=({"profile": "nemotron-h + eagle3", "flags": "legacy hashes",
                             "impact": {"tokens_lost_at_end": 1011}},),
                  worst={"profile": "nemotron-h + eagle3", "tokens_lost_at_end": 1011})
    text = render_markdown(attrs.evolve(finding, reach=reach))
    first, *rest = text.splitlines()
    assert first == f"**Impact:** {reach.summary}"
    assert "own geometry" not in text
    assert "- nemotron-h + eagle3: flags legacy hashes, tokens_lost_at_end 1011" in rest
    hardening = render_text(attrs.evolve(finding, reach=attrs.evolve(reach, profiles=(), hardening=True)))
    assert hardening.startswith("IMPACT: Hardening, not a regression: On Nemotron-H")
    assert "no known deployment reaches it: hand-built geometry only" in hardening


def test_labels_say_what_they_count(finding):
    """Calls counted from 1 in words, cases not examples, the whole run's time
    named as such, per-length sweep statements instead of a sum over unrelated
    prompts, and what a request loses at its end."""
    text = render_text(finding)
    assert "cache_blocks call 2 (counted from 1)" in text and "call 1," not in text
    assert ("72 Hypothesis examples, 454 differential cases; first discrepancy after 69 cases "
            "(0.13 s into fuzzing); fuzzing and shrinking 0.89 s in all") in text
    assert "shrunk in" not in text and "examples_to_first_failure" not in text
    assert "net tokens" not in text
    assert ("group 1 (full attention, block 1, EAGLE) registers 1 token fewer than the spec at each of "
            "n = 2, 5, 8, 11, 14, 17, 20, 23") in text
    assert "calls do not add up: registration accumulates" in text
    assert "passed on unmutated" in text and "FIXED" not in text


def test_every_kept_term_is_defined_once(finding):
    text = render_markdown(finding)
    glossary = text[text.index("<summary>Glossary</summary>"):]
    for term in ("ledger", "oracle", "P / E", "R", "S_max", "spec", "subject", "partial hash hits"):
        assert glossary.count(f"- **{term}**:") == 1, term
    assert "**regime**" not in glossary  # the report does not use the word: not defined


def test_markdown_has_no_machine_local_path(finding, tmp_path, monkeypatch):
    """Paths anywhere in the finding (labels, artifacts, replay, traceback) never
    reach the Markdown meant for a pull request."""
    monkeypatch.chdir(tmp_path)
    local = str(tmp_path / "findings" / "f")
    subject = {**finding.compared["subject"], "label": "vllm-src /home/someone/vllm",
               "path": "/home/someone/vllm"}
    f = attrs.evolve(finding, compared={**finding.compared, "subject": subject},
                     artifacts={"finding": f"{local}.json", "plot": f"{local}.svg", "plot_png": f"{local}.png"},
                     replay=f"kvspec replay {local}.json",
                     traceback='File "/home/someone/vllm/vllm/v1/core/x.py", line 3\nValueError: x')
    text = render_markdown(f)
    local_path = r"(?<![\w.:/<)-])(?:/|~/)[\w.-]+/\S*"  # two components at least: not "</b>", "(n-R)/S"
    assert not re.findall(local_path, text)
    assert re.findall(local_path, render_text(f))  # the terminal keeps them: they are useful there
    assert "![Registered vs computed tokens, spec vs subject](findings/f.png)" in text
    assert "kvspec replay findings/f.json" in text
    elsewhere = attrs.evolve(f, artifacts={"plot_png": "/elsewhere/g.png"})
    assert "](g.png)" in render_markdown(elsewhere)


def test_markdown_degrades_to_a_table_without_a_plot(finding):
    text = render_markdown(attrs.evolve(finding, artifacts={}))
    assert "![" not in text
    assert "Where the sweep differs:\n\n| group | n | spec tokens | subject tokens | lost tokens |" in text
    assert "| 1 | 23 | 23 | 22 | 1 |" in text


def _fuzz_run(finding, stopped=None):
    """A one-subject fuzz run holding ``finding``, as the fuzz command records it."""
    from kvspec.diff_tests.fuzz import FuzzResult
    from kvspec.diff_tests.property import Failure, Tally
    from kvspec.model.case import Case
    from kvspec.usecases.fuzz import FuzzRun, FuzzSettings, SubjectRun

    failure = Failure(Case.from_dict(finding.inputs), (), {})
    result = FuzzResult(subject=finding.compared["subject"], capabilities=capabilities("0.33.0"), seed=1,
                        tally=Tally(cases=finding.run["cases"], examples=finding.run["examples"]),
                        seconds=finding.run["seconds"], failure=failure,
                        cases_to_first_failure=finding.run["cases_to_first_failure"])
    run = FuzzRun(FuzzSettings(max_examples=500, seed=1), [finding.compared["subject"]["label"], "vllm 0.34.0"],
                  [SubjectRun(result, finding)])
    if stopped is not None:
        run.stopped, run.stopped_why = stopped
    return run


def test_fuzz_markdown(finding, monkeypatch):
    import kvspec.report.fuzz as fuzz_report

    monkeypatch.setattr(fuzz_report, "versions", lambda: finding.compared["versions"])
    run = _fuzz_run(_with_helpers(finding))
    run.planned = run.planned[:1]
    text = render_fuzz_markdown(run)
    assert text.startswith("**Impact:** For this finding's own geometry only")
    assert text.count("**Impact:**") == 1  # once, first: not again in the finding's section
    assert ("| differential | verdict | Hypothesis examples | checked | to the first discrepancy | "
            "fuzzing and shrinking (s) |") in text
    assert_snapshot("fuzz_report.md", text)


def test_a_subjects_result_is_said_by_the_renderer_from_the_typed_result(finding):
    from kvspec.report.fuzz import subject_run_lines
    from kvspec.usecases.fuzz import SubjectRun

    run = _fuzz_run(finding)
    found = subject_run_lines(attrs.evolve(run.subjects[0], finding_path=None))
    assert found[0] == render_text(finding) and "  NOT STORED: it is only in this run's reports" in found
    clean = attrs.evolve(run.subjects[0].result, failure=None, seconds=2.0, restarts=("the worker was killed",))
    lines = subject_run_lines(SubjectRun(clean, jobs=2))
    assert lines[0] == (f"{finding.compared['subject']['label']} [registration]: no discrepancy in "
                        f"{clean.coverage()} (2.0 s, {clean.cases / 2:.0f} cases/s, 2 jobs); 1 worker restart(s) "
                        "the retry did not reproduce (the machine's, not vLLM's): the worker was killed")
    assert any(line.startswith("  not covered: ") for line in lines)
    reused = subject_run_lines(SubjectRun(clean, reused="reused the control's recorded run", jobs=2))
    assert reused[0].endswith("; reused the control's recorded run (it took 2.0 s then)")
    stopped = attrs.evolve(clean, stopped=Outcome.INTERRUPTED, stopped_why="interrupted")
    assert subject_run_lines(SubjectRun(stopped))[0].endswith(f": STOPPED after {clean.cases} cases: interrupted")


def test_an_interrupted_run_never_reads_as_clean(finding):
    from kvspec.model.outcome import Outcome

    run = _fuzz_run(finding, stopped=(Outcome.INTERRUPTED, "interrupted while fuzzing vllm 0.34.0"))
    run.subjects[0].finding = None
    run.subjects[0].result.failure = None
    text = render_fuzz_markdown(run)
    first = text.splitlines()[0]
    assert first.startswith("## kvspec fuzz: INTERRUPTED (interrupted while fuzzing vllm 0.34.0; 1 of 2")
    assert "no discrepancy found so far" in first and "| vllm 0.34.0 | | | not run | | | | |" in text
    # A subject the stop cut short is not counted as covered: said apart.
    run.subjects[0].result.stopped = Outcome.INTERRUPTED
    run.subjects[0].result.stopped_why = "interrupted"
    first = render_fuzz_markdown(run).splitlines()[0]
    assert "; 0 of 2 subjects covered, 1 stopped part-way)" in first, first


def test_a_run_status_is_one_enum_serialised_to_the_same_strings(finding):
    from kvspec.model.outcome import Outcome, RunStatus
    from kvspec.report.fuzz import fuzz_document

    # The strings the result files (and docs/results) have always held.
    assert [s.value for s in RunStatus] == ["COMPLETE", "REDUCED SCOPE", "INCOMPLETE", "INTERRUPTED"]
    for stopped, status in ((None, RunStatus.COMPLETE), (Outcome.INTERRUPTED, RunStatus.INTERRUPTED),
                            (Outcome.INFRASTRUCTURE, RunStatus.INCOMPLETE)):
        run = _fuzz_run(finding, stopped=None if stopped is None else (stopped, "why"))
        assert run.status is status
        run.subjects = []  # the document's status, without serialising the test's hand-made failure
        assert fuzz_document(run)["status"] == status.value
        assert json.loads(json.dumps(fuzz_document(run)))["status"] == status.value


def test_json(finding):
    assert_snapshot("finding.json", json.dumps(finding.to_dict(), indent=2, sort_keys=True) + "\n")


def test_plot_shows_steps_the_loss_and_the_finding(finding):
    data = plot_data(finding)
    assert_snapshot("finding.plot.json", json.dumps(data, indent=1) + "\n")
    (panel,) = data["panels"]  # one group differs
    assert panel["group"] == 1 and data["finding_n"] == 2
    assert panel["lost"][panel["n"].index(2)] == 1  # a one-token loss, drawn as its own bar
    assert sum(1 for lost in panel["lost"] if lost) == len(finding.sweep["differing_n"])
    assert "/" not in data["subject"] and "~" not in data["subject"]  # no local path in the picture


def test_svg_and_png_are_drawn_with_labelled_axes(finding):
    svg = render_svg(finding)
    assert svg.startswith("<?xml") and "<svg" in svg
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    for label in ("0", "10", "20", "tokens registered", "computed tokens n (a single prefill of n tokens)",
                  "spec: may register (= n: every computed token)", "the finding (n = 2)"):
        assert label in texts, label
    assert render_svg(finding) == svg  # deterministic: no date, stable ids
    assert render_png(finding).startswith(b"\x89PNG\r\n\x1a\n")


def test_plot_needs_a_sweep(finding):
    with pytest.raises(ValueError, match="no sweep"):
        render_svg(attrs.evolve(finding, sweep=None))


def test_emitted_regression_test(finding, caps):
    code = emit_test(finding, caps, Idiom(helpers=True))
    ast.parse(code)
    # The finding's own scenario: a 1-token prefill, then the decode whose call differs.
    assert 'make_request("0", list(range(1)), HASH_BLOCK_SIZE, sha256)' in code
    assert "assert manager.allocate_slots(req, 1, num_computed, computed_blocks) is not None" in code
    assert code.count("manager.allocate_slots(") == 2
    assert "expected = [[1, 2], [1, 2]]" in code and ASSERT_MESSAGE in code
    assert "from tests.v1.core.test_prefix_caching import make_kv_cache_manager, make_request" in code
    # Nothing names kvspec or the mutant; no import shim; hash scheme and EAGLE said and explained.
    assert not re.search(r"kvspec|refloor|mutant|50062|except ImportError", code, re.IGNORECASE)
    assert "# Legacy block hashes (sha256, no lookahead tokens)" in code
    assert "# EAGLE groups drop their lookahead block at registration.\n        use_eagle=True," in code
    assert max(len(line) for line in code.splitlines()) <= 88
    assert len(code.splitlines()) < 100  # reviewers reject bloated tests
    assert_snapshot("regression_test.py.txt", code)
    assert pytest_command(finding) == (
        f"pytest tests/v1/core/{FILE_NAME}::test_cache_blocks_bound_hybrid_eagle_partial_hits_after_decode")


def test_emitted_regression_test_without_helpers_builds_its_own(finding, caps):
    code = emit_test(finding, caps)
    assert "tests.v1.core" not in code and "manager = KVCacheManager(" in code
    assert "eos_token_id" not in code  # this release's Request takes no such keyword
    assert_snapshot("regression_test_standalone.py.txt", code)


def test_xfail_form_pins_the_defect(finding, caps):
    code = emit_test(finding, caps, Idiom(helpers=True), xfail=True)
    imports = [line for line in code.splitlines() if line.startswith(("import ", "from "))]
    assert imports[0] == "import pytest"
    assert ('@pytest.mark.xfail(strict=True, reason="known defect: bound differs")\n'
            "def test_cache_blocks_bound_hybrid_eagle_partial_hits_after_decode(monkeypatch):") in code


def _ruff(*args, cwd):
    return subprocess.run([sys.executable, "-m", "ruff", *args], capture_output=True, text=True, cwd=cwd)


@pytest.mark.parametrize("helpers", [True, False])
@pytest.mark.parametrize("xfail", [False, True])
@pytest.mark.parametrize("variant", ["finding", "drafts", "three groups", "lookup", "long lists"])
def test_emitted_tests_pass_vllm_ruff(finding, caps, tmp_path, helpers, xfail, variant):
    """``ruff check`` and ``ruff format --check`` with vLLM 0.33.0's own
    configuration, the test placed as in vLLM's repository (ruff tells
    first-party imports by finding their files, so the modules it imports
    are laid out too)."""
    inputs = dict(finding.inputs)
    if variant == "drafts":
        inputs.update(prompt_len=13, steps=[{"kind": "prefill", "tokens": 7, "drafts": 0, "accepted": 0},
                                            {"kind": "prefill", "tokens": 6, "drafts": 0, "accepted": 0},
                                            {"kind": "decode", "tokens": 0, "drafts": 3, "accepted": 1}],
                      expected_calls=[[6, 7], [12, 12], [15, 14]])
    elif variant == "three groups":
        config = {**inputs["config"], "scheduler_block_size": 48, "hash_block_size": 16,
                  "num_prefill_lookahead": 2, "groups": [
                      {"kind": "mamba_align", "block_size": 48, "eagle": False, "sliding_window": 0},
                      {"kind": "full_attention", "block_size": 16, "eagle": True, "sliding_window": 0},
                      {"kind": "sliding_window", "block_size": 16, "eagle": False, "sliding_window": 64}]}
        inputs.update(config=config, prompt_len=100, steps=[{"kind": "prefill", "tokens": 100, "drafts": 0,
                                                               "accepted": 0}],
                      expected_calls=[[96, 79, 99]])
    elif variant == "lookup":
        inputs.update(probe={"shared": 3, "extra": 2}, expected_hit=2)
    elif variant == "long lists":  # many calls, many admissible hits: ruff format's wrapping
        steps = [{"kind": "prefill", "tokens": 1, "drafts": 0, "accepted": 0}]
        steps += [{"kind": "decode", "tokens": 0, "drafts": 0, "accepted": 0}] * 40
        inputs.update(prompt_len=1, steps=steps, expected_calls=[[n, n] for n in range(1, 42)],
                      probe={"shared": 40, "extra": 1}, admissible_hits=list(range(0, 42)))
    f = attrs.evolve(finding, inputs=inputs)
    if variant == "long lists":
        code = emit_test(attrs.evolve(f, category="hit_mismatch"), caps, Idiom(helpers=helpers), xfail=xfail)
        assert "    admissible = [\n" in code
        _ruff_clean(tmp_path, code)
    if variant == "lookup":
        from kvspec.model.finding import Category

        f = attrs.evolve(f, category=Category.HIT_MISMATCH)
    code = emit_test(f, caps, Idiom(helpers=helpers), xfail=xfail)
    _ruff_clean(tmp_path, code)


def _ruff_clean(tmp_path, code):
    ast.parse(code)
    (tmp_path / "pyproject.toml").write_text((FIXTURES / "vllm-0.33.0-ruff.toml").read_text())
    for module in ("vllm/__init__.py", "vllm/sampling_params.py", "vllm/utils/__init__.py",
                   "vllm/utils/hashing.py", "vllm/v1/__init__.py", "vllm/v1/core/__init__.py",
                   "vllm/v1/core/kv_cache_manager.py", "vllm/v1/core/kv_cache_utils.py",
                   "vllm/v1/kv_cache_interface.py", "vllm/v1/request.py", "tests/__init__.py",
                   "tests/v1/__init__.py", "tests/v1/core/__init__.py", "tests/v1/core/test_prefix_caching.py"):
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).touch()
    test = tmp_path / "tests" / "v1" / "core" / FILE_NAME
    test.write_text(code)
    rel = str(test.relative_to(tmp_path))
    check = _ruff("check", "--no-cache", rel, cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    fmt = _ruff("format", "--no-cache", "--check", "--diff", rel, cwd=tmp_path)
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr
    # And the check can fail: a line past 88 columns is caught.
    test.write_text(code + "\nx = " + "1 + " * 30 + "1\n")
    assert _ruff("check", "--no-cache", rel, cwd=tmp_path).returncode != 0


@pytest.mark.parametrize("pinned", [{"expected_hit": 4, "admissible_hits": [0, 2, 4]},
                                    {"admissible_hits": [0, 2, 4]}, {}])
def test_emitted_lookup_regression_test(finding, pinned):
    """A lookup finding's test drives the writer, then the later request, and
    pins the spec's hit (exact model) or the contract's admissible hits."""
    from kvspec.emit.regression_test import LOOKUP_ASSERT_MESSAGE
    from kvspec.model.finding import Category

    inputs = {**finding.inputs, "probe": {"shared": 3, "extra": 2}, **pinned}
    inputs.pop("expected_calls", None)
    lookup = attrs.evolve(finding, category=Category.HIT_MISMATCH, inputs=inputs, sweep=None)
    code = emit_test(lookup, capabilities("0.33.0"))
    if not pinned:
        assert code is None  # nothing the subject pins: no test rather than a vacuous one
        return
    ast.parse(code)
    assert "shared = list(req.all_token_ids)[:3]" in code and "range(2)" in code
    assert LOOKUP_ASSERT_MESSAGE in code
    if "expected_hit" in pinned:
        assert "expected = 4\n    assert hit == expected, " in code
    else:
        assert "admissible = [0, 2, 4]\n    assert hit in admissible, " in code
    assert "def test_prefix_hit_hybrid_eagle_partial_hits_after_decode():" in code


def test_report_command_writes_every_form(tmp_path, monkeypatch):
    from kvspec.model.outcome import Outcome
    from kvspec.cli import main

    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    out, plot, png, test = tmp_path / "r.md", tmp_path / "p.svg", tmp_path / "p.png", tmp_path / "test_x.py"
    code = main(["report", str(FIXTURE), "--format", "markdown", "--output", str(out),
                 "--plot", str(plot), "--emit-test", str(test)])
    assert code == Outcome.OK.exit_code
    assert out.read_text() == summary.read_text()
    assert out.read_text().startswith("**Impact:** For this finding's own geometry only")
    assert "<svg" in plot.read_text()
    ast.parse(test.read_text())
    assert main(["report", str(FIXTURE), "--plot", str(png)]) == Outcome.OK.exit_code
    assert png.read_bytes().startswith(b"\x89PNG")


def test_report_of_a_file_without_findings_is_a_usage_error(tmp_path, capsys):
    from kvspec.model.outcome import Outcome
    from kvspec.cli import main

    empty = tmp_path / "prove.json"
    empty.write_text('{"schema": "kvspec.prove/1", "findings": []}')
    assert main(["report", str(empty)]) == Outcome.USAGE.exit_code
    assert "holds no finding" in capsys.readouterr().err


# -- the other renderers: one snapshot each, on small fixed inputs --------------

def test_kill_matrix_snapshot():
    from kvspec.report.mutants import KillRow, render_matrix

    rows = [{"mutant": "refloor_50062", "model": "non-equivalent", "status": "killed", "cases_to_kill": 3708,
             "seconds_to_kill": 2.67, "exhaustive": "killed", "exhaustive_failing": 412, "exhaustive_seconds": 9.8,
             "symbolic": "REFUTED", "symbolic_seconds": 2.9, "category": "under_registration"},
            {"mutant": "clamp_as_conditional", "model": "equivalent", "status": "survived",
             "cases_to_kill": None, "seconds_to_kill": None, "exhaustive": "survived", "exhaustive_failing": 0,
             "exhaustive_seconds": 9.5, "symbolic": "VERIFIED", "symbolic_seconds": 3.1, "category": None},
            {"mutant": "touch_keeps_free_block", "model": "state side", "status": "killed", "fuzz": "survived",
             "cases_to_kill": None, "seconds_to_kill": None, "stateful": "killed", "programs_to_kill": 7,
             "stateful_seconds_to_kill": 0.21, "exhaustive": "n/a", "symbolic": "n/a",
             "stateful_category": "state_free_blocks"}]
    text = render_matrix([KillRow.parse(r) for r in rows])
    assert "cases to kill" in text.splitlines()[0] and "programs to kill" in text.splitlines()[0]
    assert_snapshot("mutants_matrix.txt", text + "\n")


def test_history_table_snapshot():
    from kvspec.report.history import ReleaseRow, render_table

    caps = capabilities("0.33.0").as_dict()
    rows = [{"version": "0.33.0", "status": "conforms", "capabilities": caps, "rule": "cacheable_tokens_032",
             "cases": 11234, "failure": None, "lookup": {"cases": 10987, "failure": None},
             "stateful": {"examples": 300, "operations": 7021, "failure": None},
             "symbolic": {"status": "VERIFIED"}},
            {"version": "0.22.0", "status": "unsupported", "detail": "KVCacheManager takes no scheduler_block_size"}]
    assert_snapshot("history_table.md", render_table([ReleaseRow.parse(r) for r in rows], symbolic=True) + "\n")


def test_hitrate_text_snapshot():
    from kvspec.report.hitrate import HitrateFile, render_text
    from kvspec.usecases.hitrate import compare_with_reference

    def row(label, hits, mutant):
        rate = sum(hits) / (100 * len(hits))
        return {"label": label, "vllm_version": "0.33.0", "mutant": mutant, "scheduler_block_size": 64,
                "ideal_exact": True, "hits": hits, "hit_rate": rate, "requests": len(hits),
                "prompt_lengths": [100] * len(hits), "turns": [0] * len(hits), "per_turn": [rate],
                "ideal_hits": [50] * len(hits), "ideal_hit_rate": 0.5, "ideal_per_turn": [0.5],
                "model_rule": "spec", "model_hit_rate": 0.5, "model_matches_per_request": hits == [50, 50]}

    rows = [row("vllm 0.33.0", [50, 50], False), row("0.33.0 + m", [50, 30], True)]
    compare_with_reference(rows)
    doc = {"verdict": "HIT-RATE DIFFERENCE", "layout": "full attention 16", "workload": {"text": "2 requests"},
           "subjects": rows, "errors": []}
    assert_snapshot("hitrate.txt", render_text(HitrateFile.parse(doc)) + "\n")


def test_mtp_reports_snapshot():
    from kvspec.report.mtp import render_markdown as mtp_markdown
    from kvspec.report.mtp import render_text as mtp_text

    theorem = {"name": "mtp.no_stale_draft_reuse.partial_hits", "statement": "no hit keeps stale draft KV",
               "status": "REFUTED", "as_expected": True,
               "counterexample": {"values": {"S": 4, "H": 2, "B": 4, "L": 3, "n": 4, "E": True, "P": True}}}
    scheme = {"witnesses": 2, "cases": 354, "error_count": 0, "errors": [],
              "smallest": {"text": "S=4 H=2 L=3 prompt=6 shared=4"}, "model_necessary": True,
              "model_condition_matches": True, "whole_block_condition_matches": False}
    doc = {"verdict": "COUNTEREXAMPLE", "command": "kvspec mtp --vllm 0.33.0", "theorems": [theorem],
           "subjects": [{"subject": "vllm 0.33.0", "vllm_version": "0.33.0",
                         "schemes": {"legacy hashes + EAGLE drop": scheme}}]}
    assert_snapshot("mtp.txt", mtp_text(doc) + "\n")
    assert_snapshot("mtp.md", mtp_markdown(doc) + "\n")


def test_the_sweep_always_covers_the_findings_own_length():
    """Small scope: whole periods from n = 1; real sizes (a Mamba page of
    1,120 tokens): 160 lengths centred on n, so the plot shows where the loss
    starts instead of 160 lengths that all agree."""
    from kvspec.model.case import Case, prefill
    from kvspec.model.domain import CoordinatorConfig, GroupKind, KVCacheGroup
    from kvspec.subjects.drivers.sweep import MAX_POINTS, sweep_range

    def case(S: int, B: int) -> Case:
        config = CoordinatorConfig(groups=(KVCacheGroup(GroupKind.MAMBA_ALIGN, S // 2),
                                           KVCacheGroup(GroupKind.FULL_ATTENTION, B, eagle=True)),
                                   scheduler_block_size=S, hash_block_size=16 if S > 16 else 1)
        return Case(config, 1, (prefill(1),))

    assert sweep_range(case(8, 2), 2) == range(1, 65)
    assert sweep_range(case(1120, 560), None) == range(1, MAX_POINTS + 1)
    real = sweep_range(case(1120, 560), 561)
    assert len(real) == MAX_POINTS and real[0] < 561 < real[-1] and real[0] == 481


def test_the_header_is_the_releases_own_and_a_recorded_one_is_checked(tmp_path):
    """An emitted test opens with the licence lines of the release's own test
    files (kvspec carries none); from a finding (untrusted) only lines of the
    SPDX comment form are taken."""
    from kvspec.emit.vllm_tests import HELPER_FILE, idiom_of

    helper = tmp_path / HELPER_FILE
    helper.parent.mkdir(parents=True)
    helper.write_text("# SPDX-License-Identifier: Example-1.0\n# an ordinary comment\n\n"
                      "def make_kv_cache_manager(kv_cache_config, **kwargs): ...\n"
                      "def make_request(request_id, prompt_token_ids, block_size, hash_fn): ...\n")
    idiom = idiom_of(tmp_path)
    assert idiom == Idiom(helpers=True, header=("# SPDX-License-Identifier: Example-1.0",))
    assert Idiom.from_recorded(idiom.as_dict()) == idiom
    hostile = {**idiom.as_dict(), "header": ["import os; os.system('x')", "# SPDX-X: ok\nimport os", 7]}
    assert Idiom.from_recorded(hostile).header == ()


def test_the_reproduce_line_names_the_differential_that_found_it(finding):
    # A stateful finding rerun without --stateful would fuzz the registration
    # boundary, which does not see it.
    released = attrs.evolve(finding, compared={**finding.compared, "subject": {
        "kind": "mutant", "version": "0.34.0", "mutant": "hit_keeps_trimmed_blocks"}}, run={"seed": 4})
    command = "kvspec fuzz --vllm 0.34.0 --mutant hit_keeps_trimmed_blocks"
    assert f"{command} --seed 4" in render_text(released)
    stateful = attrs.evolve(released, inputs={**finding.inputs, "program": {"ops": []}})
    assert f"{command} --stateful --seed 4" in render_text(stateful)
    lookup = attrs.evolve(released, inputs={**finding.inputs, "probe": {"shared": 3, "extra": 2}})
    assert f"{command} --lookup --seed 4" in render_text(lookup)


def test_the_subject_line_names_a_mutants_side(finding):
    from kvspec.report.finding import subject_line

    def line(mutant):
        return subject_line(attrs.evolve(finding, compared={**finding.compared, "mutant": mutant}))

    state = {"operator": "free_cached_block_misses", "models_variant": "", "side": "state"}
    assert line(state).endswith("kvspec mutant free_cached_block_misses (state side)")
    assert line({**state, "side": "lookup"}).endswith("(lookup side)")
    # Stored before the side was recorded: a mutant without a variant was on the lookup side.
    assert line({"operator": "hit_off_by_one", "models_variant": ""}).endswith("(lookup side)")
    assert line({"operator": "refloor_50062", "models_variant": "floored"}).endswith("(models floored)")


def test_a_shrink_cut_short_by_its_budget_is_said_in_the_run_line(finding):
    from kvspec.report.finding import run_line

    assert "budget" not in (run_line(finding) or "")
    cut = attrs.evolve(finding, run={**finding.run, "shrink_budget": 400})
    line = run_line(cut)
    assert "shrinking stopped at its budget of 400 test runs" in line
    assert "budget of 400 test runs" in render_text(cut) and "budget of 400 test runs" in render_markdown(cut)
