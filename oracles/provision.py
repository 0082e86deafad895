"""Provisioning subjects on a CPU-only machine: a shared runtime and per-release trees.

A *runtime* is a virtual environment with a CPU build of torch and vLLM's
pure-Python dependencies (``cpu-runtime-deps.txt``), but no vLLM.  A
*subject* is a directory holding a ``vllm`` package (a release's sources
unpacked from its wheel, a user's checkout, a mutant tree) put first on the
worker's ``PYTHONPATH``: nothing of vLLM's compiled code is loaded on the
registration path, so one runtime serves every supported release.

Everything is cached under ``$KVSPEC_CACHE`` (default ``~/.cache/kvspec``)
and reused; a half-built entry is never mistaken for a finished one (each
has a marker written last).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

__all__ = [
    "ProvisionError",
    "cache_root",
    "ensure_runtime",
    "ensure_release",
    "byte_compile",
    "RUNTIME_TORCH",
]

RUNTIME_TORCH = "torch==2.13.0"  # the CPU build; nothing on this path needs a newer one
DEPS_FILE = Path(__file__).with_name("cpu-runtime-deps.txt")
VERSION_RE = re.compile(r"^\d+\.\d+\.\d+(\.post\d+)?$")

Progress = Callable[[str], None]


class ProvisionError(Exception):
    """Setup failed: a one-line cause and what to do."""


def _stderr(message: str) -> None:
    print(f"kvspec: {message}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    root = Path(os.environ.get("KVSPEC_CACHE") or Path.home() / ".cache" / "kvspec")
    root.mkdir(parents=True, exist_ok=True)
    return root


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


def ensure_runtime(progress: Progress = _stderr) -> Path:
    """The runtime's Python interpreter, building the runtime on first use."""
    root = cache_root() / f"runtime-{_runtime_key()}"
    python = root / "bin" / "python"
    marker = root / "READY"
    if marker.exists() and python.exists():
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


def ensure_release(version: str, progress: Progress = _stderr) -> Path:
    """A directory holding release ``version``'s ``vllm`` package sources."""
    if not VERSION_RE.match(version):
        raise ProvisionError(
            f"--vllm expects a release number such as 0.33.0, got {version!r}; "
            "use --vllm-src PATH for a source tree"
        )
    root = cache_root() / "releases" / version
    marker = root / "READY"
    if marker.exists() and (root / "vllm" / "__init__.py").exists():
        if not (root / "vllm" / "__pycache__").is_dir():  # provisioned before trees were compiled
            byte_compile(root, progress)
        return root
    if root.exists():
        shutil.rmtree(root)
    with tempfile.TemporaryDirectory(dir=cache_root()) as scratch:
        try:
            _pip(sys.executable, ["download", "--no-deps", "--only-binary", ":all:",
                                  f"vllm=={version}", "-d", scratch],
                 f"downloading the vLLM {version} wheel (~340 MB)", progress)
        except ProvisionError as exc:
            if "No matching distribution" in str(exc):
                raise ProvisionError(
                    f"vLLM {version} is not on the package index; kvspec supports releases "
                    "0.23.0 to 0.33.0 (or a source tree with --vllm-src)"
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
        shutil.move(str(staging), str(root))
    byte_compile(root, progress)
    marker.write_text(json.dumps({"version": version}))
    return root


def byte_compile(tree: Path, progress: Progress = _stderr) -> None:
    """Byte-compile a tree's ``vllm`` package once, with the runtime's
    interpreter.  Where Python writes no bytecode (PYTHONDONTWRITEBYTECODE,
    as on CI hosts) every worker would otherwise compile vLLM's modules again
    at start-up: about a second of the time to the first example.  Only an
    optimisation: a file that does not compile is left to the import."""
    python = ensure_runtime(progress)
    progress(f"byte-compiling {tree / 'vllm'}")
    subprocess.run([str(python), "-m", "compileall", "-q", "-j", "0", str(tree / "vllm")],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
