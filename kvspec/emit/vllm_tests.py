"""The release's own test helpers and ruff configuration, for emitted tests.

A regression test kvspec emits is meant to be pasted into vLLM's
``tests/v1/core/``: where the release's ``tests/v1/core/test_prefix_caching.py``
has the helpers vLLM's prefix-cache tests share (``make_kv_cache_manager``,
``make_request``), the test imports them instead of building its own.  To run
such a test kvspec needs the release's test helpers next to it, and to lint
it, the release's ruff configuration: both come from the release's source
distribution (the wheel has no tests), fetched once with pip and cached
under ``$KVSPEC_CACHE/vllm-tests/VERSION`` (only the few files used are kept).

``idiom_of`` reads what the helpers offer (by parsing, never importing);
``verification_tree`` lays an emitted test out as it would sit in vLLM's
repository; ``ruff_check`` lints it with the release's configuration.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import attrs

from kvspec.subjects.mutation.source import parse

__all__ = ["HELPER_MODULE", "SUITE", "SCHEDULER_TESTS", "Idiom", "idiom_of", "ensure_vllm_tests", "tests_root_of",
           "verification_tree", "ruff_check", "ruff_available", "SPEC_CLASSES", "kv_cache_group_lines"]

# vLLM's KV-cache spec class for each group kind, as the emitted tests build them.
SPEC_CLASSES = {"full_attention": "FullAttentionSpec", "sliding_window": "SlidingWindowSpec",
                "mamba_align": "MambaSpec"}
_LAYER_NAMES = {"full_attention": "full", "sliding_window": "swa", "mamba_align": "mamba"}


def kv_cache_group_lines(groups, per_group_eagle: bool, indent: int = 12) -> list[str]:
    """The ``KVCacheGroupSpec`` of each group (``model.domain.KVCacheGroup``),
    as ruff lays them out: the smallest tensors vLLM accepts (one head of
    size 1, float32; a Mamba state of one element), one layer each, named
    by kind (numbered where a kind repeats)."""
    names = [_LAYER_NAMES[g.kind.value] for g in groups]
    out = []
    for i, g in enumerate(groups):
        name = f"{names[i]}{i}" if names.count(names[i]) > 1 else names[i]
        kind = g.kind.value
        if kind == "mamba_align":
            spec = ["MambaSpec(", f"    block_size={g.block_size},", "    shapes=((1,),),",
                    "    dtypes=(torch.float32,),", '    mamba_cache_mode="align",', "),"]
        else:
            spec = [f"{SPEC_CLASSES[kind]}(", f"    block_size={g.block_size},", "    num_kv_heads=1,",
                    "    head_size=1,", "    dtype=torch.float32,"]
            if kind == "sliding_window":
                spec.append(f"    sliding_window={g.sliding_window},")
            spec.append("),")
        lines = ["KVCacheGroupSpec(", f'    ["{name}"],', *[f"    {line}" for line in spec]]
        if g.eagle and per_group_eagle:
            lines.append("    is_eagle_group=True,")
        out += [" " * indent + line for line in [*lines, "),"]]
    return out

HELPER_FILE = "tests/v1/core/test_prefix_caching.py"
HELPER_MODULE = "tests.v1.core.test_prefix_caching"
# The release's own CPU tests of the registration boundary, asked first about
# every finding on a mutant or a tree (kvspec.findings.vllm_suite).  Measured on
# 0.33.0 and 0.34.0: 313 tests, all passing on the release, about 17 s with
# vLLM's import.  Left out: test_prefix_caching.py (11 of its 213 fail in the
# CPU runtime), test_kv_cache_utils.py and test_mamba_align_chunk_split.py
# (their helpers import tests/v1/kv_connector, more of vLLM's test tree), and
# prefix_cache/test_hybrid_prefix_cache_hit_rate.py (it starts a model server).
# A release without some of these files runs the others.
SUITE = ("tests/v1/core/prefix_cache/test_partial_prefix_cache_hits.py",
         "tests/v1/core/prefix_cache/test_partial_prefix_cache_primitives.py",
         "tests/v1/core/prefix_cache/test_mamba_eagle_resume_checkpoint.py",
         "tests/v1/core/test_single_type_kv_cache_manager.py")
# What is kept of the source distribution: the helper module, the package
# markers that make ``tests.v1.core`` importable, the ruff configuration and
# the suite.
KEPT = ("tests/__init__.py", "tests/v1/__init__.py", "tests/v1/core/__init__.py", HELPER_FILE,
        "pyproject.toml", *SUITE)
# Kept where the source distribution has it, but not required of a cached
# copy (one made before is not fetched again for it): vLLM's tests of the
# Scheduler, the module an engine finding's test extends (never run by kvspec).
SCHEDULER_TESTS = "tests/v1/core/test_scheduler.py"
NAMED = (SCHEDULER_TESTS,)
# The helper module imports parts of vLLM that need these, and kvspec's CPU
# runtime (vLLM's registration path only) does not have them: installed next
# to the helpers, without dependencies (both are pure Python).
HELPER_EXTRAS = ("einops",)


@attrs.frozen
class Idiom:
    """What a release's ``tests/v1/core`` offers an emitted test."""

    # tests/v1/core/test_prefix_caching.py has make_kv_cache_manager(kv_cache_config,
    # **kwargs) and make_request(request_id, prompt_token_ids, block_size, hash_fn, ...).
    helpers: bool = False
    # The licence header the release's own test files open with (its SPDX
    # comment lines), read from the helper module: an emitted test opens the
    # same way, and kvspec itself carries no such text.
    header: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"helpers": HELPER_MODULE if self.helpers else None, "header": list(self.header)}

    @classmethod
    def from_recorded(cls, value: Any) -> "Idiom":
        """From a finding's record (untrusted): only the one known module
        counts, and only header lines of the SPDX comment form."""
        if not isinstance(value, dict):
            return cls()
        header = value.get("header")
        lines = header if isinstance(header, list) else []
        return cls(helpers=value.get("helpers") == HELPER_MODULE,
                   header=tuple(line for line in lines if isinstance(line, str) and _SPDX.fullmatch(line)))


# A header line as vLLM's files have them: a comment, one SPDX tag, plain text.
_SPDX = re.compile(r"# SPDX-[A-Za-z-]+: [\w .,()@/+-]{1,120}")


def _header(source: str) -> tuple[str, ...]:
    """The SPDX comment lines a module opens with."""
    lines = []
    for line in source.splitlines():
        if not line.startswith("#"):
            break
        if _SPDX.fullmatch(line):
            lines.append(line)
    return tuple(lines)


def _params(fn: ast.FunctionDef) -> tuple[list[str], bool]:
    args = fn.args
    return [a.arg for a in args.posonlyargs + args.args], args.kwarg is not None


def idiom_of(root: Path | None) -> Idiom:
    """What the tests under ``root`` (a directory holding ``tests/``) offer,
    read from the helper module's source."""
    if root is None or not (Path(root) / HELPER_FILE).is_file():
        return Idiom()
    try:
        source = (Path(root) / HELPER_FILE).read_text()
        tree = parse(source)
    except (SyntaxError, UnicodeDecodeError, OSError):
        return Idiom()
    header = _header(source)
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    manager, request = functions.get("make_kv_cache_manager"), functions.get("make_request")
    if manager is None or request is None:
        return Idiom(header=header)
    manager_params, manager_kwargs = _params(manager)
    request_params, _ = _params(request)
    helpers = (manager_params[:1] == ["kv_cache_config"] and manager_kwargs
               and request_params[:4] == ["request_id", "prompt_token_ids", "block_size", "hash_fn"])
    return Idiom(helpers=bool(helpers), header=header)



def _cache_root() -> Path:
    from kvspec.subjects.provision import cache_root

    return cache_root()


def ensure_vllm_tests(version: str) -> Path:
    """A directory holding release ``version``'s test helpers (``KEPT``) and
    ``site/`` with ``HELPER_EXTRAS``; fetched on first use, then cached."""
    from kvspec.subjects.provision import VERSION_RE, ProvisionError, provisioning_lock

    if not VERSION_RE.match(version):
        raise ProvisionError(f"not a release number: {version!r}")
    root = _cache_root() / "vllm-tests" / version
    marker = root / "READY"
    if _complete(marker):
        return root
    with provisioning_lock():
        if _complete(marker):
            return root
        if root.exists():
            shutil.rmtree(root)
        with tempfile.TemporaryDirectory(dir=_cache_root()) as scratch:
            staging = Path(scratch) / "tree"
            _fetch_sdist_files(version, Path(scratch), staging)
            _pip([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                  str(staging / "site"), *HELPER_EXTRAS], f"installing {', '.join(HELPER_EXTRAS)}")
            root.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(staging), str(root))
        marker.write_text(json.dumps({"version": version, "kept": list(KEPT),
                                      "extras": list(HELPER_EXTRAS)}))
    return root


def _complete(marker: Path) -> bool:
    """Whether a cached copy keeps every file kvspec now keeps (a copy made
    before the suite was kept is fetched again)."""
    try:
        return set(KEPT) <= set(json.loads(marker.read_text()).get("kept", ()))
    except (OSError, ValueError, AttributeError, TypeError):
        return False


def _pip(cmd: list[str], what: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    from kvspec.subjects.provision import ProvisionError

    run = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if run.returncode != 0 and "download" not in cmd:
        tail = (run.stderr.strip().splitlines() or ["no output"])[-1]
        raise ProvisionError(f"{what} failed: {tail}")
    return run


def _fetch_sdist_files(version: str, scratch: Path, staging: Path) -> None:
    """The ``KEPT`` files of vLLM ``version``'s source distribution.

    pip downloads and unpacks the sdist (checking its hash against the
    index), then prepares its metadata, which runs vLLM's setup.py and needs
    its build toolchain: that step fails here, after the sources are
    unpacked, so pip is told to keep its build directory (``--no-clean``)
    and the files are taken from there.  Where the metadata step succeeds,
    the archive itself is in ``downloads``."""
    from kvspec.subjects.provision import ProvisionError, report

    report(f"fetching vLLM {version}'s test helpers from its source distribution (~47 MB, once)")
    downloads, build = scratch / "downloads", scratch / "build"
    build.mkdir()
    env = {**os.environ, "TMPDIR": str(build)}
    _pip([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
          "--no-build-isolation", "--no-clean", f"vllm=={version}", "-d", str(downloads)],
         f"downloading vLLM {version}'s source distribution", env=env)
    archives = list(downloads.glob("vllm-*.tar.gz"))
    if archives:
        with tarfile.open(archives[0]) as archive:
            prefix = archive.getnames()[0].split("/")[0]
            members = set(archive.getnames())
            for name in (*KEPT, *NAMED):
                member = archive.extractfile(f"{prefix}/{name}") if f"{prefix}/{name}" in members else None
                if member is not None:
                    (staging / name).parent.mkdir(parents=True, exist_ok=True)
                    (staging / name).write_bytes(member.read())
    else:
        sources = [p.parent for p in build.rglob("PKG-INFO")
                   if f"\nVersion: {version}\n" in p.read_text(errors="replace")
                   and (p.parent / HELPER_FILE).is_file()]
        if not sources:
            raise ProvisionError(f"pip unpacked no source distribution of vLLM {version}")
        for name in (*KEPT, *NAMED):
            if (sources[0] / name).is_file():
                (staging / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(sources[0] / name, staging / name)
    if not (staging / HELPER_FILE).is_file():
        raise ProvisionError(f"vLLM {version}'s source distribution has no {HELPER_FILE}")


def tests_root_of(subject) -> Path | None:
    """Where the subject's own tests are: a release's (or a mutant's base
    release's) from its source distribution, a source tree's own ``tests/``;
    None for the current environment or a tree without them."""
    if subject.kind in ("release", "mutant") and subject.version:
        return ensure_vllm_tests(subject.version)
    if subject.kind == "source" and subject.path and (Path(subject.path) / HELPER_FILE).is_file():
        return Path(subject.path)
    return None


def verification_tree(dest: Path, tests_root: Path | None, file_name: str, code: str) -> Path:
    """Lay the test out under ``dest`` as it would sit in vLLM's repository
    (``tests/v1/core/FILE``, with the release's helpers beside it when
    ``tests_root`` has them) and return its path.  pytest puts ``dest``
    first on ``sys.path`` (the first directory above the test without an
    ``__init__.py``), so ``tests.v1.core.test_prefix_caching`` imports."""
    core = dest / "tests" / "v1" / "core"
    core.mkdir(parents=True, exist_ok=True)
    for name in KEPT[:3]:
        (dest / name).touch()
    if tests_root is not None:
        for name in KEPT:  # the helpers (the suite is vllm_suite's to lay out)
            if name.startswith("tests/") and name not in SUITE and (tests_root / name).is_file():
                shutil.copyfile(tests_root / name, dest / name)
        site = tests_root / "site"
        if site.is_dir():
            for entry in site.iterdir():
                if not (dest / entry.name).exists():
                    (dest / entry.name).symlink_to(entry)
    test = core / file_name
    test.write_text(code)
    return test


def ruff_available() -> bool:
    try:
        import ruff  # noqa: F401
    except ImportError:
        return shutil.which("ruff") is not None
    return True


def _ruff() -> list[str]:
    try:
        from ruff.__main__ import find_ruff_bin

        return [str(find_ruff_bin())]
    except ImportError:
        return [shutil.which("ruff") or "ruff"]


def ruff_check(tests_root: Path, vllm_tree: Path, file_name: str, code: str) -> dict[str, Any]:
    """``ruff check`` and ``ruff format --check`` of ``code`` as
    ``tests/v1/core/FILE`` of the release's repository: its pyproject.toml
    (from ``tests_root``), its ``vllm`` package (``vllm_tree``, linked) and
    test helpers beside it -- ruff decides what is first-party by finding
    each imported module's file, so they must be there."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        shutil.copyfile(tests_root / "pyproject.toml", root / "pyproject.toml")
        (root / "vllm").symlink_to(Path(vllm_tree).resolve() / "vllm")
        test = verification_tree(root, tests_root, file_name, code)
        for entry in root.iterdir():  # only the release's files: no helper packages
            if entry.is_symlink() and entry.name != "vllm":
                entry.unlink()
        rel = str(test.relative_to(root))
        out = []
        ok = True
        for args in (["check", "--no-cache", "--output-format", "concise", rel],
                     ["format", "--no-cache", "--check", "--diff", rel]):
            run = subprocess.run([*_ruff(), *args], capture_output=True, text=True, cwd=root)
            ok = ok and run.returncode == 0
            out.append(f"$ ruff {' '.join(args)}\n{(run.stdout + run.stderr).strip()}")
        version = subprocess.run([*_ruff(), "--version"], capture_output=True, text=True).stdout.strip()
    return {"against": f"ruff with vLLM's configuration ({version})",
            "outcome": "passed" if ok else "failed", "output": "\n".join(out)}
