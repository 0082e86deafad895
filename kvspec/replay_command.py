"""``kvspec replay FINDING.json``: rerun a stored finding, say FIXED or STILL FAILING."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kvspec import exitcodes


def _findings(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The findings in a stored finding file or a `kvspec fuzz --json` result."""
    if doc.get("finding"):
        return [{**doc["finding"], "subject": doc.get("subject", {})}]
    return [{**s["finding"], "subject": s["subject"]} for s in doc.get("subjects", []) if s.get("finding")]


def cmd_replay(args: argparse.Namespace) -> int:
    from kvspec.cli import UsageError
    from kvspec.subject_commands import _subject_specs
    from oracles.case import Case
    from oracles.oracle import compare
    from oracles.subject import SubjectError, SubjectProcess, SubjectSpec

    try:
        doc = json.loads(Path(args.finding).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read finding {args.finding}: {exc}") from None
    if not str(doc.get("schema", "")).startswith("kvspec.fuzz/"):
        raise UsageError(f"{args.finding} is not a kvspec fuzz finding (schema {doc.get('schema')!r})")
    findings = _findings(doc)
    if not findings:
        raise UsageError(f"{args.finding} holds no finding")
    try:
        specs = _subject_specs(args)
    except SubjectError as exc:
        raise UsageError(str(exc)) from None
    still_failing = False
    for finding in findings:
        case = Case.from_dict(finding["case"])
        stored = finding["subject"]
        subject_specs = specs or [SubjectSpec(stored["kind"], stored["label"],
                                              version=stored.get("version"), path=stored.get("path"))]
        for spec in subject_specs:
            with SubjectProcess(spec) as proc:
                found = compare(case, proc.capabilities, proc.run(case.to_worker()))
            print(f"{spec.label}: {case.describe()}")
            if found:
                still_failing = True
                print("  STILL FAILING")
                for d in found:
                    print(f"  {d.summary()}")
            else:
                print(f"  FIXED (was {finding['category']}; now agrees with the spec)")
    return exitcodes.FINDING if still_failing else exitcodes.OK


def register(sub: "argparse._SubParsersAction") -> None:
    from kvspec.subject_commands import add_subject_arguments

    replay = sub.add_parser("replay", help="rerun a stored finding: FIXED or STILL FAILING")
    replay.add_argument("finding", metavar="FINDING.json")
    add_subject_arguments(replay)
    replay.set_defaults(func=cmd_replay)
