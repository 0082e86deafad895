"""Times every theorem of the catalog: median of 3 z3 seeds, fresh contexts.

Run:  python benchmarks/bench_prove.py [--seeds 0 1 2] [--with-vacuity]
Each theorem's main query (the proof or the minimised counterexample) runs in
its own z3.Context; the vacuity checks are timed separately when asked for.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvspec.proofs.catalog import CATALOG
from kvspec.proofs.runner import Budget, run_theorem


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--with-vacuity", action="store_true")
    parser.add_argument("--rlimit", type=int, default=None, help="resource units per check (default: kvspec's)")
    args = parser.parse_args()
    print("command:", " ".join([os.path.basename(sys.executable)] + sys.argv))
    totals = []
    rows = []
    for seed in args.seeds:
        start = time.perf_counter()
        for theorem in CATALOG:
            budget = Budget(rlimit=args.rlimit) if args.rlimit else Budget()
            result = run_theorem(theorem, budget=budget, seed=seed, vacuity=args.with_vacuity)
            rows.append((theorem.name, seed, result.seconds, result.status.value,
                         result.resources["most_per_check"]))
        totals.append(time.perf_counter() - start)
    print(f"{'theorem':<44} {'median s':>9} {'max s':>7} {'units (most/check)':>19}  verdicts")
    slowest = 0.0
    for theorem in CATALOG:
        mine = [r for r in rows if r[0] == theorem.name]
        times = [r[2] for r in mine]
        verdicts = sorted({r[3] for r in mine})
        slowest = max(slowest, statistics.median(times))
        units = max(r[4] for r in mine)
        print(f"{theorem.name:<44} {statistics.median(times):9.3f} {max(times):7.3f} {units:19,}  "
              f"{'/'.join(verdicts)}")
    print(f"\nwhole catalog ({len(CATALOG)} theorems, vacuity {'on' if args.with_vacuity else 'off'}): "
          f"median {statistics.median(totals):.2f} s over seeds {args.seeds}; "
          f"slowest theorem median {slowest:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
