"""What completing a finding costs, stage by stage.

Run:  python benchmarks/bench_report.py [--repeat 3] [--version 0.33.0] [--mutant refloor_50062]
                                        [--end-to-end [--hash-scheme legacy]] [--only-end-to-end]
Against a warm worker of the #50062 mutant of 0.33.0 (started, and the
failure found, once, untimed), times each stage of
``kvspec.findings.completion`` -- explain (the proofs' explanation of the
failure, inside ``fuzz_finding``), sweep, plot (SVG and PNG), emit (the test
and its xfail form), the symbolic leg, the emitted test on the subject and
on the release (each alone, then the two at once, as ``kvspec fuzz`` runs
them), ruff -- and ``complete_finding`` as a whole (which overlaps the
symbolic leg and the two test runs), vLLM's own tests on the subject, as
the median of ``--repeat`` runs (range in brackets).  ``--end-to-end`` also
times the documented command ``kvspec fuzz --vllm V --mutant M --seed 0
--markdown F.md`` (with ``--hash-scheme S`` when given) from a warm cache --
one untimed run first, so the release's recorded control and its own test
run are in the cache, as after any earlier run of the command -- in a fresh
findings and example directory each time, the same number of times;
``--only-end-to-end`` times only that.  The machine's load average is printed with the figures: on a
shared 2-core machine they move with it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kvspec.diff_tests.fuzz import fuzz_subject
from kvspec.model.about import versions
from kvspec.findings import completion
from kvspec.emit.regression_test import test_file_name
from kvspec.emit.vllm_tests import idiom_of, tests_root_of
from kvspec.subjects.process import SubjectProcess
from kvspec.subjects.subject import mutant_subject


def _timed(fn, *args):
    started = time.perf_counter()
    value = fn(*args)
    return time.perf_counter() - started, value


def _figure(samples: list[float]) -> str:
    return f"{statistics.median(samples):6.2f} s  [{min(samples):.2f}-{max(samples):.2f}]"


def end_to_end(version: str, operator: str, repeat: int, scheme: str | None) -> list[float]:
    """The documented command, from a warm cache, in a fresh directory each
    time (after one untimed run that warms it)."""
    command = [sys.executable, "-m", "kvspec", "fuzz", "--vllm", version, "--mutant", operator,
               *(["--hash-scheme", scheme] if scheme else []), "--seed", "0", "--markdown", "F.md"]
    out = []
    for index in range(repeat + 1):
        with tempfile.TemporaryDirectory() as scratch:
            load = os.getloadavg()[0]
            started = time.perf_counter()
            run = subprocess.run(command, cwd=scratch, capture_output=True, text=True)
            seconds = time.perf_counter() - started
            assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
            assert (Path(scratch) / "F.md").read_text().startswith("**Impact:**")
            reused = "reused from" in run.stdout
            print(f"  {'warm-up' if index == 0 else f'run {index}'}: {seconds:.1f} s"
                  f"{' (control reused)' if reused else ' (control fuzzed)'}, load average {load:.2f} "
                  "at its start", flush=True)
            if index:
                out.append(seconds)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--version", default="0.33.0")
    parser.add_argument("--mutant", default="refloor_50062")
    parser.add_argument("--end-to-end", action="store_true")
    parser.add_argument("--only-end-to-end", action="store_true")
    parser.add_argument("--hash-scheme", choices=("lookahead", "legacy"), default=None)
    args = parser.parse_args()
    if args.only_end_to_end:
        _end_to_end(args)
        return

    subject = mutant_subject(args.version, args.mutant)
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"({os.cpu_count()} cores)", flush=True)
    times: dict[str, list[float]] = {}
    with SubjectProcess(subject) as proc:
        result = fuzz_subject(proc, 2000, 0, database=None)
        assert result.failure is not None, "the mutant survived: nothing to complete"
        tests_root = tests_root_of(subject)  # provisioned once, untimed
        idiom = idiom_of(tests_root)
        for _ in range(args.repeat):
            def add(stage, seconds):
                times.setdefault(stage, []).append(seconds)
            seconds, finding = _timed(completion.explain_stage, result, versions())
            add("explain", seconds)
            seconds, swept = _timed(completion.sweep_stage, proc, result, finding)
            add("sweep", seconds)
            import attrs

            finding = attrs.evolve(finding, sweep=swept)
            with tempfile.TemporaryDirectory() as scratch:
                add("plot (SVG and PNG)", _timed(completion.plot_stage, finding, Path(scratch) / "f")[0])
                seconds, (code, _) = _timed(completion.emit_stage, finding, proc.capabilities, idiom)
                add("emit (test and xfail form)", seconds)
                name = test_file_name(finding)
                add("symbolic leg", _timed(completion.real_code_stage, subject)[0])
                add("vLLM's own tests on the subject", _timed(completion.vllm_tests_stage, subject, tests_root)[0])
                add("test on the subject, alone", _timed(completion.verify_test, code, name,
                                                          subject, tests_root, _Only("failed"))[0])
                add("test on the release, alone", _timed(completion.verify_test, code, name,
                                                          subject, tests_root, _Only("passed"))[0])
                seconds, checks = _timed(completion.verify_test, code, name, subject, tests_root)
                assert all(c["as_expected"] for c in checks), checks
                add("both tests, at once", seconds)
                seconds, lint = _timed(completion.lint_test, code, name, subject, tests_root)
                add("ruff (check and format)", seconds)
                add("complete_finding in all (overlapping)",
                    _timed(completion.complete_finding, proc, result, Path(scratch) / "findings",
                           versions())[0])
            print(f"  run {len(times['explain'])} of {args.repeat} done", flush=True)
    print(f"\nstage medians of {args.repeat} ({subject.label}, warm worker):")
    for stage, samples in times.items():
        print(f"  {stage:<40} {_figure(samples)}")
    if args.end_to_end:
        _end_to_end(args)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def _end_to_end(args) -> None:
    scheme = f" --hash-scheme {args.hash_scheme}" if args.hash_scheme else ""
    print(f"\nkvspec fuzz --vllm {args.version} --mutant {args.mutant}{scheme} --seed 0 --markdown F.md "
          f"(warm cache, fresh findings and example directories; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}):", flush=True)
    samples = end_to_end(args.version, args.mutant, args.repeat, args.hash_scheme)
    print(f"  {'whole command, median of ' + str(args.repeat):<40} {_figure(samples)}")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


class _Only(ThreadPoolExecutor):
    """A pool that runs only the verification that must end as ``must``
    (the other is answered without running): to time one leg alone."""

    def __init__(self, must: str):
        super().__init__(max_workers=1)
        self.must = must

    def submit(self, fn, *args, **kwargs):
        if args[4] != self.must:
            from concurrent.futures import Future

            done = Future()
            done.set_result({"must": args[4], "as_expected": True, "seconds": 0.0})
            return done
        return super().submit(fn, *args, **kwargs)


if __name__ == "__main__":
    main()
