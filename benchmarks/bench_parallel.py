"""Parallel fuzzing speed-up: `kvspec fuzz --jobs N` against a real release.

Run:  python benchmarks/bench_parallel.py [--version 0.33.0] [--jobs 1 2 3]
                                          [--examples 4000] [--seeds 0 1 2] [--per-job]
Times the whole command (worker start-ups included, the runtime already
provisioned) for the same total budget of Hypothesis examples at each job
count (or, with --per-job, the same budget per job: Hypothesis's cost per
example grows with the length of a run, so splitting one budget gains on two
counts), and reports median wall seconds, differential cases per wall second
and the speed-up over one job. Each job is a Hypothesis engine plus its own
vLLM worker, so N jobs keep 2N processes busy on this machine's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def one_run(version: str, jobs: int, examples: int, seed: int) -> tuple[float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "fuzz.json")
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "kvspec", "fuzz", "--vllm", version, "--jobs", str(jobs),
             "--max-examples", str(examples), "--seed", str(seed), "--database", "",
             "--no-verify-test", "--findings-dir", os.path.join(tmp, "findings"), "--json", out],
            cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        with open(out) as handle:
            (subject,) = json.load(handle)["subjects"]
    return wall, subject["cases"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default="0.33.0")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--examples", type=int, default=4000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--per-job", action="store_true", help="--examples per job, not in all")
    args = parser.parse_args()
    budget = "per job" if args.per_job else "in all"
    print(f"vLLM {args.version}, {args.examples} examples {budget}, seeds {args.seeds}, {os.cpu_count()} cores")
    baseline = None
    for jobs in args.jobs:
        examples = args.examples * jobs if args.per_job else args.examples
        runs = [one_run(args.version, jobs, examples, seed) for seed in args.seeds]
        wall = statistics.median(w for w, _ in runs)
        rate = statistics.median(c / w for w, c in runs)
        baseline = baseline or rate
        print(f"  --jobs {jobs}: median {wall:.1f} s wall, {rate:.0f} cases per wall second, "
              f"speed-up {rate / baseline:.2f}x  (runs: {', '.join(f'{w:.1f} s' for w, _ in runs)})",
              flush=True)


if __name__ == "__main__":
    main()
