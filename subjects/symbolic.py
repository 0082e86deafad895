"""Symbolic conformance of a subject's real registration code, with replay.

Runs ``symbolic_harness.py`` in the subject's runtime (CrossHair executing
vLLM's own method on symbolic integers against the subject), then replays every
counterexample through the normal driver on the real ``KVCacheManager``: a
REFUTED verdict is only given when the replay shows the same discrepancy.
A search that did not explore every path is INCONCLUSIVE, never VERIFIED.
"""

from __future__ import annotations

import enum
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import attrs

from kvspec.model.capabilities import Capabilities, reference_capabilities
from kvspec.model.outcome import Outcome

from .subject import Subject, interpreter_args, resolve_subject, subject_env

__all__ = ["SymbolicStatus", "SymbolicVerdict", "symbolic_check", "case_for"]

HARNESS = Path(__file__).with_name("symbolic_harness.py")


def _kvspec_paths() -> list[str]:
    """The folders holding kvspec's packages that the harness imports (one
    folder when installed, the checkout's root when editable)."""
    import kvspec.model
    import kvspec.proofs
    import kvspec.subjects

    return sorted({str(Path(p.__file__).resolve().parent.parent)
                   for p in (kvspec.model, kvspec.proofs, kvspec.subjects)})


class SymbolicStatus(str, enum.Enum):
    # Every path of vLLM's code and the subject explored: no input makes them differ.
    VERIFIED = "VERIFIED"
    # A concrete input where they differ, confirmed on the real coordinator.
    REFUTED = "REFUTED"
    # Budget ran out, or a counterexample the replay did not confirm.
    INCONCLUSIVE = "INCONCLUSIVE"
    # The release has no code this check knows how to target.
    UNSUPPORTED = "UNSUPPORTED"


@attrs.frozen
class SymbolicVerdict:
    subject: str
    status: SymbolicStatus
    target: str
    seconds: float
    paths: int = 0
    wall_seconds: float = 0.0  # including the worker importing torch and vLLM
    abstracted: tuple[str, ...] = ()
    counterexample: dict[str, Any] | None = None  # inputs, real vs subject, replay outcome
    detail: str = ""

    @property
    def outcome(self) -> Outcome:
        return {SymbolicStatus.VERIFIED: Outcome.OK, SymbolicStatus.REFUTED: Outcome.FINDING,
                SymbolicStatus.INCONCLUSIVE: Outcome.UNKNOWN,
                SymbolicStatus.UNSUPPORTED: Outcome.USAGE}[self.status]

    def as_dict(self) -> dict[str, Any]:
        d = attrs.asdict(self)
        d["status"] = self.status.value
        d["abstracted"] = list(self.abstracted)
        return d


def case_for(args: dict[str, Any]):
    """A symbolic counterexample as a driver case: one prefill of n tokens on a
    realizable configuration (the proofs' own decoding)."""
    from kvspec.model.case import Case, prefill
    from kvspec.proofs.encoding import decode_geometry

    values = {**args, "E": args["eagle"], "P": args["partial"], "t": args["n"]}
    config = decode_geometry(values)
    return Case(config, args["n"], (prefill(args["n"]),))


def _replay(subject: Subject, args: dict[str, Any]) -> dict[str, Any]:
    from kvspec.oracles.registration import compare

    from .process import SubjectProcess
    from kvspec.model.requests import Run

    if args["n"] < 1:
        return {"confirmed": False, "why": "n = 0 cannot be driven as a prefill"}
    case = case_for(args)
    with SubjectProcess(subject) as proc:
        found = compare(case, proc.capabilities, proc.run(Run.of(case)))
    return {"confirmed": bool(found), "case": case.describe(),
            "discrepancies": [d.summary() for d in found]}


def symbolic_check(subject: Subject, timeout: float = 60.0) -> SymbolicVerdict:
    python, root = resolve_subject(subject)
    env = subject_env(root)
    options = {"timeout": timeout, "kvspec_paths": _kvspec_paths()}
    started = time.perf_counter()
    try:
        out = subprocess.run([python, *interpreter_args(root), "-W", "ignore", str(HARNESS), json.dumps(options)],
                             capture_output=True, text=True, env=env, timeout=timeout * 3 + 120,
                             start_new_session=True)
    except subprocess.TimeoutExpired:
        return SymbolicVerdict(subject.label, SymbolicStatus.INCONCLUSIVE, "", time.perf_counter() - started,
                               detail="the symbolic run overran its budget")
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = " | ".join((out.stderr or out.stdout).strip().splitlines()[-3:])
        return SymbolicVerdict(subject.label, SymbolicStatus.INCONCLUSIVE, "", time.perf_counter() - started,
                               detail=f"the symbolic run failed (exit {out.returncode}): {tail}")
    answer = json.loads(lines[-1])
    common = dict(subject=subject.label, target=answer.get("target", ""),
                  seconds=answer.get("seconds", time.perf_counter() - started),
                  wall_seconds=round(time.perf_counter() - started, 3),
                  paths=answer.get("paths", 0), abstracted=tuple(answer.get("abstracted", ())))
    status = answer["status"]
    if status == "NO_DIFFERENCE" and answer.get("capabilities") is not None:
        # Verified within an era the tree's code shows; if the release it
        # claims to be can express more, that is less than was asked.
        reference, whose = reference_capabilities(answer.get("vllm_version"))
        missing = Capabilities.from_dict(answer["capabilities"]).missing(reference)
        if missing:
            return SymbolicVerdict(status=SymbolicStatus.INCONCLUSIVE,
                                   detail=f"no difference within a reduced scope: the tree lacks "
                                          f"{', '.join(missing)}, which {whose} has", **common)
    if status == "UNSUPPORTED":
        return SymbolicVerdict(status=SymbolicStatus.UNSUPPORTED, detail=answer["reason"], **common)
    if status == "ERROR":
        return SymbolicVerdict(status=SymbolicStatus.INCONCLUSIVE, detail=answer["reason"], **common)
    if status == "NO_DIFFERENCE":
        if answer["exhausted"]:
            return SymbolicVerdict(status=SymbolicStatus.VERIFIED,
                                   detail="all paths exhausted, no difference", **common)
        return SymbolicVerdict(status=SymbolicStatus.INCONCLUSIVE,
                               detail="no difference found, but not every path was explored", **common)
    first = answer["diffs"][0]
    replay = _replay(subject, first["args"])
    counterexample = {**first, "replay": replay}
    if replay["confirmed"]:
        return SymbolicVerdict(status=SymbolicStatus.REFUTED, counterexample=counterexample,
                               detail="replayed on the real KVCacheManager: " + replay["discrepancies"][0],
                               **common)
    return SymbolicVerdict(status=SymbolicStatus.INCONCLUSIVE, counterexample=counterexample,
                           detail="a symbolic difference the real coordinator did not confirm: "
                                  + replay.get("why", "no discrepancy on replay"), **common)
