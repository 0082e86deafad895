"""The worker process that drives one subject, and what happens when it fails.

Each subject runs in its own process (``subjects/worker.py`` under the CPU
runtime), so a crash, a hang or an import conflict in one vLLM cannot take
down kvspec or another subject.  Every reply is awaited with a timeout.  A
worker that dies or stops answering during a case is restarted and the case
retried once on a fresh worker:

* the retry answers: the first failure was the machine's (a kill from
  outside, a stall), counted in ``restarts`` and reported, never a finding;
* the worker's own code exits again (an exit status, no signal): vLLM ended
  the process on that case, reproduced, so it is a crash reply (a finding);
* it is killed by a signal or hangs again: ``InfrastructureError`` -- kvspec
  cannot tell vLLM from the machine there, so it says so and stops.

A machine or replay (``session``) lives in one worker and cannot move: a
message for it that would reach a fresh worker (the one that held it died or
was ended) is an ``InfrastructureError``, never sent.  An error reply says
whose frames raised (``origin``): one raised in kvspec's own worker code is
kvspec's bug, an ``InfrastructureError`` too, never a vLLM finding.

Every request is a ``model.requests`` class, and every reply is parsed once,
as it is read, into a ``model.replies.Reply`` (one ``ErrorKind`` when it
failed; its payload typed where the request's op has one,
``model.replies.PAYLOADS``); a reply the protocol does not allow is kvspec's
error (``InfrastructureError``), never a finding.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

from kvspec.model.about import OLDEST_SUPPORTED
from kvspec.model.capabilities import Capabilities, reference_capabilities
from kvspec.model.errors import InfrastructureError
from kvspec.model.replies import ErrorKind, MalformedReply, Reply
from kvspec.model.requests import Quit, Request, Run, Stats, Stream

from .stop import raise_if_requested
from .subject import (
    SubjectError,
    Subject,
    SubjectUnsupported,
    expected_package,
    interpreter_args,
    resolve_subject,
    subject_env,
)

__all__ = ["SubjectProcess", "REPLY_TIMEOUT_S", "reply_timeout"]

WORKER = Path(__file__).with_name("worker.py")
# How long one reply may take (one case, one session exchange): a case takes
# milliseconds, so this only ends a worker that is stopped or looping.
REPLY_TIMEOUT_S = 120.0
# The hello comes after vLLM's import: seconds, far more on a loaded machine.
# A worker that stops using CPU for a reply timeout before it is ended
# sooner (a stopped or blocked import), see ``_await_hello``.
HELLO_TIMEOUT_S = 600.0


def reply_timeout() -> float:
    """``$KVSPEC_REPLY_TIMEOUT`` (seconds) or the default."""
    value = os.environ.get("KVSPEC_REPLY_TIMEOUT")
    if not value:
        return REPLY_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        raise SubjectError(f"KVSPEC_REPLY_TIMEOUT={value!r} is not a number of seconds") from None
    if not seconds > 0:
        raise SubjectError(f"KVSPEC_REPLY_TIMEOUT={value!r} must be more than 0 seconds")
    return seconds


class _Lines:
    """Lines from a pipe with a timeout per line (a text file's readline
    cannot time out)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buffer = b""

    def read(self, timeout: float) -> bytes | None:
        """One line; b"" at end of file; None when ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return b""
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line + b"\n"


def _cpu_time(pid: int) -> int | None:
    """The process's CPU time in clock ticks (user + system), or None where
    /proc cannot say (not Linux, or it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime, stime: fields 14 and 15 of proc(5)
    except (OSError, IndexError, ValueError):
        return None


class _Death:
    """How a worker stopped answering: a timeout, an exit status or a signal."""

    def __init__(self, code: int | None, timed_out: bool, tail: str, timeout: float):
        self.code, self.timed_out, self.tail, self.timeout = code, timed_out, tail, timeout

    @property
    def by_its_own_code(self) -> bool:
        """The process exited with a status (vLLM's code ended it), no signal, no hang."""
        return not self.timed_out and self.code is not None and self.code >= 0

    def describe(self) -> str:
        if self.timed_out:
            return f"gave no answer within {self.timeout:.0f} s (stopped or looping; kvspec ended it)"
        if self.code is not None and self.code < 0:
            try:
                name = signal.Signals(-self.code).name
            except ValueError:
                name = f"signal {-self.code}"
            return f"was killed by {name}"
        return f"exited (exit {self.code})"


def _crashed(message: str, op: str | None = None) -> Reply:
    """The reply for a worker that vLLM's code ended (it cannot say so
    itself), to a request of ``op`` (its payload: none answered)."""
    return Reply.parse({"ok": False, "error_kind": ErrorKind.CRASHED.value, "error": message}, op)


class SubjectProcess:
    """A live worker for one subject."""

    def __init__(self, subject: Subject, *, wait: bool = True, timeout: float | None = None):
        """Provision and start the worker; with ``wait=False`` return while it
        is still importing vLLM (``ready()`` waits), so start-up can overlap
        other work."""
        self.subject = subject
        self.python, self.root = resolve_subject(subject)
        self.timeout = reply_timeout() if timeout is None else timeout
        self.capabilities = Capabilities()
        self.identity: dict[str, Any] = {}
        # What the release this tree claims to be has and this tree lacks
        # ("" when nothing): said in every verdict on it.
        self.scope_reduction = ""
        # Worker restarts after a failure the retry did not reproduce.
        self.restarts: list[str] = []
        self._proc: subprocess.Popen | None = None
        self._lines: _Lines | None = None
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._handshake_pending = False
        self._timed_out = False  # the last read ended by its timeout
        self._spawns = 0  # workers started so far; the current one is number `_spawns`
        self._opened_on: int | None = None  # the worker that holds the open machine or replay
        self._last_death = ""  # how the worker before the current one ended
        self._spawn()
        if wait:
            self.ready()

    # -- the process ---------------------------------------------------------
    def _spawn(self) -> None:
        self._stderr.seek(0)
        self._stderr.truncate()
        # A session of its own: Ctrl-C at the terminal reaches kvspec only,
        # which then records what it has and closes the worker itself.
        self._proc = subprocess.Popen(
            [self.python, *interpreter_args(self.root), str(WORKER)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._stderr, env=subject_env(self.root), start_new_session=True,
        )
        self._lines = _Lines(self._proc.stdout.fileno())
        self._handshake_pending = True
        self._spawns += 1

    def ready(self) -> "SubjectProcess":
        """Wait for the worker's hello; SubjectError if vLLM cannot be
        imported, was imported from somewhere else, or is not one kvspec models."""
        if not self._handshake_pending:
            return self
        self._handshake_pending = False
        hello = self._await_hello()
        if hello is None:  # no answer at all: killed, stopped or stalled, not an import that failed
            stalled = self._timed_out
            death = self._reap(timed_out=stalled)
            how = (f"made no progress for {self.timeout:.0f} s (stopped or blocked; kvspec ended it)"
                   if stalled else death.describe())
            raise InfrastructureError(f"{self.subject.label}: the worker {how} while importing vLLM, before "
                                      f"it answered (last stderr: {death.tail})")
        if not hello.ok:  # the worker's own clean report that the import failed
            self._kill()
            raise SubjectError(f"{self.subject.label}: cannot import vLLM's coordinator "
                               f"({hello.error.message or self._stderr_tail()})")
        report = hello["capabilities"]
        self.capabilities = Capabilities.from_dict(report)
        self.identity = {k: report.get(k) for k in ("vllm_version", "vllm_path", "git_commit")}
        expected = expected_package(self.root)
        found = os.path.realpath(report.get("vllm_path") or "")
        if expected is not None and found != expected:
            self.close()
            raise SubjectError(f"{self.subject.label}: the worker imported vllm from {found}, not from the "
                               f"tree named ({expected}); nothing of it was tested")
        reason = self.capabilities.unsupported_reason()
        if reason:
            self.close()
            raise SubjectUnsupported(
                f"{self.subject.label} (vLLM {self.identity.get('vllm_version')}) is unsupported, "
                f"because {reason}; kvspec supports {OLDEST_SUPPORTED} and later")
        self.scope_reduction = self._scope_reduction()
        return self

    def _await_hello(self) -> Reply | None:
        """The hello, or None: the worker closed its end, gave something that
        is not a reply, or gave none in time (``_timed_out``).  Importing vLLM
        can take minutes on a loaded machine, but it uses CPU all along: a
        worker whose CPU time has not moved for a reply timeout (stopped,
        blocked) is given up then; otherwise after ``HELLO_TIMEOUT_S``."""
        deadline = time.monotonic() + max(HELLO_TIMEOUT_S, self.timeout)
        cpu, moved = _cpu_time(self._proc.pid), time.monotonic()
        while True:
            now = time.monotonic()
            left = min(deadline - now, 1.0)
            if left <= 0:
                self._timed_out = True
                return None
            reply = self._read(left)
            if not self._timed_out:
                return reply
            now_cpu = _cpu_time(self._proc.pid)
            if now_cpu is None or now_cpu != cpu:
                cpu, moved = now_cpu, time.monotonic()
            elif time.monotonic() - moved >= self.timeout:
                return None  # _timed_out stays set: a stall

    def _scope_reduction(self) -> str:
        """What kvspec would not generate on this tree that the release it
        claims to be has (a renamed keyword looks exactly like this): a
        setup error for a release or a mutant of one (kvspec's introspection
        no longer reads that code), a stated reduction of scope for a tree."""
        reference, whose = reference_capabilities(self.identity.get("vllm_version"))
        missing = self.capabilities.missing(reference)
        beyond = reference.missing(self.capabilities)
        if not missing and beyond and self.subject.kind == "source":
            # Code newer than its version says: what kvspec keys on the version
            # (the known bugs recognised, the deployments derived)
            # is the older release's, so the run is not this code's whole scope.
            return (f"{self.subject.label} has {', '.join(beyond)}, which {whose} (its _version.py) lacks: "
                    "kvspec reads the known bugs it recognises and the deployment profiles for that "
                    "older release, not for this code")
        if not missing:
            return ""
        text = (f"{self.subject.label} lacks {', '.join(missing)}, which {whose} has: kvspec does not "
                "generate what those need on this tree")
        if self.subject.kind in ("release", "mutant"):
            self.close()
            raise SubjectUnsupported(f"{text}; kvspec's reading of this release no longer matches its "
                                     "table of eras (model/capabilities.py), so it refuses rather than "
                                     "fuzz less than it should")
        return text

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _ensure_started(self) -> None:
        if not self._alive():
            if self._proc is not None:
                self._reap(timed_out=False)
                # Nothing was lost (no message was under way), but it is said.
                self.restarts.append(f"the worker {self._last_death} between messages; a fresh one took over")
            self._spawn()
        self.ready()

    def _stderr_tail(self, lines: int = 6) -> str:
        self._stderr.flush()
        self._stderr.seek(0)
        tail = self._stderr.read().strip().splitlines()[-lines:]
        return " | ".join(tail) or "no output"

    def _read(self, timeout: float | None = None, op: str | None = None) -> Reply | None:
        """The next reply, parsed (its payload too, as a reply to a request of
        ``op``); None if the worker closed its end or gave
        none in time (``_timed_out`` says which).  A JSON object the protocol
        does not allow ends the worker and is an ``InfrastructureError``:
        kvspec's two sides disagree, and nothing they said is a finding."""
        self._timed_out = False
        if self._lines is None:
            return None
        try:
            line = self._lines.read(self.timeout if timeout is None else timeout)
        except OSError:
            return None
        if line is None:
            self._timed_out = True
            return None
        if not line:
            return None
        try:
            record = json.loads(line)
        except ValueError:
            return None
        try:
            return Reply.parse(record, op)
        except MalformedReply as exc:
            self._kill()
            self._forget()
            raise InfrastructureError(f"{self.subject.label}: the worker's reply is malformed ({exc}); "
                                      "a kvspec bug, not a vLLM finding") from None

    def _send(self, request: Request) -> bool:
        raise_if_requested()  # an interrupt a finalizer swallowed still stops the run here
        self._ensure_started()
        self._timed_out = False
        try:
            self._proc.stdin.write((json.dumps(request.to_wire()) + "\n").encode())
            self._proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
        if self._proc is not None:
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass

    def _reap(self, timed_out: bool) -> _Death:
        """End a failed worker and say how it ended."""
        assert self._proc is not None
        if timed_out:
            self._kill()
        try:
            code = self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._kill()
            code = self._proc.returncode
        death = _Death(code, timed_out, self._stderr_tail(), self.timeout)
        self._last_death = death.describe()
        self._forget()
        return death

    def _forget(self) -> None:
        """Close our ends of an ended worker's pipes and let it go."""
        for stream in (self._proc.stdin, self._proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self._proc, self._lines = None, None

    def _failed(self) -> _Death:
        """The worker gave no reply: a hang if the wait timed out, else a death
        (waited for, so its exit status is known)."""
        return self._reap(timed_out=self._timed_out)

    # -- one case, a retry on a fresh worker ----------------------------------
    def _retry(self, request: Run, first: _Death) -> Reply:
        """Run the case alone on a fresh worker after ``first``; see the module's
        docstring for what each outcome means."""
        if self._send(request):
            reply = self._read()
            if reply is not None:
                self.restarts.append(f"the worker {first.describe()} and the retry answered")
                return reply
        second = self._failed()
        if first.by_its_own_code and second.by_its_own_code:
            return _crashed(f"the vLLM worker exited (exit {second.code}) during the case, again on a "
                            f"fresh worker: {second.tail}")
        raise InfrastructureError(
            f"{self.subject.label}: the worker {first.describe()}, then {second.describe()} on a fresh "
            f"worker, on the same case; kvspec cannot tell vLLM from the machine here, so nothing is "
            f"reported as a finding (last stderr: {second.tail})")

    def run(self, request: Run) -> Reply:
        """One case."""
        for reply in self.stream(Stream((request.case,))):
            return reply
        raise AssertionError("unreachable: a stream of one case yields one reply")

    def run_many(self, request: Stream) -> list[Reply]:
        """Several cases, each reply in turn."""
        return list(self.stream(request))

    def stream(self, request: Stream) -> Iterator[Reply]:
        """Replies one by one as the worker finishes them (the caller's work on
        a reply overlaps the worker's on the next).  A caller that stops early
        still leaves the protocol in step: the rest is drained."""
        pending = request.cases
        while pending:
            if not self._send(Stream(pending)):
                yield self._retry(Run(pending[0]), self._failed())
                pending = pending[1:]
                continue
            answered, failed = 0, False
            try:
                while answered < len(pending):
                    reply = self._read()
                    if reply is None:
                        failed = True
                        break
                    answered += 1
                    yield reply
            except GeneratorExit:
                # Stopped early by the caller: drain the rest and the end
                # marker, so the next message is answered in step.
                for _ in range(len(pending) - answered + 1):
                    if self._read() is None:
                        self._failed()
                        break
                raise
            if not failed:
                if self._read() is None:  # died after its last reply: restart on next use
                    self._failed()
                return
            yield self._retry(Run(pending[answered]), self._failed())
            pending = pending[answered + 1:]

    def session(self, request: Request) -> Reply:
        """One exchange of a multi-request replay (a machine, an engine or a
        hit-rate replay opened, then acted on; or one request answered once:
        ``PrefillChunks``, ``MambaLayerCheckpointFields``).  A replay
        cannot resume on a fresh worker, so a worker that stops is an
        infrastructure error unless its own code exited, and so is a request
        for a machine or replay that a worker restart lost, or an exception
        from kvspec's own worker code."""
        if isinstance(request, (Stream, Quit)):  # many replies, or none: not one exchange
            raise TypeError(f"{type(request).__name__} is not one exchange: use stream() or close()")
        kind = request.needs
        if kind is not None:
            self._ensure_started()
            if self._opened_on != self._spawns:
                before = ("none was opened" if self._opened_on is None
                          else f"the worker that held it {self._last_death or 'was ended'}")
                raise InfrastructureError(
                    f"{self.subject.label}: the {kind} this {request.op} needs is not on the running "
                    f"worker ({before}); a fresh worker cannot continue it, so nothing from here is a vLLM "
                    f"finding")
        if self._send(request):
            reply = self._read(op=request.op)
            if reply is not None:
                if request.opens:
                    self._opened_on = self._spawns if reply.ok else None
                if reply.error is not None and reply.error.in_kvspecs_code:
                    raise InfrastructureError(
                        f"{self.subject.label}: kvspec's worker raised {reply.error.message} in its own code "
                        f"({reply.error.where}), not in vLLM's: a kvspec bug, not a vLLM finding")
                return reply
        death = self._failed()
        if death.by_its_own_code:
            return _crashed(f"the vLLM worker exited (exit {death.code}) during the replay: {death.tail}", request.op)
        raise InfrastructureError(f"{self.subject.label}: the worker {death.describe()} during the replay "
                                  f"(last stderr: {death.tail})")

    def stats(self) -> Reply:
        """The worker's counters: cases run, KVCacheManagers built for them
        (fewer when managers are reused), whether reuse is on."""
        if self._send(Stats()):
            reply = self._read()
            if reply is not None:
                return reply
        death = self._failed()
        raise InfrastructureError(f"{self.subject.label}: the worker {death.describe()} answering stats")

    @property
    def worker_pid(self) -> int | None:
        """The worker process's id (None while none runs)."""
        return None if self._proc is None else self._proc.pid

    def describe(self) -> dict[str, Any]:
        return {**self.subject.as_dict(), **self.identity}

    def close(self) -> None:
        if self._proc is not None:
            try:
                if self._proc.poll() is None and self._proc.stdin is not None:
                    self._proc.stdin.write((json.dumps(Quit().to_wire()) + "\n").encode())
                    self._proc.stdin.flush()
                self._proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                self._proc.kill()
                self._proc.wait()
            self._forget()

    def __enter__(self) -> "SubjectProcess":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
