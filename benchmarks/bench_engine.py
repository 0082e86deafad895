"""The engine differential's cost against a warm worker: checking versus the
same engine programs driven through vLLM's real Scheduler unchecked.

Run:  python benchmarks/bench_engine.py [--version 0.34.0] [--examples 200] [--seeds 0 1 2]

For each seed the engine differential runs ``--examples`` programs
(Hypothesis drawing engine setups and inputs, every schedule() and output
checked), keeping the programs it ran.  Then the same programs are replayed
without Hypothesis twice, in turn: checked (the state read after every
schedule() and output and held to every invariant, as ``kvspec replay``
does) and unchecked (the same engine built and driven by the same messages,
nothing read, nothing checked).  Reported: engine steps per CPU-second of
the two processes together (kvspec and the worker), each line's median over
the seeds, and the ratio checked / unchecked (the issue's goal: at most 2x).
One warm-up run is discarded first.
"""

from __future__ import annotations

import argparse
import os
import statistics

from kvspec.diff_tests.engine import fuzz_engine, replay_engine_program
from kvspec.model.known import known_bugs, recognise
from kvspec.model.requests import EngineOps, OpenEngine
from kvspec.subjects.process import SubjectProcess
from kvspec.subjects.subject import release


def _cpu(pid: int) -> float:
    """CPU seconds of this process and of the worker ``pid`` so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    own = os.times()
    return own.user + own.system + (int(fields[11]) + int(fields[12])) / ticks


def replay(proc: SubjectProcess, programs: list, check: bool) -> tuple[int, float]:
    """Engine steps driven and the CPU seconds they took (engines built included)."""
    known = known_bugs(proc.identity.get("vllm_version"))
    steps = 0
    before = _cpu(proc.worker_pid)
    for program in programs:
        if check:  # as kvspec replay checks it (a known vLLM bug met stops the program there)
            found, _ = replay_engine_program(proc, program)
            assert all(recognise(known, [d]) for d in found), [d.summary() for d in found]
        else:
            opened = proc.session(OpenEngine(program.setup.message()))
            assert opened["ok"], opened.get("error")
            reply = proc.session(EngineOps((dict(op) for op in program.ops), observe=False))
            assert reply["ok"], reply.get("error")
        steps += sum(op["do"] == "step" for op in program.ops)
    return steps, _cpu(proc.worker_pid) - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default="0.34.0")
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    rows = []
    with SubjectProcess(release(args.version)) as proc:
        fuzz_engine(proc, 20, 99)  # warm-up, discarded
        for seed in args.seeds:
            programs: list = []
            before = _cpu(proc.worker_pid)
            result = fuzz_engine(proc, args.examples, seed, keep_programs=programs)
            fuzz_cpu = _cpu(proc.worker_pid) - before
            assert result.failure is None, result.failure.discrepancies[0].summary()
            programs = [p for p in programs if p.ops]
            steps, checked_cpu = replay(proc, programs, check=True)
            _, unchecked_cpu = replay(proc, programs, check=False)
            rows.append((steps / checked_cpu, steps / unchecked_cpu, checked_cpu / unchecked_cpu,
                         result.tally.schedules / fuzz_cpu))
            print(f"seed {seed}: {len(programs)} programs, {steps} engine steps; checked {rows[-1][0]:,.0f} steps "
                  f"per CPU-s, unchecked {rows[-1][1]:,.0f}: checking costs {rows[-1][2]:.2f}x; the differential "
                  f"with Hypothesis {rows[-1][3]:,.0f} steps per CPU-s")
    median = [statistics.median(column) for column in zip(*rows)]
    print(f"median over seeds {args.seeds}: checked {median[0]:,.0f} engine steps per CPU-second, unchecked "
          f"{median[1]:,.0f}, checking costs {median[2]:.2f}x; the whole differential (Hypothesis drawing) "
          f"{median[3]:,.0f}")


if __name__ == "__main__":
    main()
