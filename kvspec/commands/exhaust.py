"""``kvspec exhaust``: every case of a declared small scope on the real vLLM.

Exit codes: 0 no discrepancy in the whole scope, 1 failing cases, 2 usage or
setup error, 4 incomplete (fewer cases ran than the scope holds).
"""

from __future__ import annotations

import argparse
import json
import sys

from kvspec.arguments import add_subject_arguments, job_count, positive_int, subjects, writable
from kvspec.model.errors import UsageError
from kvspec.model.outcome import Outcome

HELP = "run every case of a small declared scope on real vLLM"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_subject_arguments(parser)
    parser.add_argument("--max-groups", type=int, default=3, choices=(2, 3))
    parser.add_argument("--max-prompt", type=positive_int, default=48, metavar="N")
    parser.add_argument("--jobs", type=job_count, default=2, metavar="N", help="worker processes (default 2)")
    parser.add_argument("--json", metavar="FILE")


def run(args: argparse.Namespace) -> Outcome:
    from kvspec.diff_tests.exhaustive import Scope, exhaust
    from kvspec.model.about import SCHEMAS
    from kvspec.report.files import write_text
    from kvspec.subjects.process import SubjectProcess

    json_path = writable(args.json, "--json")
    named = subjects(args)
    if len(named) != 1:
        raise UsageError("name exactly one subject: --vllm VERSION, --vllm-src PATH or --current")
    scope = Scope(max_groups=args.max_groups, max_prompt=args.max_prompt)
    print(f"kvspec exhaust: {named[0].label}, {args.jobs} worker(s)\n  scope: {scope.describe()}")
    procs = []
    try:
        # Every worker starts at once; their vLLM imports overlap.
        # Each kept as it starts: one that fails to start leaves none behind.
        for _ in range(args.jobs):
            procs.append(SubjectProcess(named[0], wait=False))
        for proc in procs:
            proc.ready()

        def tick(done: int, total: int, seconds: float) -> None:
            if sys.stderr.isatty() and done % 256 < 16:
                print(f"  {done}/{total} cases, {seconds:.0f} s", file=sys.stderr, flush=True)

        result = exhaust(procs, scope, progress=tick)
        result["subject"] = procs[0].describe()
    finally:
        for proc in procs:
            proc.close()
    print(f"  {result['cases']} of {result['total_cases']} cases, {result['calls']} cache_blocks calls "
          f"compared in {result['seconds']} s ({result['cases_per_second']} cases/s, "
          f"{result['calls_per_second']} calls/s on {result['workers']} workers)")
    for d in result["discrepancies"]:
        print(f"  DISCREPANCY {d['case']}: {d['found'][0]}")
    verdict = (f"{result['failing_cases']} failing case(s)" if result["failing_cases"]
               else "no discrepancy in the whole scope")
    if result["cases"] < result["total_cases"]:
        verdict = f"INCOMPLETE: {result['cases']} of {result['total_cases']} cases ran; " + verdict
    print(f"kvspec exhaust: {verdict}")
    if json_path is not None:
        write_text(json_path, json.dumps({"schema": SCHEMAS["exhaust"], **result}, indent=2, sort_keys=True))
    if result["failing_cases"]:
        return Outcome.FINDING
    return Outcome.INCOMPLETE if result["cases"] < result["total_cases"] else Outcome.OK
