"""The contributor's flow: plain pytest, from outside this checkout, runs
kvspec's differential tests against a vLLM tree through the plugin's options,
and the JUnit XML carries kvspec's statistics."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

from kvspec.subjects.provision import ensure_release


def test_pyargs_run_against_a_source_tree(tmp_path):
    tree = ensure_release("0.33.0")  # stands for a contributor's checkout: a directory holding vllm/
    xml = tmp_path / "kvspec.xml"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--pyargs", "kvspec.diff_tests.test_differential", "-k", "test_release_conforms",
         "--kvspec-vllm-src", str(tree), "--kvspec-profile", "dev", f"--junitxml={xml}",
         "-p", "no:cacheprovider"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "kvspec: profile dev; subjects src:" in run.stdout
    cases = {c.get("name"): {p.get("name"): p.get("value") for p in c.iter("property")}
             for c in ET.parse(xml).getroot().iter("testcase")}
    (props,) = [p for name, p in cases.items() if name.startswith("test_release_conforms")]
    assert props["kvspec_subject"] == f"vllm-src {tree}"
    assert props["kvspec_vllm_version"] == "0.33.0"
    assert int(props["kvspec_examples"]) >= 200 and int(props["kvspec_cases"]) > 200
    assert props["kvspec_discrepancies"] == "0"
