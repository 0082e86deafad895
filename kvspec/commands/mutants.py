"""``kvspec mutants``: apply every mutation operator to a release, fuzz each
mutant, and print a kill matrix (one column per technique: the proof, the
per-request differential, the stateful differential (state-side mutants, or
every one with ``--every-technique``), the exhaustive scope and, with
``--symbolic``, the mutant's real code checked symbolically).

Exit codes: 0 every non-equivalent mutant killed, 1 a mutant survived, 2
usage or setup error.
"""

from __future__ import annotations

import argparse
import json
import time

from kvspec.arguments import positive_int, writable
from kvspec.model.outcome import Outcome, RunStatus

HELP = "fuzz every mutant of a release and print a kill matrix"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vllm", required=True, metavar="VERSION", help="release to mutate (0.28.0+)")
    parser.add_argument("--mutant", action="append", metavar="NAME", help="only this operator (repeatable)")
    parser.add_argument("--max-examples", type=positive_int, default=1000, metavar="N")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--symbolic", action="store_true",
                        help="add the symbolic column: each mutant's real code checked with CrossHair")
    parser.add_argument("--every-technique", action="store_true",
                        help="run the stateful differential on every mutant, not only the state-side ones "
                             "(the full matrix of which technique kills what)")


def run(args: argparse.Namespace) -> Outcome:
    from kvspec.usecases.mutants import kill_matrix
    from kvspec.model.about import SCHEMAS
    from kvspec.report.files import write_text
    from kvspec.report.mutants import KillRow, render_matrix
    from kvspec.subjects.mutation import mutant
    from kvspec.subjects.provision import ensure_release

    json_path = writable(args.json, "--json")
    for name in args.mutant or []:
        mutant(name)  # an unknown name is a usage error now
    ensure_release(args.vllm)  # a release that cannot be provisioned is a setup error now
    print(f"kvspec mutants: vLLM {args.vllm}, seed {args.seed}, up to {args.max_examples} examples each")
    started = time.perf_counter()

    def record(rows, status: RunStatus = RunStatus.INCOMPLETE) -> None:
        if json_path is not None:
            write_text(json_path, json.dumps(
                {"schema": SCHEMAS["mutants"], "status": status.value, "vllm": args.vllm, "seed": args.seed,
                 "max_examples": args.max_examples, "seconds": round(time.perf_counter() - started, 2),
                 "mutants": [r.as_dict() for r in rows]}, indent=2, sort_keys=True))

    rows = kill_matrix(args.vllm, args.max_examples, args.seed, args.mutant, symbolic=args.symbolic,
                       every_technique=args.every_technique, on_row=record)
    record(rows, RunStatus.COMPLETE)
    total = time.perf_counter() - started
    print(render_matrix([KillRow.parse(r.as_dict()) for r in rows]))
    killed = sum(r.status == "killed" for r in rows)
    survived = [r.name for r in rows if r.status == "survived"]
    errors = [r.name for r in rows if r.status == "error"]
    inapplicable = [r.name for r in rows if r.status == "not applicable"]
    print(f"\n{killed}/{len(rows)} killed, {len(survived)} survived, "
          f"{sum(r.status == 'equivalent' for r in rows)} equivalent, {len(errors)} errors, "
          f"{len(inapplicable)} not applicable to {args.vllm}"
          f"{' (' + ', '.join(inapplicable) + ')' if inapplicable else ''}; {total:.1f} s in all")
    if survived:
        return Outcome.FINDING
    return Outcome.USAGE if errors else Outcome.OK
