"""Mutant trees: a release's tree with one operator applied, made once,
cached, and checked against what the operator makes every time it is used.

A cached tree is never trusted by the existence of its marker: the mutated
file must hold exactly what the operator makes of the release's file today,
and every other file must be the release's (same size and modification time
as the copy made it), and its compiled bytecode exactly what kvspec compiled
(``provision.bytecode_digest``: the release's, and the mutated module's
compiled here).  A tree that differs is rebuilt, and the rebuild says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from ..provision import byte_compile, bytecode_digest, cache_root, ensure_release, provisioning_lock, report
from .operator import MutationError, MutationOperator, MutationTargetNotFound

__all__ = ["MARKER_FILE", "make_mutant_tree", "ensure_mutant_tree", "mutant_tree_differences"]

MARKER_FILE = "MUTANT.json"


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def make_mutant_tree(release_root: Path, operator: MutationOperator, dest_root: Path) -> Path:
    """Copy the tree holding the ``vllm`` package to ``dest_root`` (which must
    not exist), apply ``operator`` to its target file and mark it with
    ``MUTANT.json``."""
    release_root, dest_root = Path(release_root), Path(dest_root)
    original_path = release_root / operator.target_file
    if not original_path.is_file():
        raise MutationTargetNotFound(
            f"{operator.name}: {operator.target_file}: no such file under {release_root}")
    original = original_path.read_text(encoding="utf-8")
    mutated = operator.apply(original)  # raises before anything is copied
    shutil.copytree(release_root, dest_root)
    (dest_root / operator.target_file).write_text(mutated, encoding="utf-8")
    # The release's bytecode comes along (worker start-up, see
    # provision.byte_compile), except the mutated module's.
    target = dest_root / operator.target_file
    for stale in (target.parent / "__pycache__").glob(f"{target.stem}.*.pyc"):
        stale.unlink()
    byte_compile(dest_root, report, only=target)  # checked-hash, as the release's (provision.byte_compile)
    (dest_root / "READY").unlink(missing_ok=True)  # the release's marker is not this tree's
    marker = {
        "operator": operator.name,
        "models_variant": operator.models_variant,
        "summary": operator.summary,
        "target_file": operator.target_file,
        "source_root": str(release_root.resolve()),
        "original_sha256": _sha256(original),
        "mutated_sha256": _sha256(mutated),
        "bytecode_sha256": bytecode_digest(dest_root),
    }
    (dest_root / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    return dest_root


def _py_files(root: Path) -> dict[str, os.stat_result]:
    package = root / "vllm"
    return {str(p.relative_to(root)): p.stat() for p in package.rglob("*.py")}


def mutant_tree_differences(tree: Path, release_root: Path, operator: MutationOperator) -> list[str]:
    """What makes ``tree`` other than ``operator`` applied to ``release_root``
    (empty: it is exactly that)."""
    marker_path = tree / MARKER_FILE
    if not marker_path.is_file():
        return ["no MUTANT.json marker"]
    try:
        marker = json.loads(marker_path.read_text())
    except ValueError:
        return ["an unreadable MUTANT.json marker"]
    original = (release_root / operator.target_file).read_text(encoding="utf-8")
    expected = operator.apply(original)
    target = tree / operator.target_file
    problems = []
    if marker.get("operator") != operator.name:
        problems.append(f"the marker names operator {marker.get('operator')!r}")
    if not target.is_file() or target.read_text(encoding="utf-8") != expected:
        problems.append(f"{operator.target_file} is not what {operator.name} makes of the release's file")
    ours, theirs = _py_files(tree), _py_files(release_root)
    if set(ours) != set(theirs):
        problems.append(f"{len(set(ours) ^ set(theirs))} Python files added or removed")
    changed = [name for name in ours.keys() & theirs.keys() if name != operator.target_file
               and (ours[name].st_size, ours[name].st_mtime_ns) != (theirs[name].st_size, theirs[name].st_mtime_ns)]
    if changed:
        problems.append(f"{len(changed)} other file(s) changed, e.g. {sorted(changed)[0]}")
    if marker.get("bytecode_sha256") != bytecode_digest(tree):
        problems.append("its compiled bytecode is not what kvspec compiled")
    return problems


def ensure_mutant_tree(version: str, operator: MutationOperator) -> Path:
    """The release ``version`` with ``operator`` applied, made on first use
    and checked (rebuilt if it differs) on every use."""
    release_root = ensure_release(version)
    dest = cache_root() / "mutants" / version / operator.name
    with provisioning_lock():
        if dest.exists():
            problems = mutant_tree_differences(dest, release_root, operator)
            if not problems:
                return dest
            report(f"the cached mutant tree {dest} is not {operator.name} applied to vLLM {version} "
                   f"({'; '.join(problems)}): rebuilding it")
            shutil.rmtree(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            return make_mutant_tree(release_root, operator, dest)
        except MutationError:
            shutil.rmtree(dest, ignore_errors=True)
            raise
