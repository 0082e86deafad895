"""Differential fuzzing speed against real vLLM.

Run:  python benchmarks/bench_fuzz.py [--versions 0.33.0 0.28.0] [--seeds 0 1 2] [--control] [--no-mutant]
Reports, per subject, differential cases per second on a warm worker (median
over seeds, after one discarded warm-up run; a case = one request, on a
KVCacheManager in its initial state, compared with the subject at every
cache_blocks call), the same per CPU-second of the two processes together
(the per-core figure), the worker start-up time, the #50062 mutant's time to
first counterexample from a cold `kvspec fuzz` command (wall clock,
subprocess) and on a warm worker.  --control also measures a worker that
builds a new KVCacheManager for every case instead of resetting one between
the cases of a batch, seed by seed in turn with the normal worker: this
machine's speed drifts by tens of percent between minutes, so only figures
taken side by side compare.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time

from kvspec.diff_tests.fuzz import fuzz_subject
from kvspec.subjects.mutation import ensure_mutant_tree, mutant
from kvspec.subjects.process import SubjectProcess
from kvspec.subjects.subject import mutant_subject, release

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def _measure(proc: SubjectProcess, examples: int, seed: int) -> dict[str, float]:
    """One warm run: cases per wall second, per CPU-second of both processes,
    and the share of the wall time vLLM's worker spent on cases."""
    seconds_in_worker = [0.0]
    original = proc.stream

    def timed(cases, original=original, acc=seconds_in_worker):
        for reply in original(cases):
            acc[0] += reply.get("seconds", 0.0)
            yield reply

    proc.stream = timed
    cpu_before = time.process_time() + _cpu_seconds(proc._proc.pid)
    result = fuzz_subject(proc, examples, seed)
    cpu = time.process_time() + _cpu_seconds(proc._proc.pid) - cpu_before
    proc.stream = original
    assert result.failure is None, result.failure
    return {"wall": result.cases / result.seconds, "cpu": result.cases / cpu,
            "worker": seconds_in_worker[0] / result.seconds, "cases": result.cases}


def _summary(runs: list[dict[str, float]], examples: int) -> str:
    wall, cpu = [r["wall"] for r in runs], [r["cpu"] for r in runs]
    return (f"{statistics.median(wall):.0f} differential cases/s warm (range {min(wall):.0f}-{max(wall):.0f}; "
            f"vLLM itself {statistics.median(r['worker'] for r in runs):.0%} of the time); "
            f"{statistics.median(cpu):.0f} cases per CPU-second (kvspec and worker processes together; "
            f"range {min(cpu):.0f}-{max(cpu):.0f}); "
            f"{sum(r['cases'] for r in runs) / (examples * len(runs)):.1f} cases per example")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--versions", nargs="+", default=["0.33.0", "0.28.0"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--examples", type=int, default=1000, help="Hypothesis examples per run")
    parser.add_argument("--control", action="store_true",
                        help="also measure a worker that builds a KVCacheManager for every case "
                             "(KVSPEC_FRESH_MANAGERS=1), seed by seed in turn with the normal one")
    parser.add_argument("--no-mutant", action="store_true", help="skip the #50062 time-to-counterexample runs")
    args = parser.parse_args()
    print("command:", " ".join([os.path.basename(sys.executable)] + sys.argv))
    for version in args.versions:
        started = time.perf_counter()
        with contextlib.ExitStack() as stack:
            workers = {"reused managers": stack.enter_context(SubjectProcess(release(version)))}
            startup = time.perf_counter() - started
            if args.control:
                os.environ["KVSPEC_FRESH_MANAGERS"] = "1"  # inherited by this worker only
                workers["a manager per case"] = stack.enter_context(SubjectProcess(release(version)))
                del os.environ["KVSPEC_FRESH_MANAGERS"]
            runs: dict[str, list[dict[str, float]]] = {name: [] for name in workers}
            for proc in workers.values():
                # Warm both processes (first-use imports, vLLM's first code paths)
                # with a seed the measured runs do not use.
                fuzz_subject(proc, 100, max(args.seeds) + 1)
            for seed in args.seeds:  # the variants in turn, so drift hits both alike
                for name, proc in workers.items():
                    runs[name].append(_measure(proc, args.examples, seed))
        print(f"vLLM {version} (median of seeds {args.seeds}, {args.examples} Hypothesis examples each; "
              f"worker start-up {startup:.1f} s):")
        for name, measured in runs.items():
            print(f"  {name}: {_summary(measured, args.examples)}")
        if args.control:
            ratios = [a["cpu"] / b["cpu"] for a, b in zip(*runs.values())]
            print(f"  reused / per-case managers, per CPU-second, seed by seed: median {statistics.median(ratios):.2f}x "
                  f"({', '.join(f'{r:.2f}' for r in ratios)})")
        if args.no_mutant:
            continue
        tree = str(ensure_mutant_tree(version, mutant("refloor_50062")))
        colds = [cold_time_to_counterexample(tree, seed) for seed in args.seeds]
        with SubjectProcess(mutant_subject(version, "refloor_50062")) as proc:
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
