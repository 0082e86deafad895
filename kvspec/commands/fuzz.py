"""``kvspec fuzz``: differential fuzzing of real vLLM against the subject.

Each subject (a release, a source tree, the current environment, a release
with a ``--mutant`` applied) runs in its own worker.  The JSON and Markdown
are written after every subject and finding, so an error or an interrupt
leaves what was found, marked INCOMPLETE or INTERRUPTED, never "no
discrepancy".

Exit codes: 0 no discrepancy in every subject, 1 a discrepancy, 2 usage or
setup error, 4 incomplete, 5 infrastructure error, 6 hardening (every finding
reaches no known deployment, or is a stateful one on hand-built geometry not
reproduced through vLLM's engine), 70 internal error (a kvspec bug), 130
interrupted (Ctrl-C, SIGTERM, SIGHUP).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

from kvspec.arguments import (add_mutant_argument, add_run_arguments, add_subject_arguments, check_writable,
                              subjects, writable)
from kvspec.model.errors import UsageError
from kvspec.model.outcome import Outcome, RunStatus, worst

HELP = "differential fuzzing against real vLLM coordinators"

# When this command started (as near as kvspec can tell): progress lines say
# how long the user has waited, not just how long the fuzzer ran.
STARTED = time.perf_counter()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_subject_arguments(parser)
    add_mutant_argument(parser, "fuzz")
    add_run_arguments(parser, max_examples=2000)
    parser.add_argument("--markdown", metavar="FILE",
                        help="write a Markdown report (also appended to $GITHUB_STEP_SUMMARY when set)")
    parser.add_argument("--no-verify-test", action="store_true",
                        help="do not run the emitted regression test against the subject")
    parser.add_argument("--hash-scheme", choices=("lookahead", "legacy"), default=None,
                        help="fuzz only this hash scheme (default: every one the subject has; on 0.33+ "
                             "lookahead, its default, and legacy, where the EAGLE branch of the bound runs); "
                             "the verdict says what was left out")
    parser.add_argument("--include-known", action="store_true",
                        help="report a known vLLM bug of the release (model/known.py) as a finding; by "
                             "default one is recognised by its mechanism when an example or program meets it, "
                             "counted and said in the verdict, and the search goes on")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--lookup", action="store_true",
                       help="follow every request with a later one that looks up (get_computed_blocks) and "
                            "check its hit too: the hit-length differential")
    which.add_argument("--stateful", action="store_true",
                       help="the stateful differential alone: one manager driven through many requests "
                            "(shared prefixes, chunks, drafts, preemption, resets, evictions, a small pool), "
                            "its state checked after every operation; --max-examples counts programs")
    which.add_argument("--engine", action="store_true",
                       help="the engine differential alone: vLLM's real Scheduler, built by the release's own "
                            "configuration code from drawn engine flags (defaults included), driven by engine "
                            "inputs, the manager's state checked after every schedule() and output; "
                            "--max-examples counts programs")
    which.add_argument("--all", action="store_true", dest="all_differentials",
                       help="every differential: registration with lookups, then stateful, then engine")


def run(args: argparse.Namespace) -> Outcome:
    named = subjects(args, mutants=True)
    if not named:
        raise UsageError("name a subject: --vllm VERSION, --vllm-src PATH or --current")
    from kvspec.usecases.fuzz import ALL_DIFFERENTIALS

    if args.all_differentials:
        differentials = ALL_DIFFERENTIALS
    elif args.stateful:
        differentials = ("stateful",)
    elif args.engine:
        differentials = ("engine",)
    else:
        differentials = ("lookup",) if args.lookup else ("registration",)
    return fuzz_and_write(named, args, markdown=args.markdown, verify_test=not args.no_verify_test,
                          differentials=differentials)


def _who_is_affected(finding, proc, say):
    """Every finding says which deployments it reaches (kvspec.reach)."""
    from kvspec.reach import attach

    return attach(finding, proc=proc, say=say)


def fuzz_and_write(named, args, *, markdown: str | None, verify_test: bool,
                   differentials: tuple[str, ...]) -> Outcome:
    """Check every output and the database first, then fuzz, writing the
    JSON and Markdown after each subject and once more at the end."""
    from kvspec.usecases import fuzz as fuzzing
    from kvspec.report.files import append_step_summary, write_text
    from kvspec.report.fuzz import fuzz_document, render_markdown
    from kvspec.subjects.subject import resolve_subject

    json_path = writable(args.json, "--json")
    markdown_path = writable(markdown, "--markdown")
    findings_dir = check_writable(args.findings_dir, "--findings-dir")
    for subject in named:
        if subject.kind == "mutant":
            resolve_subject(subject)  # a mutation that cannot be applied stops here, before the control runs
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"kvspec fuzz: seed {seed} (rerun with --seed {seed})", flush=True)
    settings = fuzzing.FuzzSettings(max_examples=args.max_examples, seed=seed, database=args.database,
                                     jobs=args.jobs, differentials=differentials, verify_test=verify_test,
                                     progress=sys.stderr.isatty(),
                                     hash_schemes=(args.hash_scheme,) if getattr(args, "hash_scheme", None)
                                     else None, include_known=args.include_known)

    def record(fuzz_run) -> None:
        if json_path is not None:
            import json

            write_text(json_path, json.dumps(fuzz_document(fuzz_run), indent=2, sort_keys=True))
        if markdown_path is not None:
            write_text(markdown_path, render_markdown(fuzz_run))

    fuzz_run = fuzzing.FuzzRun(settings, [s.label for s in named])
    try:
        fuzzing.fuzz(named, settings, findings_dir, run=fuzz_run, on_update=record, started=STARTED,
                      on_finding=_who_is_affected)
    except KeyboardInterrupt:
        # Recorded as INTERRUPTED; a finding made before still decides the exit code.
        fuzz_run.stopped = fuzz_run.stopped or Outcome.INTERRUPTED
        fuzz_run.stopped_why = fuzz_run.stopped_why or "interrupted"
    finally:
        record(fuzz_run)
        summary_error = None
        if os.environ.get("GITHUB_STEP_SUMMARY"):
            try:
                append_step_summary(render_markdown(fuzz_run))
            except UsageError as exc:  # said, and in the exit code; a finding still outranks it
                summary_error = exc
    if fuzz_run.status is not RunStatus.COMPLETE:
        print(f"kvspec fuzz: {fuzz_run.status.value}: {fuzz_run.why}", flush=True)
    if summary_error is not None:
        print(f"kvspec: error: {summary_error}", file=sys.stderr, flush=True)
        return worst([fuzz_run.outcome, summary_error.outcome])
    return fuzz_run.outcome
