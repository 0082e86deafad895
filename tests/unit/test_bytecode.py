"""Compiled bytecode is verified like the sources (issue 28): a planted
unchecked-hash ``.pyc`` in a cached tree is never what the worker imports.
A tiny stand-in tree, no vLLM: Python's own import shows what would run."""

from __future__ import annotations

import json
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.subjects import provision
from kvspec.subjects.provision import bytecode_digest, ensure_release, is_checked_hash, tree_digest

VERSION = "9.9.9"


@pytest.fixture
def cached_tree(tmp_path, monkeypatch):
    """A release tree in a private cache, provisioned before bytecode was recorded."""
    monkeypatch.setenv("KVSPEC_CACHE", str(tmp_path / "cache"))
    # The runtime's interpreter compiles; this one stands in for it.
    monkeypatch.setattr(provision, "ensure_runtime", lambda progress=None: Path(sys.executable))
    root = tmp_path / "cache" / "releases" / VERSION
    (root / "vllm").mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "mod.py").write_text("VALUE = 'source'\n")
    (root / "READY").write_text(json.dumps({"version": VERSION, "content_sha256": tree_digest(root)}))
    return root


def _plant(root: Path) -> Path:
    """An unchecked-hash .pyc of other code where Python looks for mod.py's."""
    other = root.parent / "other.py"
    other.write_text("VALUE = 'planted'\n")
    pyc = root / "vllm" / "__pycache__" / f"mod.{sys.implementation.cache_tag}.pyc"
    pyc.parent.mkdir(exist_ok=True)
    py_compile.compile(str(other), cfile=str(pyc), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    return pyc


def _imported(root: Path) -> str:
    code = f"import sys; sys.path.insert(0, {str(root)!r}); import vllm.mod; print(vllm.mod.VALUE)"
    return subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                          check=True, env={"PYTHONDONTWRITEBYTECODE": "1"}).stdout.strip()


def test_a_planted_unchecked_hash_pyc_is_imported_unless_verified(cached_tree, capsys):
    pyc = _plant(cached_tree)
    assert _imported(cached_tree) == "planted"  # the tamper works: Python does not check it
    assert ensure_release(VERSION) == cached_tree
    assert _imported(cached_tree) == "source"
    assert is_checked_hash(pyc)
    marker = json.loads((cached_tree / "READY").read_text())
    assert marker["bytecode_sha256"] == bytecode_digest(cached_tree)
    assert "is not what kvspec compiled: compiling it again" in capsys.readouterr().err


def test_bytecode_planted_after_verification_is_caught_on_next_use(cached_tree, capsys):
    ensure_release(VERSION)
    capsys.readouterr()
    _plant(cached_tree)
    assert _imported(cached_tree) == "planted"
    ensure_release(VERSION)
    assert _imported(cached_tree) == "source"
    assert "compiling it again" in capsys.readouterr().err
    # Nothing but bytecode was touched: the sources and the marker's sources digest stand.
    assert (cached_tree / "vllm" / "mod.py").read_text() == "VALUE = 'source'\n"
    assert json.loads((cached_tree / "READY").read_text())["content_sha256"] == tree_digest(cached_tree)


def test_a_failed_download_leaves_the_cached_tree_in_place(cached_tree, monkeypatch):
    """Issue 28: a re-provisioning whose download failed had deleted the release tree first."""
    from kvspec.subjects.provision import ProvisionError

    (cached_tree / "vllm" / "mod.py").write_text("VALUE = 'changed'\n")  # differs from the marker

    def offline(*args, **kwargs):
        raise ProvisionError("no package index")

    monkeypatch.setattr(provision, "_pip", offline)
    with pytest.raises(ProvisionError, match="no package index"):
        ensure_release(VERSION)
    assert (cached_tree / "vllm" / "mod.py").read_text() == "VALUE = 'changed'\n"


def test_a_process_importing_a_cached_tree_writes_no_bytecode_into_it(cached_tree):
    """Subjects' processes run isolated (-I), which ignores PYTHONDONTWRITEBYTECODE:
    the flag must be on the command line, or a worker writes .pyc files into a
    cached tree and the next verification rebuilds it under a running worker."""
    from kvspec.subjects.subject import interpreter_args, subject_env

    root = str(ensure_release(VERSION))
    (Path(root) / "vllm" / "fresh.py").write_text("VALUE = 1\n")  # a module with no bytecode yet
    code = "import sys, vllm.fresh; print(sys.flags.dont_write_bytecode)"
    env = {**subject_env(root), "PYTHONPATH": root}
    out = subprocess.run([sys.executable, *interpreter_args(root), "-c",
                          f"import sys; sys.path.insert(0, {root!r}); {code}"],
                         capture_output=True, text=True, env=env, check=True, cwd=root)
    assert out.stdout.strip() == "1"
    assert not list((Path(root) / "vllm" / "__pycache__").glob("fresh.*.pyc"))
