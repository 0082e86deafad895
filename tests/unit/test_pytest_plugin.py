"""kvspec's pytest plugin: registered, import-light, inert unless asked, and
its statistics and budget check (the real-vLLM run is in diff_tests)."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from importlib.metadata import entry_points

pytest_plugins = ["pytester"]

HEAVY = ("hypothesis", "z3", "attrs", "kvspec.model", "kvspec.proofs", "kvspec.oracles", "kvspec.subjects",
         "kvspec.diff_tests", "vllm", "torch")


def test_registered_through_the_pytest11_entry_point():
    (plugin,) = [e for e in entry_points(group="pytest11") if e.name == "kvspec"]
    assert plugin.value == "kvspec.pytest_plugin"


def test_loading_the_plugin_imports_nothing_heavy():
    code = "import sys, json, kvspec.pytest_plugin; print(json.dumps(sorted(sys.modules)))"
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                       check=True).stdout)
    heavy = [m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert not heavy, heavy


# A stand-in for the subject fixture: these tests check the plugin's own
# mechanics (statistics, budget), not vLLM, and must run without it.
FAKE_SUBJECT = """
import pytest

class FakeSubject:
    class subject:
        label = "fake subject"
    identity = {"vllm_version": "0.0.test"}

@pytest.fixture(scope="session")
def kvspec_subject():
    return FakeSubject()
"""

PROPERTY = """
from hypothesis import given, strategies as st

@given(st.integers())
def test_property(kvspec_subject, kvspec_stats, x):
    kvspec_stats.examples += 1
    kvspec_stats.cases += {cases}
"""


def _properties(xml_path) -> dict[str, str]:
    case = ET.parse(xml_path).getroot().find(".//testcase")
    return {p.get("name"): p.get("value") for p in case.iter("property")}


def test_statistics_reach_the_junit_xml(pytester):
    pytester.makeconftest(FAKE_SUBJECT)
    pytester.makepyfile(PROPERTY.format(cases=3))
    xml = pytester.path / "out.xml"
    result = pytester.runpytest_subprocess("--kvspec-vllm", "0.33.0", "--kvspec-profile", "dev",
                                           f"--junitxml={xml}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    props = _properties(xml)
    assert props["kvspec_subject"] == "fake subject"
    assert props["kvspec_profile"] == "dev"
    assert int(props["kvspec_examples"]) >= 200  # the dev profile's budget
    assert int(props["kvspec_cases"]) == 3 * int(props["kvspec_examples"])


def test_a_property_that_never_reaches_the_subject_fails(pytester):
    pytester.makeconftest(FAKE_SUBJECT)
    pytester.makepyfile(PROPERTY.format(cases=0))
    result = pytester.runpytest_subprocess("--kvspec-vllm", "0.33.0", "--kvspec-profile", "dev",
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*kvspec: the property ran * of 200 examples (0 cases)*"])


KNOWN_MET = """
from hypothesis import given, strategies as st

@given(st.integers())
def test_property(kvspec_subject, kvspec_stats, x):
    kvspec_stats.examples += 1
    kvspec_stats.cases += {cases}
    if x % 7 == 0:  # as run_recognising counts an example that met a known vLLM bug
        kvspec_stats.known_met["some_known_bug"] = kvspec_stats.known_met.get("some_known_bug", 0) + 1
        kvspec_stats.known_first.setdefault("some_known_bug", f"case {{x}}")
"""


def test_a_property_that_met_a_known_bug_is_an_xfail_saying_it_never_a_pass(pytester):
    pytester.makeconftest(FAKE_SUBJECT)
    pytester.makepyfile(KNOWN_MET.format(cases=1))
    xml = pytester.path / "out.xml"
    result = pytester.runpytest_subprocess("--kvspec-vllm", "0.33.0", "--kvspec-profile", "dev", "-rx",
                                           f"--junitxml={xml}", "-p", "no:cacheprovider")
    result.assert_outcomes(xfailed=1)
    result.stdout.fnmatch_lines(["*known vLLM bug(s) of fake subject met and recognised (model/known.py): "
                                 "some_known_bug in * example(s) (first: case *); the whole budget ran*"])
    assert _properties(xml)["kvspec_known_met"].startswith("some_known_bug in ")


def test_a_short_budget_fails_even_when_a_known_bug_was_met(pytester):
    pytester.makeconftest(FAKE_SUBJECT)
    pytester.makepyfile(KNOWN_MET.format(cases=0))
    result = pytester.runpytest_subprocess("--kvspec-vllm", "0.33.0", "--kvspec-profile", "dev",
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*kvspec: the property ran * of 200 examples (0 cases)*"])


def test_without_kvspec_options_hypothesis_settings_are_untouched(pytester, monkeypatch):
    # Compared with the same run with the plugin disabled, because the baseline
    # itself differs by machine (Hypothesis loads its "ci" profile on CI hosts).
    monkeypatch.delenv("KVSPEC_PROFILE", raising=False)
    pytester.makepyfile("""
        import os, pathlib
        from hypothesis import settings
        def test_record_profile():
            out = pathlib.Path(os.environ["PROFILE_OUT"])
            out.write_text(settings._current_profile + " " + repr(settings()))
    """)
    profiles = {}
    for label, extra in (("without", ["-p", "no:kvspec"]), ("with", [])):
        monkeypatch.setenv("PROFILE_OUT", str(pytester.path / label))
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *extra)
        result.assert_outcomes(passed=1)
        profiles[label] = (pytester.path / label).read_text()
    assert profiles["with"] == profiles["without"]
    assert not profiles["with"].startswith("kvspec-")


def test_kvspec_profiles_do_not_inherit_hypothesis_ci_profile(pytester, monkeypatch):
    monkeypatch.setenv("CI", "true")  # what makes Hypothesis load its derandomizing "ci" profile
    pytester.makepyfile("""
        from hypothesis import settings
        def test_profile():
            assert settings._current_profile == "kvspec-ci"
            assert settings().derandomize is False
            assert settings().max_examples == 2000
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kvspec-profile", "ci")
    result.assert_outcomes(passed=1)


def test_subject_options_parametrize_the_subject_fixture(pytester):
    pytester.makepyfile("""
        def test_uses(kvspec_subject):
            pass
    """)
    result = pytester.runpytest_subprocess("--collect-only", "-q", "--kvspec-vllm", "0.30.0",
                                "--kvspec-vllm-src", "/some/checkout", "--kvspec-current")
    result.stdout.fnmatch_lines(["*test_uses[[]vllm-0.30.0[]]", "*test_uses[[]src:/some/checkout[]]",
                                 "*test_uses[[]current[]]"])


def test_kvspec_profile_alone_changes_only_tests_that_use_kvspec(pytester, monkeypatch):
    """The variable alone must not change another project's Hypothesis settings;
    a test that uses a kvspec fixture gets the profile (or a clear failure)."""
    monkeypatch.setenv("KVSPEC_PROFILE", "ci")
    pytester.makepyfile(test_plain="""
        from hypothesis import settings
        def test_plain():
            assert not settings._current_profile.startswith("kvspec-")
    """)
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
    pytester.makeconftest(FAKE_SUBJECT)
    pytester.makepyfile(test_uses_kvspec="""
        from hypothesis import settings
        def test_uses(kvspec_subject, kvspec_stats):
            assert settings._current_profile == "kvspec-ci"
    """)
    assert pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_uses_kvspec.py").ret == 0
    monkeypatch.setenv("KVSPEC_PROFILE", "weekly")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_uses_kvspec.py")
    result.stdout.fnmatch_lines(["*KVSPEC_PROFILE='weekly' is not a kvspec profile*"])
    assert result.ret == 1


def test_a_bad_database_is_a_usage_error(pytester):
    result = pytester.runpytest_subprocess("--kvspec-database", "redis://127.0.0.1:1/0", "-p", "no:cacheprovider")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*--kvspec-database: cannot reach the example database*"])


def test_another_projects_run_has_no_kvspec_marker_or_header(pytester):
    """Issue 28: the plugin registered `vllm` globally, so --strict-markers no
    longer caught a misspelt marker in an unrelated project."""
    pytester.makepyfile("""
        import pytest

        @pytest.mark.vllm
        def test_marked():
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--strict-markers")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*'vllm' not found in `markers` configuration option*"])
    assert "kvspec:" not in result.stdout.str()


def test_a_kvspec_option_brings_the_marker_and_the_header(pytester):
    pytester.makepyfile("""
        import pytest

        @pytest.mark.vllm
        def test_marked():
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--strict-markers",
                                           "--kvspec-profile", "dev")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["kvspec: profile dev; subjects *"])


def test_a_kvspec_fixture_without_an_option_says_what_it_ran_against(pytester):
    pytester.makeconftest(FAKE_SUBJECT)
    pytester.makepyfile("""
        def test_uses(kvspec_subject):
            assert kvspec_subject.subject.label == "fake subject"
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)  # the default releases
    lines = result.stdout.lines
    header = [i for i, line in enumerate(lines) if line.startswith("kvspec: profile")]
    assert header and header[0] > next(i for i, line in enumerate(lines) if "test_" in line and ".py" in line)
