"""Differential fuzzing speed against real vLLM.

Run:  python benchmarks/bench_fuzz.py [--versions 0.33.0 0.28.0] [--seeds 0 1 2]
Reports, per subject, differential cases per second on a warm worker (median
over seeds, after one discarded warm-up run; a case = one request on a fresh
KVCacheManager, compared with the spec), the same per CPU-second of the two
processes together (the per-core figure), the worker start-up time, the #50062 mutant's time to first
counterexample from a cold `kvspec fuzz` command (wall clock, subprocess) and
on a warm worker.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from diff_tests.fuzz import fuzz_subject  # noqa: E402
from kvspec.mutants_command import mutant_tree  # noqa: E402
from oracles.mutants import mutant  # noqa: E402
from oracles.subject import SubjectProcess, release, source_tree  # noqa: E402


def cold_time_to_counterexample(tree: str, seed: int) -> float:
    """Seconds from starting `kvspec fuzz` until it reports the first
    counterexample (printed as soon as it is found, before shrinking)."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvspec", "fuzz", "--vllm-src", tree, "--seed", str(seed),
         "--max-examples", "2000", "--no-verify-test", "--findings-dir", os.path.join(ROOT, ".kvspec", "bench")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "first counterexample" in line:
            elapsed = time.perf_counter() - start
            proc.kill()  # shrinking and the report are not part of this figure
            proc.wait()
            return elapsed
    proc.wait()
    raise RuntimeError("the mutant was not found")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--versions", nargs="+", default=["0.33.0", "0.28.0"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--examples", type=int, default=300, help="Hypothesis examples per run")
    args = parser.parse_args()
    print("command:", " ".join([os.path.basename(sys.executable)] + sys.argv))
    for version in args.versions:
        started = time.perf_counter()
        with SubjectProcess(release(version)) as proc:
            startup = time.perf_counter() - started
            # Warm both processes (first-use imports, vLLM's first code paths)
            # with a seed the measured runs do not use.
            fuzz_subject(proc, 100, max(args.seeds) + 1)
            rates, worker_share, per_cpu = [], [], []
            for seed in args.seeds:
                seconds_in_worker = [0.0]
                original = proc.stream

                def timed(cases, original=original, acc=seconds_in_worker):
                    for reply in original(cases):
                        acc[0] += reply.get("seconds", 0.0)
                        yield reply

                proc.stream = timed
                cpu_before = time.process_time() + _cpu_seconds(proc._proc.pid)
                result = fuzz_subject(proc, args.examples, seed)
                cpu = time.process_time() + _cpu_seconds(proc._proc.pid) - cpu_before
                proc.stream = original
                per_cpu.append(result.cases / cpu)
                assert result.failure is None, result.failure
                rates.append(result.cases / result.seconds)
                worker_share.append(seconds_in_worker[0] / result.seconds)
        print(f"vLLM {version}: {statistics.median(rates):.0f} differential cases/s warm "
              f"(median of seeds {args.seeds}, {args.examples} Hypothesis examples each; "
              f"range {min(rates):.0f}-{max(rates):.0f}; "
              f"vLLM itself {statistics.median(worker_share):.0%} of the time); "
              f"{statistics.median(per_cpu):.0f} cases per CPU-second (kvspec and worker "
              f"processes together; range {min(per_cpu):.0f}-{max(per_cpu):.0f}); "
              f"worker start-up {startup:.1f} s")
        tree = str(mutant_tree(version, mutant("refloor_50062")))
        colds = [cold_time_to_counterexample(tree, seed) for seed in args.seeds]
        with SubjectProcess(source_tree(tree)) as proc:
            warms = []
            for seed in args.seeds:
                result = fuzz_subject(proc, 2000, seed, stop_at_first=True)
                warms.append(result.seconds_to_first_failure)
        print(f"  #50062 mutant of {version}: first counterexample {statistics.median(colds):.1f} s "
              f"from a cold `kvspec fuzz` (median; {', '.join(f'{c:.1f}' for c in colds)}), "
              f"{statistics.median(warms):.2f} s on a warm worker ({', '.join(f'{w:.2f}' for w in warms)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
