"""``kvspec replay FINDING.json``: rerun a stored finding, say FIXED or STILL FAILING."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from kvspec import exitcodes

if TYPE_CHECKING:
    from model.finding import Finding


def load_findings(path: str) -> list["Finding"]:
    """The findings in a stored finding file, a `kvspec fuzz --json` result or
    a `kvspec prove --json` result; a UsageError when there are none."""
    from kvspec.cli import UsageError
    from model.finding import FINDING_SCHEMA, Finding

    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read finding {path}: {exc}") from None
    schema = str(doc.get("schema", ""))
    if schema == FINDING_SCHEMA:
        raw = [doc]
    elif schema == "kvspec.fuzz/2":
        raw = [s["finding"] for s in doc.get("subjects", []) if s.get("finding")]
    elif schema.startswith("kvspec.prove/"):
        raw = doc.get("findings", [])
    else:
        raise UsageError(f"{path} is not a kvspec finding or result (schema {schema!r}); "
                         "findings are stored under .kvspec/findings by `kvspec fuzz`")
    if not raw:
        raise UsageError(f"{path} holds no finding")
    try:
        return [Finding.from_dict(d) for d in raw]
    except (TypeError, ValueError, KeyError) as exc:
        raise UsageError(f"{path}: malformed finding ({exc})") from None


def cmd_replay(args: argparse.Namespace) -> int:
    from kvspec.cli import UsageError
    from kvspec.subject_commands import _subject_specs
    from oracles.case import Case
    from oracles.lookup import check_case
    from oracles.subject import SubjectError, SubjectProcess, SubjectSpec

    findings = [f for f in load_findings(args.finding) if f.source == "fuzz"]
    if not findings:
        raise UsageError(f"{args.finding} holds no fuzz finding to replay (proof findings "
                         "replay with `kvspec prove --theorem NAME`)")
    specs = _subject_specs(args)
    still_failing = False
    for finding in findings:
        case = Case.from_dict(finding.inputs)
        stored = finding.compared["subject"]
        subject_specs = specs or [SubjectSpec(stored["kind"], stored["label"],
                                              version=stored.get("version"), path=stored.get("path"))]
        for spec in subject_specs:
            try:
                with SubjectProcess(spec) as proc:
                    found = check_case(case, proc.capabilities, proc.run(case.to_worker()))
            except SubjectError as exc:
                raise UsageError(str(exc)) from None
            print(f"{spec.label}: {case.describe()}")
            if found:
                still_failing = True
                print("  STILL FAILING")
                for d in found:
                    print(f"  {d.summary()}")
            else:
                print(f"  FIXED (was {finding.category.title}; now agrees with the spec)")
    return exitcodes.FINDING if still_failing else exitcodes.OK


def register(sub: "argparse._SubParsersAction") -> None:
    from kvspec.subject_commands import add_subject_arguments

    replay = sub.add_parser("replay", help="rerun a stored finding: FIXED or STILL FAILING")
    replay.add_argument("finding", metavar="FINDING.json")
    add_subject_arguments(replay)
    replay.set_defaults(func=cmd_replay)
