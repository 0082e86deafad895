"""Which vLLM is tested: a release, a source tree, a mutant, or the current one.

A ``Subject`` names a subject; ``resolve_subject`` turns it into the
interpreter to run and the tree whose ``vllm`` package must be imported,
provisioning (and verifying) what is cached.  A tree is never handed to a
process through ``PYTHONPATH``: a path holding the path-list separator would
be split there and another tree tested.  The process puts the one tree first
on its own ``sys.path`` and reports where ``vllm`` came from, which is
checked against the tree named.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import attrs

from kvspec.model.errors import SetupError

from .provision import cache_root, ensure_release, ensure_runtime

__all__ = [
    "Subject",
    "SubjectError",
    "SubjectUnsupported",
    "release",
    "source_tree",
    "mutant_subject",
    "current_environment",
    "resolve_subject",
    "subject_env",
    "interpreter_args",
]


class SubjectError(SetupError):
    """The subject could not be started or imported: a one-line cause."""


class SubjectUnsupported(SubjectError):
    """A vLLM kvspec does not model (too old, or unrecognised)."""


@attrs.frozen
class Subject:
    kind: str  # "release" | "source" | "mutant" | "current"
    label: str
    version: str | None = None  # a release's number (also a mutant's base release)
    path: str | None = None  # the directory holding the `vllm` package (source trees)
    mutant: str | None = None  # the mutation operator applied to the release

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def release(version: str) -> Subject:
    """A release from the package index, by its number (checked now, before
    anything is provisioned)."""
    from .provision import VERSION_RE

    if not isinstance(version, str) or not VERSION_RE.match(version):
        raise SubjectError(f"--vllm expects a release number such as 0.34.0, got {version!r}; "
                           "use --vllm-src PATH for a source tree")
    return Subject("release", f"vllm {version}", version=version)


def mutant_subject(version: str, operator: str) -> Subject:
    """A release with one mutation operator applied (``subjects.mutation``),
    its tree made, cached and verified when resolved."""
    from .mutation import mutant

    release(version)  # the same check of the number
    mutant(operator)  # a known operator, or a usage error naming them
    return Subject("mutant", f"vllm {version} + {operator}", version=version, mutant=operator)


def source_tree(path: str) -> Subject:
    try:
        root = Path(path).expanduser().resolve()
        if root.name == "vllm" and (root / "__init__.py").exists():
            root = root.parent  # the package itself was named: use its parent
        found = (root / "vllm" / "__init__.py").exists()
    except (OSError, RuntimeError) as exc:  # a symlink loop (RuntimeError before Python 3.13), unreadable
        raise SubjectError(f"--vllm-src {path}: cannot resolve it ({exc})") from None
    if not found:
        raise SubjectError(
            f"no vllm package under {path}: pass a checkout's root or an unpacked wheel "
            "(a directory containing vllm/__init__.py)"
        )
    return Subject("source", f"vllm-src {root}", path=str(root))


def current_environment() -> Subject:
    return Subject("current", "vllm in the current environment")


def resolve_subject(subject: Subject) -> tuple[str, str | None]:
    """The interpreter and the tree holding ``vllm`` (provisioned and
    verified on first use; None: whatever the interpreter imports)."""
    if subject.kind == "release":
        return str(ensure_runtime()), str(ensure_release(subject.version))
    if subject.kind == "mutant":
        from .mutation import ensure_mutant_tree, mutant

        return str(ensure_runtime()), str(ensure_mutant_tree(subject.version, mutant(subject.mutant)))
    if subject.kind == "source":
        return str(ensure_runtime()), subject.path
    return sys.executable, None


def interpreter_args(root: str | None) -> list[str]:
    """Flags for a subject's interpreter: isolated (``-I``: no PYTHONPATH, no
    user site, no script directory on ``sys.path``) when kvspec names the
    tree; the current environment keeps its own path.  In kvspec's own trees
    Python writes no bytecode (``-B``: ``-I`` ignores PYTHONDONTWRITEBYTECODE):
    a tree holds only what kvspec compiled and verifies, and a tree that
    changed under one worker is rebuilt under another's feet."""
    if root is None:
        return []
    return ["-I", "-B"] if _inside(root, cache_root()) else ["-I"]


def subject_env(root: str | None) -> dict[str, str]:
    """The environment of a process that imports the subject: the tree goes
    in ``KVSPEC_SUBJECT_TREE`` (the process puts it first on ``sys.path``),
    vLLM on the CPU, its logging on stderr."""
    env = dict(os.environ)
    env.pop("KVSPEC_SUBJECT_TREE", None)
    if root is not None:
        env["KVSPEC_SUBJECT_TREE"] = root
        if _inside(root, cache_root()):  # for children started without -I (interpreter_args gives -B)
            env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    env["VLLM_LOGGING_STREAM"] = "ext://sys.stderr"
    return env


def _inside(path: str, root: Path) -> bool:
    try:
        Path(os.path.realpath(path)).relative_to(os.path.realpath(root))
        return True
    except ValueError:
        return False


def expected_package(root: str | None) -> str | None:
    """Where ``vllm`` must be imported from for the subject named (None: anywhere)."""
    return None if root is None else os.path.realpath(os.path.join(root, "vllm"))
