"""The bounded-exhaustive sweep and the symbolic leg: how fast, on real vLLM.

Run:  python benchmarks/bench_exhaust.py [--version 0.33.0] [--repeats 3]
Reports the sweep's cache_blocks calls per second with 1 and 2 workers (wall
clock, every call compared with the oracle) next to the raw driver's rate
(calls per second of time inside the workers), and the time to a symbolic
verdict on the release and on its #50062 mutant (median of the repeats;
CrossHair's own time and the whole run including vLLM's import).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from kvspec.diff_tests.exhaustive import Scope, exhaust
from kvspec.subjects.process import SubjectProcess
from kvspec.subjects.subject import mutant_subject, release
from kvspec.subjects.symbolic import symbolic_check


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--version", default="0.33.0")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("command:", " ".join([os.path.basename(sys.executable)] + sys.argv))
    scope = Scope()
    for jobs in (1, 2):
        procs = [SubjectProcess(release(args.version)) for _ in range(jobs)]
        try:
            runs = [exhaust(procs, scope) for _ in range(args.repeats)]
        finally:
            for p in procs:
                p.close()
        rate = statistics.median(r["calls_per_second"] for r in runs)
        raw = statistics.median(r["raw_driver_calls_per_worker_second"] for r in runs)
        print(f"exhaust {args.version}, {jobs} worker(s): {runs[0]['cases']} cases, {runs[0]['calls']} calls "
              f"in {statistics.median(r['seconds'] for r in runs):.1f} s: {rate:.0f} calls/s compared "
              f"({rate / jobs:.0f} per worker); raw driver {raw:.0f} calls per worker-second "
              f"(ratio {raw / (rate / jobs):.2f})")
    spec_mutant = mutant_subject(args.version, "refloor_50062")
    for label, subject in ((f"vLLM {args.version}", release(args.version)),
                        ("#50062 mutant", spec_mutant)):
        verdicts = [symbolic_check(subject) for _ in range(args.repeats)]
        print(f"symbolic {label}: {verdicts[0].status.value}, "
              f"{statistics.median(v.seconds for v in verdicts):.1f} s in CrossHair, "
              f"{statistics.median(v.wall_seconds for v in verdicts):.1f} s in all (median of {args.repeats})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
