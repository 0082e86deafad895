"""Provisioning subjects on a CPU-only machine: a shared runtime and per-release trees.

A *runtime* is a virtual environment with a CPU build of torch and vLLM's
pure-Python dependencies (``cpu-runtime-deps.txt``), but no vLLM.  A
*subject* is a directory holding a ``vllm`` package (a release's sources
unpacked from its wheel, a user's checkout, a mutant tree) put first on the
worker's ``sys.path``: nothing of vLLM's compiled code is loaded on the
registration path, so one runtime serves every supported release.

Everything is cached under ``$KVSPEC_CACHE`` (default ``~/.cache/kvspec``)
and reused.  Builds take a lock, so concurrent first runs wait for one
another instead of racing; a half-built entry is never mistaken for a
finished one (each has a marker written last); and a release tree is
checked against the content digest its marker records before it is used
(once per process), rebuilt when it differs.

What Python imports is the bytecode as much as the source: kvspec compiles
every tree it caches itself, in ``checked-hash`` mode, removes any other
``.pyc`` there, and records the bytecode's digest beside the sources'.  A
``.pyc`` that is not what kvspec compiled (an unchecked-hash file planted in
``__pycache__``, say) fails verification and the bytecode is compiled again;
workers on kvspec's trees write none of their own (``-B``, since ``-I`` ignores
PYTHONDONTWRITEBYTECODE: a tree changed under one process would be rebuilt
under another's feet).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Callable, Iterator

from kvspec.model.about import NEWEST_VALIDATED, OLDEST_SUPPORTED
from kvspec.model.errors import SetupError

__all__ = [
    "ProvisionError",
    "cache_root",
    "ensure_runtime",
    "ensure_release",
    "byte_compile",
    "bytecode_digest",
    "is_checked_hash",
    "provisioning_lock",
    "report",
    "tree_digest",
    "published_releases",
    "newest_release",
    "RUNTIME_TORCH",
]

RUNTIME_TORCH = "torch==2.13.0"  # the CPU build; nothing on this path needs a newer one
DEPS_FILE = Path(__file__).with_name("cpu-runtime-deps.txt")
VERSION_RE = re.compile(r"^\d+\.\d+\.\d+(\.post\d+)?$")
FINAL_RELEASE_RE = re.compile(r"^\d+\.\d+\.\d+$")  # no rc, post or dev

Progress = Callable[[str], None]

# Release trees whose content this process has checked: path -> stat signature.
_VERIFIED: dict[str, str] = {}
# A .pyc header's flags word (bytes 4-8, PEP 552): hash-based, and checked
# against its source at every import.  kvspec's trees hold only these.
_PYC_CHECKED_HASH = 0b11
# Bytecode digests this process computed: tree -> (stat signature, digest).
_BYTECODE: dict[str, tuple[str, str]] = {}


class ProvisionError(SetupError):
    """Setup failed: a one-line cause and what to do."""


def report(message: str) -> None:
    """A provisioning step, on stderr (never on stdout, where results go)."""
    print(f"kvspec: {message}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    root = Path(os.environ.get("KVSPEC_CACHE") or Path.home() / ".cache" / "kvspec")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ProvisionError(f"cannot create the cache {root} ({exc.strerror}); set KVSPEC_CACHE "
                             "to a writable directory") from None
    return root


# Re-entered by a build that needs another one (a release needs the runtime);
# per thread, since the flock itself is taken per open file.
_HELD = threading.local()


@contextlib.contextmanager
def provisioning_lock() -> Iterator[None]:
    """One builder at a time across processes and threads (an flock on the
    cache); a second first run waits and then finds the entry finished."""
    if getattr(_HELD, "depth", 0):
        _HELD.depth += 1
        try:
            yield
        finally:
            _HELD.depth -= 1
        return
    path = cache_root() / ".provisioning.lock"
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        _HELD.depth = 1
        try:
            yield
        finally:
            _HELD.depth = 0
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(cmd: list[str], what: str, progress: Progress) -> None:
    progress(what)
    # On a terminal the tools' own output (pip's progress bar) is shown;
    # otherwise it is kept and only its tail reported on failure.
    terminal = sys.stderr.isatty()
    proc = subprocess.run(cmd, stdout=sys.stderr if terminal else subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout or "").strip().splitlines()[-3:]
        raise ProvisionError(f"{what} failed (exit {proc.returncode}): {' | '.join(tail)}")


def _pip(python: str | Path, args: list[str], what: str, progress: Progress) -> None:
    quiet = [] if sys.stderr.isatty() else ["-q"]
    _run([str(python), "-m", "pip", args[0], "--disable-pip-version-check", *quiet, *args[1:]],
         what, progress)


def _runtime_key() -> str:
    digest = hashlib.sha256(DEPS_FILE.read_bytes() + RUNTIME_TORCH.encode()).hexdigest()
    return digest[:12]


def ensure_runtime(progress: Progress = report) -> Path:
    """The runtime's Python interpreter, building the runtime on first use."""
    root = cache_root() / f"runtime-{_runtime_key()}"
    python = root / "bin" / "python"
    marker = root / "READY"
    if marker.exists() and python.exists():
        return python
    with provisioning_lock():
        if marker.exists() and python.exists():  # another process built it meanwhile
            return python
        if root.exists():
            shutil.rmtree(root)
        progress(f"building the CPU runtime for vLLM subjects in {root} (about a minute, once)")
        _run([sys.executable, "-m", "venv", str(root)], "creating the runtime venv", progress)
        _pip(python, ["install", RUNTIME_TORCH], f"installing {RUNTIME_TORCH} (CPU build)", progress)
        _pip(python, ["install", "--no-deps", "-r", str(DEPS_FILE)],
             "installing vLLM's pure-Python dependencies", progress)
        marker.write_text(json.dumps({"torch": RUNTIME_TORCH, "deps": DEPS_FILE.name}))
    return python


def _python_files(root: Path) -> list[Path]:
    return sorted((root / "vllm").rglob("*.py"))


def _stat_signature(files: list[Path], root: Path) -> str:
    digest = hashlib.sha256()
    for path in files:
        stat = path.stat()
        digest.update(f"{path.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _bytecode_files(root: Path) -> list[Path]:
    return sorted((root / "vllm").rglob("*.pyc"))


def is_checked_hash(pyc: Path) -> bool:
    """Whether a ``.pyc`` is checked against its source's hash at every import."""
    try:
        with open(pyc, "rb") as handle:
            header = handle.read(8)
    except OSError:
        return False
    return len(header) == 8 and int.from_bytes(header[4:8], "little") == _PYC_CHECKED_HASH


def bytecode_digest(root: Path) -> str:
    """The digest of a tree's compiled bytecode (names and bytes), what the
    sources' digest does not see."""
    files = _bytecode_files(root)
    signature = _stat_signature(files, root)
    cached = _BYTECODE.get(str(root))
    if cached is not None and cached[0] == signature:
        return cached[1]
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    _BYTECODE[str(root)] = (signature, digest.hexdigest())
    return digest.hexdigest()


def tree_digest(root: Path) -> str:
    """The content digest of a tree's ``vllm`` sources (names and bytes)."""
    digest = hashlib.sha256()
    for path in _python_files(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _marker(version: str, root: Path) -> str:
    return json.dumps({"version": version, "content_sha256": tree_digest(root),
                       "bytecode_sha256": bytecode_digest(root)})


def _verified(root: Path, marker: Path, version: str, progress: Progress) -> bool:
    """Whether the tree holds what its marker says (checked once per process,
    again whenever a file's size or time changes).  Sources that differ are
    provisioned again (False); bytecode that is not what kvspec compiled,
    or was never recorded, is compiled again here (needs the lock)."""
    files = _python_files(root) + _bytecode_files(root)
    signature = _stat_signature(files, root)
    if _VERIFIED.get(str(root)) == signature:
        return True
    try:
        recorded = json.loads(marker.read_text())
    except (OSError, ValueError):
        recorded = {}
    if recorded.get("content_sha256") not in (None, tree_digest(root)):
        progress(f"the cached tree of vLLM {version} ({root}) differs from what was provisioned: "
                 "provisioning it again")
        return False
    if recorded.get("bytecode_sha256") != bytecode_digest(root):
        with provisioning_lock():
            progress(f"the compiled bytecode in the cached tree of vLLM {version} ({root}) is not what kvspec "
                     "compiled: compiling it again")
            byte_compile(root, progress)
    if recorded.get("content_sha256") is None or recorded.get("bytecode_sha256") != bytecode_digest(root):
        marker.write_text(_marker(version, root))
    _VERIFIED[str(root)] = _stat_signature(_python_files(root) + _bytecode_files(root), root)
    return True


def ensure_release(version: str, progress: Progress = report) -> Path:
    """A directory holding release ``version``'s ``vllm`` package sources."""
    if not VERSION_RE.match(version):
        raise ProvisionError(
            f"--vllm expects a release number such as 0.33.0, got {version!r}; "
            "use --vllm-src PATH for a source tree"
        )
    root = cache_root() / "releases" / version
    marker = root / "READY"
    if marker.exists() and (root / "vllm" / "__init__.py").exists() and _verified(
            root, marker, version, progress):
        return root
    with provisioning_lock():
        if marker.exists() and (root / "vllm" / "__init__.py").exists() and _verified(
                root, marker, version, progress):
            return root  # another process provisioned it meanwhile
        _provision_release(version, root, progress)
        marker.write_text(_marker(version, root))
        _VERIFIED.pop(str(root), None)
    return root


def _provision_release(version: str, root: Path, progress: Progress) -> None:
    with tempfile.TemporaryDirectory(dir=cache_root()) as scratch:
        try:
            _pip(sys.executable, ["download", "--no-deps", "--only-binary", ":all:",
                                  f"vllm=={version}", "-d", scratch],
                 f"downloading the vLLM {version} wheel (~340 MB)", progress)
        except ProvisionError as exc:
            if "No matching distribution" in str(exc):
                raise ProvisionError(
                    f"vLLM {version} is not on the package index; kvspec supports releases "
                    f"{OLDEST_SUPPORTED} to {NEWEST_VALIDATED} (or a source tree with --vllm-src)"
                ) from None
            raise
        wheels = list(Path(scratch).glob("vllm-*.whl"))
        if not wheels:
            raise ProvisionError(f"pip downloaded no wheel for vllm=={version}")
        progress(f"unpacking vLLM {version}'s Python sources")
        staging = Path(scratch) / "tree"
        with zipfile.ZipFile(wheels[0]) as wheel:
            for name in wheel.namelist():
                if name.startswith("vllm/") and name.endswith(".py"):
                    wheel.extract(name, staging)
        root.parent.mkdir(parents=True, exist_ok=True)
        # The old tree goes only now that its replacement is here: a download
        # that fails (no package index) leaves the cache as it was.
        if root.exists():
            shutil.rmtree(root)
        shutil.move(str(staging), str(root))
    byte_compile(root, progress)


def byte_compile(tree: Path, progress: Progress = report, only: Path | None = None) -> None:
    """Byte-compile a tree's ``vllm`` package (or the one file ``only``)
    with the runtime's interpreter, replacing whatever bytecode is there.
    Where Python writes no bytecode (PYTHONDONTWRITEBYTECODE, as on CI
    hosts) every worker would otherwise compile vLLM's modules again at
    start-up: about a second of the time to the first example.  The
    bytecode is checked against its source's hash at every import
    (``checked-hash``), so an edited source never runs as its old bytecode,
    and any ``.pyc`` of another kind is removed: Python would import it
    unchecked.  A file that does not compile is left to the import."""
    python = ensure_runtime(progress)
    target = tree / "vllm" if only is None else only
    progress(f"byte-compiling {target}")
    subprocess.run([str(python), "-m", "compileall", "-q", "-f", "-j", "0", "--invalidation-mode",
                    "checked-hash", str(target)],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for pyc in _bytecode_files(tree):
        if not is_checked_hash(pyc):
            pyc.unlink()


def published_releases() -> list[str]:
    """vLLM's final releases on the package index, oldest first."""
    from kvspec.model.about import release_key

    run = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "vllm"],
                         capture_output=True, text=True)
    match = re.search(r"Available versions: (.*)", run.stdout)
    if run.returncode != 0 or not match:
        raise ProvisionError("cannot list vLLM's releases on the package index "
                             f"({(run.stderr.strip().splitlines() or ['no output'])[-1]}); "
                             "name the releases one by one: --vllm 0.28.0 --vllm 0.33.0")
    found = (v.strip() for v in match.group(1).split(","))
    return sorted((v for v in found if FINAL_RELEASE_RE.match(v)), key=release_key)


def newest_release(progress: Progress = report) -> str:
    """The newest final vLLM release on the package index; kvspec's newest
    validated one (said so) when the index cannot be reached."""
    try:
        return published_releases()[-1]
    except (ProvisionError, IndexError):
        progress(f"cannot list vLLM's releases on the package index; checking {NEWEST_VALIDATED}, "
                 "the newest kvspec has validated")
        return NEWEST_VALIDATED
