"""The architecture, checked on what the wheel installs: imports point one
way (import-linter's contracts in pyproject.toml), only the ``kvspec`` name
is installed, and the tests keep to public names."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOP_LEVEL_FOLDERS = ("model", "proofs", "oracles", "subjects", "diff_tests")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel of this checkout, unpacked as pip would install it."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(ROOT)], check=True, capture_output=True)
    (wheel,) = out.glob("kvspec-*.whl")
    site = out / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def _lint_imports(site: Path) -> subprocess.CompletedProcess:
    lint = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([str(lint), str(ROOT / "pyproject.toml")], cwd=site, env=env,
                          capture_output=True, text=True)


def test_the_wheel_installs_only_the_kvspec_name(installed):
    names = {p.name for p in installed.iterdir()}
    assert {n for n in names if not n.endswith(".dist-info")} == {"kvspec"}
    assert {p.name for p in (installed / "kvspec").iterdir()} >= set(TOP_LEVEL_FOLDERS)


def test_outside_the_checkout_model_is_not_importable_and_kvspec_model_is(installed, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(installed)}
    bare = subprocess.run([sys.executable, "-c", "import model"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert bare.returncode != 0 and "No module named 'model'" in bare.stderr
    namespaced = subprocess.run([sys.executable, "-c", "import kvspec.model, kvspec.cli; print(kvspec.model.__file__)"],
                                cwd=tmp_path, env=env, capture_output=True, text=True)
    assert namespaced.returncode == 0, namespaced.stderr
    assert namespaced.stdout.strip().startswith(str(installed))


def test_the_import_contracts_hold(installed):
    run = _lint_imports(installed)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "Contracts: 3 kept, 0 broken." in run.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("model/zz_upward.py", "from kvspec.cli import main", "Layers point one way BROKEN"),
    ("oracles/zz_sideways.py", "import kvspec.proofs.runner", "Layers point one way BROKEN"),
    ("commands/zz_other.py", None, "Commands never import one another BROKEN"),
    ("report/zz_bare.py", "import model", "Only the kvspec namespace: no generic top-level names BROKEN"),
])
def test_the_contracts_catch_a_wrong_import(installed, tmp_path, module, line, contract):
    """The control: the same check fails on a tree with one wrong import."""
    site = tmp_path / "site"
    shutil.copytree(installed, site)
    target = site / "kvspec" / module
    if line is None:  # one command importing another
        target = site / "kvspec" / "commands" / "check.py"
        target.write_text(target.read_text() + "\nfrom kvspec.commands import fuzz  # noqa\n")
    else:
        target.write_text(line + "\n")
    run = _lint_imports(site)
    assert run.returncode != 0 and contract in run.stdout, run.stdout[-3000:]


def _test_modules():
    return sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "diff_tests").glob("test_*.py"))


def test_tests_import_only_public_names_and_no_other_test_module():
    found = []
    for path in _test_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                top = node.module.split(".")[0]
                if top in TOP_LEVEL_FOLDERS:
                    found.append(f"{path.relative_to(ROOT)}: from {node.module} (use kvspec.{node.module})")
                if ".test_" in f".{node.module}" or node.module.startswith(("tests.unit", "tests.integration")):
                    found.append(f"{path.relative_to(ROOT)}: imports the test module {node.module}")
                if node.module.startswith("kvspec") or top == "tests":
                    private = [a.name for a in node.names if a.name.startswith("_")]
                    if private:
                        found.append(f"{path.relative_to(ROOT)}: private {node.module}.{private[0]}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in TOP_LEVEL_FOLDERS:
                        found.append(f"{path.relative_to(ROOT)}: import {alias.name}")
    assert not found, "\n".join(found)


def test_the_tree_passes_ruff():
    # The same linter that checks the regression tests kvspec emits, on kvspec
    # itself (ruff's default rules: unused names, shadowed builtins, syntax).
    ruff = Path(sys.executable).with_name("ruff")
    folders = [str(ROOT / name) for name in (*TOP_LEVEL_FOLDERS, "kvspec", "benchmarks", "tests")]
    out = subprocess.run([str(ruff), "check", "--no-cache", "--output-format", "concise", *folders],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-2000:]
