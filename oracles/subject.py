"""Subjects (which vLLM to test) and the worker process that drives one.

Each subject runs in its own process (``oracles/worker.py`` under the CPU
runtime), so a crash, a hang or an import conflict in one vLLM cannot take
down kvspec or another subject.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

import attrs

from .provision import ensure_release, ensure_runtime

__all__ = [
    "resolve_subject",
    "subject_env",
    "run_pytest",
    "SubjectSpec",
    "SubjectError",
    "SubjectUnsupported",
    "SubjectProcess",
    "release",
    "source_tree",
    "current_environment",
]

WORKER = Path(__file__).with_name("worker.py")
REPLY_TIMEOUT_S = 120.0


class SubjectError(Exception):
    """The subject could not be started or imported: a one-line cause."""


class SubjectUnsupported(SubjectError):
    """A vLLM kvspec does not model (too old, or unrecognised)."""


@attrs.frozen
class SubjectSpec:
    kind: str  # "release" | "source" | "current"
    label: str
    version: str | None = None
    path: str | None = None  # the directory holding the `vllm` package

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def release(version: str) -> SubjectSpec:
    return SubjectSpec("release", f"vllm {version}", version=version)


def source_tree(path: str) -> SubjectSpec:
    root = Path(path).expanduser().resolve()
    if root.name == "vllm" and (root / "__init__.py").exists():
        root = root.parent  # the package itself was named: use its parent
    if not (root / "vllm" / "__init__.py").exists():
        raise SubjectError(
            f"no vllm package under {path}: pass a checkout's root or an unpacked wheel "
            "(a directory containing vllm/__init__.py)"
        )
    return SubjectSpec("source", f"vllm-src {root}", path=str(root))


def current_environment() -> SubjectSpec:
    return SubjectSpec("current", "vllm in the current environment")


def _supported(capabilities: dict[str, Any]) -> str | None:
    """Why a subject is unsupported, or None."""
    if not capabilities.get("hybrid_coordinator"):
        return "it has no HybridKVCacheCoordinator"
    if not capabilities.get("scheduler_block_size"):
        return ("KVCacheManager takes no scheduler_block_size (added in 0.23): "
                "its registration rule predates the one kvspec models")
    return None


def resolve_subject(spec: SubjectSpec) -> tuple[str, str | None]:
    """The interpreter and the tree to put first on PYTHONPATH (provisioned on first use)."""
    if spec.kind == "release":
        return str(ensure_runtime()), str(ensure_release(spec.version))
    if spec.kind == "source":
        return str(ensure_runtime()), spec.path
    return sys.executable, None


def subject_env(root: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if root is not None:
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    env["VLLM_LOGGING_STREAM"] = "ext://sys.stderr"
    return env


def run_pytest(spec: SubjectSpec, test_file: str, timeout: float = 600) -> dict[str, Any]:
    """Run one pytest file against a subject's vLLM: passed, failed or error."""
    python, root = resolve_subject(spec)
    test_file = os.path.abspath(test_file)
    # -c os.devnull: the file is run on its own, never under the configuration
    # of a project it happens to sit in (kvspec's own pyproject adds options
    # that only kvspec's pytest plugin knows, and the runtime has no kvspec).
    try:
        out = subprocess.run(
            [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:warnings",
             "-c", os.devnull, "--rootdir", os.path.dirname(test_file), test_file],
            capture_output=True, text=True, timeout=timeout, env=subject_env(root),
            cwd=os.path.dirname(test_file))
    except subprocess.TimeoutExpired:
        return {"against": spec.label, "outcome": "error", "returncode": None,
                "summary": f"timed out after {timeout:.0f} s"}
    lines = (out.stdout + out.stderr).strip().splitlines()
    outcome = {0: "passed", 1: "failed"}.get(out.returncode, "error")
    return {"against": spec.label, "outcome": outcome, "returncode": out.returncode,
            "summary": lines[-1] if lines else "", "output": "\n".join(lines[-80:])}


class SubjectProcess:
    """A live worker for one subject; restarts itself after a crash."""

    def __init__(self, spec: SubjectSpec, *, wait: bool = True):
        """Provision and start the worker; with ``wait=False`` return while it
        is still importing vLLM (``ready()`` waits), so start-up can overlap
        other work."""
        self.spec = spec
        self.python, self.root = resolve_subject(spec)
        self.capabilities: dict[str, Any] = {}
        self._proc: subprocess.Popen | None = None
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._handshake_pending = False
        self._spawn()
        if wait:
            self.ready()

    def _start(self) -> None:
        self._spawn()
        self.ready()

    def _spawn(self) -> None:
        env = subject_env(self.root)
        self._stderr.seek(0)
        self._stderr.truncate()
        self._proc = subprocess.Popen(
            [self.python, str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._stderr, text=True, bufsize=1, env=env,
        )
        self._handshake_pending = True

    def ready(self) -> "SubjectProcess":
        """Wait for the worker's hello; SubjectError if vLLM cannot be imported."""
        if not self._handshake_pending:
            return self
        self._handshake_pending = False
        hello = self._read()
        if hello is None or not hello.get("ok"):
            cause = (hello or {}).get("error") or self._stderr_tail()
            self.close()
            raise SubjectError(f"{self.spec.label}: cannot import vLLM's coordinator ({cause})")
        self.capabilities = hello["capabilities"]
        reason = _supported(self.capabilities)
        if reason:
            self.close()
            raise SubjectUnsupported(
                f"{self.spec.label} (vLLM {self.capabilities.get('vllm_version')}) is unsupported, "
                f"because {reason}; kvspec supports 0.23.0 and later"
            )
        return self

    def _stderr_tail(self, lines: int = 6) -> str:
        self._stderr.flush()
        self._stderr.seek(0)
        tail = self._stderr.read().strip().splitlines()[-lines:]
        return " | ".join(tail) or "no output"

    def _read(self) -> dict[str, Any] | None:
        assert self._proc is not None and self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            return None
        return json.loads(line)

    def _exchange(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """One request, one reply (None if the worker died)."""
        return self._read_or_none() if self._exchange_send(message) else None

    def _crash_reply(self) -> dict[str, Any]:
        assert self._proc is not None
        code = self._proc.wait(timeout=10)
        tail = self._stderr_tail()
        self._proc = None
        return {"ok": False, "crashed": True,
                "error": f"the vLLM worker died (exit {code}) during the example: {tail}"}

    def run(self, case: dict[str, Any]) -> dict[str, Any]:
        """One example; a dead worker becomes a crash reply, then a fresh worker."""
        reply = self._exchange({"op": "run", "case": case})
        return self._crash_reply() if reply is None else reply

    def session(self, message: dict[str, Any]) -> dict[str, Any]:
        """One exchange of a multi-request replay (``open_session`` or
        ``session_actions``, see ``oracles.hitrate``); a dead worker becomes a
        crash reply (the replay cannot resume on a fresh one)."""
        reply = self._exchange(message)
        return self._crash_reply() if reply is None else reply

    def stats(self) -> dict[str, Any]:
        """The worker's counters: cases run, KVCacheManagers built for them
        (fewer when managers are reused), whether reuse is on."""
        reply = self._exchange({"op": "stats"})
        return self._crash_reply() if reply is None else reply

    def run_many(self, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Several examples in one round trip.  After a crash the cases are
        rerun alone, up to the one that crashes the worker, so the crash is
        pinned on the case that caused it (the rest of the batch is dropped)."""
        reply = self._exchange({"op": "run_many", "cases": cases})
        if reply is not None:
            return reply["replies"]
        self._crash_reply()
        replies = []
        for case in cases:  # rerun one by one up to the case that kills it
            replies.append(self.run(case))
            if replies[-1].get("crashed"):
                break
        return replies

    def stream(self, cases: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Replies one by one as the worker finishes them (the caller's work on
        a reply overlaps the worker's on the next).  If the worker dies, the
        case in flight gets the crash reply, the rest of the batch is dropped
        and a fresh worker is started on next use.  A caller that stops early
        still leaves the protocol in step: the rest is drained on close."""
        if not cases:
            return
        if not self._exchange_send({"op": "stream", "cases": cases}):
            yield self._crash_reply()
            return
        pending = len(cases) + 1  # the replies, then the end marker
        try:
            for _ in cases:
                reply = self._read_or_none()
                pending -= 1
                if reply is None:
                    pending = 0
                    yield self._crash_reply()
                    return
                yield reply
            pending -= 1
            if self._read_or_none() is None:  # died after its last reply: restart on next use
                self._crash_reply()
        finally:
            while pending > 0 and self._proc is not None:
                pending -= 1
                if self._read_or_none() is None:
                    self._crash_reply()
                    break

    def _exchange_send(self, message: dict[str, Any]) -> bool:
        if self._handshake_pending:
            self.ready()
        if self._proc is None or self._proc.poll() is not None:
            self._start()
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(message) + "\n")
            self._proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def _read_or_none(self) -> dict[str, Any] | None:
        try:
            return self._read()
        except (OSError, ValueError):
            return None

    def describe(self) -> dict[str, Any]:
        caps = self.capabilities
        return {**self.spec.as_dict(), "vllm_version": caps.get("vllm_version"),
                "vllm_path": caps.get("vllm_path"), "git_commit": caps.get("git_commit")}

    def close(self) -> None:
        if self._proc is not None:
            try:
                if self._proc.poll() is None and self._proc.stdin is not None:
                    self._proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                    self._proc.stdin.flush()
                self._proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                self._proc.kill()
            self._proc = None

    def __enter__(self) -> "SubjectProcess":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

