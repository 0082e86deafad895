"""Symbolic conformance of a subject's real registration code, with replay.

Runs ``symbolic_worker.py`` in the subject's runtime (CrossHair executing
vLLM's own method on symbolic integers against the spec), then replays every
counterexample through the normal driver on the real ``KVCacheManager``: a
REFUTED verdict is only given when the replay shows the same discrepancy.
A search that did not explore every path is INCONCLUSIVE, never VERIFIED.
"""

from __future__ import annotations

import enum
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import attrs

from .subject import SubjectSpec, resolve_subject, subject_env

__all__ = ["SymbolicStatus", "SymbolicVerdict", "symbolic_check", "case_for"]

SYMBOLIC_WORKER = Path(__file__).with_name("symbolic_worker.py")
KVSPEC_ROOT = Path(__file__).resolve().parent.parent


class SymbolicStatus(str, enum.Enum):
    # Every path of vLLM's code and the spec explored: no input makes them differ.
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
    counterexample: dict[str, Any] | None = None  # inputs, real vs spec, replay outcome
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        d = attrs.asdict(self)
        d["status"] = self.status.value
        d["abstracted"] = list(self.abstracted)
        return d


def case_for(args: dict[str, Any]):
    """A symbolic counterexample as a driver case: one prefill of n tokens on a
    realizable configuration (the proofs' own decoding)."""
    from proofs.encoding import decode_geometry

    from .case import Case, prefill

    values = {**args, "E": args["eagle"], "P": args["partial"], "t": args["n"]}
    config = decode_geometry(values)
    return Case(config, args["n"], (prefill(args["n"]),))


def _replay(spec: SubjectSpec, args: dict[str, Any]) -> dict[str, Any]:
    from .oracle import compare
    from .subject import SubjectProcess

    if args["n"] < 1:
        return {"confirmed": False, "why": "n = 0 cannot be driven as a prefill"}
    case = case_for(args)
    with SubjectProcess(spec) as proc:
        found = compare(case, proc.capabilities, proc.run(case.to_worker()))
    return {"confirmed": bool(found), "case": case.describe(),
            "discrepancies": [d.summary() for d in found]}


def symbolic_check(spec: SubjectSpec, timeout: float = 60.0) -> SymbolicVerdict:
    python, root = resolve_subject(spec)
    env = subject_env(root)
    # kvspec's own model and proofs are imported by the symbolic worker too.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (env.get("PYTHONPATH"), str(KVSPEC_ROOT))))
    started = time.perf_counter()
    try:
        out = subprocess.run([python, "-W", "ignore", str(SYMBOLIC_WORKER), json.dumps({"timeout": timeout})],
                             capture_output=True, text=True, env=env, timeout=timeout * 3 + 120)
    except subprocess.TimeoutExpired:
        return SymbolicVerdict(spec.label, SymbolicStatus.INCONCLUSIVE, "", time.perf_counter() - started,
                               detail="the symbolic run overran its budget")
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = " | ".join((out.stderr or out.stdout).strip().splitlines()[-3:])
        return SymbolicVerdict(spec.label, SymbolicStatus.INCONCLUSIVE, "", time.perf_counter() - started,
                               detail=f"the symbolic run failed (exit {out.returncode}): {tail}")
    answer = json.loads(lines[-1])
    common = dict(subject=spec.label, target=answer.get("target", ""),
                  seconds=answer.get("seconds", time.perf_counter() - started),
                  wall_seconds=round(time.perf_counter() - started, 3),
                  paths=answer.get("paths", 0), abstracted=tuple(answer.get("abstracted", ())))
    status = answer["status"]
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
    replay = _replay(spec, first["args"])
    counterexample = {**first, "replay": replay}
    if replay["confirmed"]:
        return SymbolicVerdict(status=SymbolicStatus.REFUTED, counterexample=counterexample,
                               detail="replayed on the real KVCacheManager: " + replay["discrepancies"][0],
                               **common)
    return SymbolicVerdict(status=SymbolicStatus.INCONCLUSIVE, counterexample=counterexample,
                           detail="a symbolic difference the real coordinator did not confirm: "
                                  + replay.get("why", "no discrepancy on replay"), **common)
