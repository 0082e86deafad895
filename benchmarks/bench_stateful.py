"""The stateful differential's cost against a warm 0.34.0 worker.

Run:  python benchmarks/bench_stateful.py [--version 0.34.0] [--examples 300] [--seeds 0 1 2]

For each seed: the stateful differential runs ``--examples`` programs
(Hypothesis drawing the rules, one message per rule, the manager's state
read after every operation and held to every invariant), keeping the
programs it ran; then the same driver runs unchecked: the same seed draws
the same programs (asserted) and sends the same messages, but the worker
reads no state and nothing is checked.  Their ratio is what checking costs
(the issue's goal: at most 2x).  Reported: operations per CPU-second of the
two processes together (kvspec and the worker), each line's median over the
seeds.  Beside them, the cheapest drivers of the same programs, which show
where the rest goes: replayed without Hypothesis, every program's operations
in one message with nothing read (batched raw) or one message per operation;
batched with the whole state read and sent after every operation but not
checked (the floor of any check that reads the state); batched and checked,
as ``kvspec replay`` does (reading and checking without Hypothesis).
One warm-up run is discarded first.
"""

from __future__ import annotations

import argparse
import os
import statistics

from kvspec.diff_tests.stateful import drive_unchecked, fuzz_stateful, replay_program
from kvspec.model.requests import MachineOps, OpenMachine
from kvspec.subjects.process import SubjectProcess
from kvspec.subjects.subject import release


def _cpu(pid: int) -> float:
    """CPU seconds of this process and of the worker ``pid`` so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    worker = (int(fields[11]) + int(fields[12])) / ticks
    own = os.times()
    return own.user + own.system + worker


def checked(proc: SubjectProcess, examples: int, seed: int) -> tuple[int, float, list]:
    programs: list = []
    before = _cpu(proc.worker_pid)
    result = fuzz_stateful(proc, examples, seed, keep_programs=programs)
    assert result.failure is None, result.failure.discrepancies[0].summary()
    return result.tally.operations, _cpu(proc.worker_pid) - before, programs


def unchecked(proc: SubjectProcess, examples: int, seed: int, programs: list) -> float:
    """The state machine unchecked: its CPU seconds."""
    before = _cpu(proc.worker_pid)
    driven = drive_unchecked(proc, examples, seed)
    cpu = _cpu(proc.worker_pid) - before
    assert driven == programs, "the unchecked driver drew other programs than the checked one"
    return cpu


def checked_replay(proc: SubjectProcess, programs: list) -> tuple[int, float]:
    """The same programs checked as ``kvspec replay`` checks one: every
    program's operations in one message, the state read after each and held
    to every invariant, no Hypothesis: the cost of checking alone."""
    before = _cpu(proc.worker_pid)
    operations = 0
    for program in programs:
        found, _ = replay_program(proc, program)
        assert not found, found[0].summary()
        operations += len(program.ops)
    return operations, _cpu(proc.worker_pid) - before


def raw(proc: SubjectProcess, programs: list, per_message: bool = False,
        observe: bool = False) -> tuple[int, float]:
    """The same programs unobserved and unchecked: every program's operations
    in one message, or (``per_message``) one message per operation as the
    state machine sends them; ``observe``: batched, the state read and sent
    after every operation but not checked (the floor of any checking that
    reads the whole state)."""
    before = _cpu(proc.worker_pid)
    operations = 0
    for program in programs:
        opened = proc.session(OpenMachine(program.machine_case()))
        assert opened.get("ok"), opened
        batches = [[dict(op)] for op in program.ops] if per_message else [[dict(op) for op in program.ops]]
        for ops in batches:
            reply = proc.session(MachineOps(ops, observe=observe))
            assert reply.get("ok"), reply
        operations += len(program.ops)
    return operations, _cpu(proc.worker_pid) - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default="0.34.0")
    parser.add_argument("--examples", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    with SubjectProcess(release(args.version)) as proc:
        proc.ready()
        checked(proc, 30, 99)  # warm-up, discarded
        rows = []
        for seed in args.seeds:
            ops, cpu, programs = checked(proc, args.examples, seed)
            unchecked_cpu = unchecked(proc, args.examples, seed, programs)
            raw_ops, raw_cpu = raw(proc, programs)
            _, message_cpu = raw(proc, programs, per_message=True)
            _, replay_cpu = checked_replay(proc, programs)
            _, observed_cpu = raw(proc, programs, observe=True)
            assert raw_ops == ops
            rows.append((seed, ops, ops / cpu, raw_ops / raw_cpu, ops / message_cpu, ops / replay_cpu,
                         ops / observed_cpu, ops / unchecked_cpu))
            print(f"seed {seed}: {ops} operations in {len(programs)} programs; checked {ops / cpu:,.0f} ops per "
                  f"CPU-s, unchecked {ops / unchecked_cpu:,.0f}, checked replay {ops / replay_cpu:,.0f}, raw "
                  f"{raw_ops / raw_cpu:,.0f} (batched) and {ops / message_cpu:,.0f} (a message per operation)",
                  flush=True)
    checked_median = statistics.median(r[2] for r in rows)
    raw_median = statistics.median(r[3] for r in rows)
    unchecked_median = statistics.median(r[7] for r in rows)
    print(f"\nvLLM {args.version}, {args.examples} programs per seed, seeds {args.seeds}:")
    print(f"  checked (stateful differential): median {checked_median:,.0f} operations per CPU-second")
    print(f"  the same driver unchecked (same draw, same messages, no state read, nothing checked): median "
          f"{unchecked_median:,.0f} operations per CPU-second; checking costs "
          f"{unchecked_median / checked_median:.2f}x (goal: at most 2x)")
    message_median = statistics.median(r[4] for r in rows)
    print(f"  raw driver (same programs, unchecked, batched): median {raw_median:,.0f} operations per CPU-second")
    print(f"  raw driver, a message per operation: median {message_median:,.0f} operations per CPU-second")
    replay_median = statistics.median(r[5] for r in rows)
    observed_median = statistics.median(r[6] for r in rows)
    print(f"  raw driver reading the whole state after every operation, checking nothing: median "
          f"{observed_median:,.0f} operations per CPU-second ({raw_median / observed_median:.2f}x the batched raw "
          f"driver: the floor of checking by reading the state)")
    print(f"  checked replay (the same programs, batched, every state read and checked, no Hypothesis): median "
          f"{replay_median:,.0f} operations per CPU-second")
    print(f"  the stateful differential costs {raw_median / checked_median:.2f}x the batched raw driver and "
          f"{message_median / checked_median:.2f}x the raw driver sending what it sends; reading and checking the "
          f"state alone (checked replay) costs {raw_median / replay_median:.2f}x the batched raw driver")


if __name__ == "__main__":
    main()
