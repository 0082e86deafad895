"""``kvspec exhaust``: every case of a declared small scope on the real vLLM."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kvspec import exitcodes


def cmd_exhaust(args: argparse.Namespace) -> int:
    from kvspec.cli import UsageError
    from kvspec.subject_commands import _subject_specs
    from diff_tests.exhaustive import Scope, exhaust
    from oracles.provision import ProvisionError
    from oracles.subject import SubjectError, SubjectProcess

    specs = _subject_specs(args)
    if len(specs) != 1:
        raise UsageError("name exactly one subject: --vllm VERSION, --vllm-src PATH or --current")
    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    scope = Scope(max_groups=args.max_groups, max_prompt=args.max_prompt)
    print(f"kvspec exhaust: {specs[0].label}, {args.jobs} worker(s)\n  scope: {scope.describe()}")
    procs = []
    try:
        # Every worker starts at once; their vLLM imports overlap.
        procs = [SubjectProcess(specs[0], wait=False) for _ in range(args.jobs)]
        for proc in procs:
            proc.ready()

        def tick(done: int, total: int, seconds: float) -> None:
            if sys.stderr.isatty() and done % 256 < 16:
                print(f"  {done}/{total} cases, {seconds:.0f} s", file=sys.stderr, flush=True)

        result = exhaust(procs, scope, progress=tick)
    except (SubjectError, ProvisionError) as exc:
        raise UsageError(str(exc)) from None
    finally:
        for proc in procs:
            proc.close()
    result["subject"] = procs[0].describe() if procs else {}
    print(f"  {result['cases']} of {result['total_cases']} cases, {result['calls']} cache_blocks calls "
          f"compared in {result['seconds']} s ({result['cases_per_second']} cases/s, "
          f"{result['calls_per_second']} calls/s on {result['workers']} workers)")
    for d in result["discrepancies"]:
        print(f"  DISCREPANCY {d['case']}: {d['found'][0]}")
    verdict = (f"{result['failing_cases']} failing case(s)" if result["failing_cases"]
               else "no discrepancy in the whole scope")
    print(f"kvspec exhaust: {verdict}")
    if args.json:
        Path(args.json).write_text(json.dumps({"schema": "kvspec.exhaust/1", **result}, indent=2,
                                              sort_keys=True) + "\n")
    if result["cases"] < result["total_cases"]:
        return exitcodes.USAGE
    return exitcodes.FINDING if result["failing_cases"] else exitcodes.OK


def register(sub: "argparse._SubParsersAction") -> None:
    from kvspec.subject_commands import add_subject_arguments

    exhaust = sub.add_parser("exhaust", help="run every case of a small declared scope on real vLLM")
    add_subject_arguments(exhaust)
    exhaust.add_argument("--max-groups", type=int, default=3, choices=(2, 3))
    exhaust.add_argument("--max-prompt", type=int, default=48, metavar="N")
    exhaust.add_argument("--jobs", type=int, default=2, metavar="N", help="worker processes (default 2)")
    exhaust.add_argument("--json", metavar="FILE")
    exhaust.set_defaults(func=cmd_exhaust)
