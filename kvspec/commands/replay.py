"""``kvspec replay FINDING.json``: rerun a stored fuzz finding on real vLLM
and say STILL FAILING, FIXED or NOT AFFECTED.  An engine finding still
failing gets its impact measured on that subject (``kvspec.findings.impact``).

The finding file is untrusted: its case is validated by kvspec's model, and
it never chooses code to run.  The subject is what the command line names;
by default the release (or kvspec mutant of a release) the finding records,
by version number only.  A finding from a source tree needs the tree named
again with ``--vllm-src``.

Exit codes: 0 fixed or not affected, 1 still failing, 2 usage or input error.
"""

from __future__ import annotations

import argparse

from kvspec.arguments import add_subject_arguments, subjects
from kvspec.model.errors import InputError, UsageError
from kvspec.model.outcome import Outcome

HELP = "rerun a stored finding: STILL FAILING, FIXED or NOT AFFECTED"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("finding", metavar="FINDING.json")
    add_subject_arguments(parser)


def _recorded_subject(finding):
    """The subject a finding was found on, rebuilt from its version (and
    mutant) only, never from a path stored in the file."""
    from kvspec.subjects.subject import mutant_subject, release

    stored = finding.compared.get("subject") or {}
    kind, version = stored.get("kind"), stored.get("version")
    if kind == "release" and isinstance(version, str):
        return release(version)
    if kind == "mutant" and isinstance(version, str) and isinstance(stored.get("mutant"), str):
        return mutant_subject(version, stored["mutant"])
    raise UsageError(f"this finding was found on {stored.get('label', 'a subject')!r}, not a release: name "
                     "what to replay it against with --vllm VERSION or --vllm-src PATH")


def run(args: argparse.Namespace) -> Outcome:
    from kvspec.diff_tests.engine import replay_engine_program
    from kvspec.diff_tests.stateful import replay_program
    from kvspec.model.case import Case
    from kvspec.model.engine import EngineProgram
    from kvspec.model.program import Program
    from kvspec.oracles.lookup import check_case
    from kvspec.report.stored import load_findings
    from kvspec.subjects.process import SubjectProcess
    from kvspec.model.requests import Run

    findings = [f for f in load_findings(args.finding) if f.source == "fuzz"]
    if not findings:
        raise UsageError(f"{args.finding} holds no fuzz finding to replay (proof findings "
                         "replay with `kvspec prove --theorem NAME`)")
    inputs = []
    for finding in findings:
        try:
            if "engine_program" in finding.inputs:  # an engine finding
                inputs.append(EngineProgram.from_dict(finding.inputs["engine_program"]))
            elif "program" in finding.inputs:  # a stateful finding
                inputs.append(Program.from_dict(finding.inputs["program"]))
            else:
                inputs.append(Case.from_dict(finding.inputs))
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise InputError(f"{args.finding}: the finding's inputs are not ones kvspec can run ({exc})") from None
    named = subjects(args)
    still_failing = False
    for finding, subject_input in zip(findings, inputs):
        for subject in named or [_recorded_subject(finding)]:
            with SubjectProcess(subject) as proc:
                impact = None
                if isinstance(subject_input, EngineProgram):
                    found, _ = replay_engine_program(proc, subject_input)
                    if found:  # what a user sees, measured at the finding's engine configuration
                        from kvspec.findings.impact import attach_engine_impact

                        impact = attach_engine_impact(proc, finding).impact
                elif isinstance(subject_input, Program):
                    found, _ = replay_program(proc, subject_input)
                else:
                    found = check_case(subject_input, proc.capabilities, proc.run(Run.of(subject_input)))
                version = proc.identity.get("vllm_version")
            print(f"{subject.label} (vLLM {version}): {subject_input.describe()}")
            if found:
                still_failing = True
                print("  STILL FAILING")
                for d in found:
                    print(f"  {d.summary()}")
                if impact is not None:
                    print(f"  impact: {impact.summary}")
            elif subject.label == finding.compared.get("subject", {}).get("label"):
                print(f"  FIXED (was {finding.category.title}; this run agrees with {_rule(finding)})")
            else:
                # Another subject than the one the finding came from: it agrees
                # on this input, which says nothing of whether it ever had the bug.
                print(f"  NOT AFFECTED (agrees with {_rule(finding)} on this input; the finding, "
                      f"{finding.category.title}, was made on {finding.compared.get('subject', {}).get('label')})")
    return Outcome.FINDING if still_failing else Outcome.OK


def _rule(finding) -> str:
    if "engine_program" in finding.inputs:
        return "the state invariants and the registration bound on every cache_blocks call, through vLLM's Scheduler"
    return "the state invariants" if finding.category.is_state or "program" in finding.inputs else "the spec"
