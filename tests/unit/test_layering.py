"""The architecture, checked on what the wheel installs and on the checkout
itself: imports point one way (import-linter's contracts in pyproject.toml),
only the ``kvspec`` name is installed, and the tests keep to public names.

In the checkout, ``kvspec/model``, ``kvspec/proofs``, ... are symbolic links
to the top-level folders, so the folder path is the package path and
import-graph tools run on the checkout see the layers."""

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
    """The wheel of this checkout, unpacked as pip would install it.  Built
    from a copy of the checkout without its build outputs: setuptools reuses
    a ``build/`` folder, and a stale one put modules since moved into the wheel."""
    out = tmp_path_factory.mktemp("wheel")
    source = out / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", ".kvspec*", ".hypothesis", ".*_cache", ".benchmarks",
        "__pycache__", "site"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(out), str(source)], check=True, capture_output=True)
    (wheel,) = out.glob("kvspec-*.whl")
    site = out / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def _lint_imports(site: Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """import-linter's contracts (this checkout's, or those in ``cwd``) on the
    ``kvspec`` package found first in ``site``."""
    lint = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(site)}
    config = (cwd or ROOT) / "pyproject.toml"
    return subprocess.run([str(lint), "--no-cache", str(config)], cwd=cwd or site, env=env,
                          capture_output=True, text=True)


def test_the_wheel_installs_only_the_kvspec_name(installed):
    names = {p.name for p in installed.iterdir()}
    assert {n for n in names if not n.endswith(".dist-info")} == {"kvspec"}
    assert {p.name for p in (installed / "kvspec").iterdir()} >= set(TOP_LEVEL_FOLDERS)


def _packages(root: Path) -> set[str]:
    return {os.path.relpath(folder, root) for folder, _, files in os.walk(root / "kvspec", followlinks=True)
            if "__init__.py" in files}


def test_the_wheel_has_every_package_of_the_checkout(installed):
    # pyproject.toml lists the packages by name: a package folder it misses would be left out of the wheel.
    assert _packages(installed) == _packages(ROOT)


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
    assert "Contracts: 5 kept, 0 broken." in run.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("model/zz_upward.py", "from kvspec.cli import main", "Layers point one way BROKEN"),
    ("oracles/zz_sideways.py", "import kvspec.proofs.runner", "Layers point one way BROKEN"),
    ("commands/zz_other.py", None, "Commands never import one another BROKEN"),
    ("report/zz_bare.py", "import model", "Only the kvspec namespace: no generic top-level names BROKEN"),
    # A renderer that produces findings, or drives a subject, is not a renderer.
    ("report/zz_producer.py", "from kvspec.findings import completion", "Layers point one way BROKEN"),
    ("report/zz_producer.py", "from kvspec.findings import completion", "Reports only render BROKEN"),
    ("report/zz_driver.py", "import kvspec.subjects.process", "Reports only render BROKEN"),
    # A test emitter writes source; it renders no report.
    ("emit/zz_upward.py", "import kvspec.report.finding", "Layers point one way BROKEN"),    # The worker runs in vLLM's runtime: a model module that needs attrs is out of its reach.
    ("subjects/vllm_side/zz_attrs.py", "from kvspec.model import case",
     "The worker imports the standard library, vLLM and model.wire only BROKEN"),
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


def _checkout_copy(destination: Path) -> Path:
    """The packages of this checkout (the links kept as links) and the
    contracts, copied: a tree to break without touching the checkout."""
    for name in ("kvspec", *TOP_LEVEL_FOLDERS):
        shutil.copytree(ROOT / name, destination / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", destination)
    return destination


def test_the_layer_folders_are_the_package_folders():
    for name in TOP_LEVEL_FOLDERS:
        link = ROOT / "kvspec" / name
        assert link.is_symlink() and os.readlink(link) == f"../{name}", link
        assert link.resolve() == (ROOT / name).resolve()


def test_lint_imports_in_the_checkout_sees_the_layers_and_passes():
    # The checkout first on the path, as the editable install has it.
    run = _lint_imports(ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "Contracts: 5 kept, 0 broken." in run.stdout
    # The graph a drawing tool reads (grimp's, import-linter's own): the
    # layers' packages and the arrows between them, built from the checkout.
    script = ("import grimp\n"
              "g = grimp.build_graph('kvspec', cache_dir=None)\n"
              "layers = ['kvspec.' + n for n in " + repr(TOP_LEVEL_FOLDERS) + "]\n"
              "print(g.find_modules_directly_imported_by('kvspec.model.spec') and 'ok')\n"
              "for a in layers:\n"
              "    for b in layers:\n"
              "        if a != b and g.direct_import_exists(importer=a, imported=b, as_packages=True):\n"
              "            print(a, '->', b)\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    arrows = set(out.stdout.splitlines())
    assert {"kvspec.oracles -> kvspec.model", "kvspec.proofs -> kvspec.model", "kvspec.subjects -> kvspec.model",
            "kvspec.diff_tests -> kvspec.subjects"} <= arrows, out.stdout
    assert not any(line.startswith("kvspec.model ->") for line in arrows), out.stdout


def test_lint_imports_in_the_checkout_catches_an_upward_import(tmp_path):
    tree = _checkout_copy(tmp_path / "checkout")
    (tree / "model" / "zz_upward.py").write_text("from kvspec.oracles import registration  # noqa: F401\n")
    run = _lint_imports(tree, cwd=tree)
    assert run.returncode != 0, run.stdout[-3000:]
    assert "Layers point one way BROKEN" in run.stdout
    assert "kvspec.model.zz_upward -> kvspec.oracles.registration" in run.stdout


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
