"""``kvspec prove``: the theorem catalog over unbounded integers, and with
``--vllm`` / ``--vllm-src`` a release's own registration code checked
symbolically against the subject.

Exit codes: 0 every theorem as expected, 1 something refuted that should hold
(or a wrong variant proved equivalent, or real code refuted), 2 usage or
setup error, 3 unknown (a budget ran out; never counted as proved).
"""

from __future__ import annotations

import argparse
import sys

from kvspec.arguments import add_budget_arguments, add_subject_arguments, budget, subjects, writable
from kvspec.model.outcome import Outcome, worst

HELP = "run the Z3 theorem catalog (and check a release's own code symbolically)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--theorem", action="append", metavar="NAME", help="run only this theorem (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the theorems and exit")
    parser.add_argument("--json", metavar="FILE", help="write the versioned machine-readable result")
    add_budget_arguments(parser)
    parser.add_argument("--seed", type=int, default=0, help="z3 random seed (default 0)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    add_subject_arguments(parser)  # the real code, checked symbolically


def _progress(enabled: bool):
    def report(result) -> None:
        print(f"  {result.status.value:<8} {result.name} ({result.seconds:.2f}s)", file=sys.stderr)

    return report if enabled else None


def run(args: argparse.Namespace) -> Outcome:
    from kvspec.usecases.prove import prove
    from kvspec.usecases.real_code import real_code
    from kvspec.model.about import versions
    from kvspec.proofs.catalog import CATALOG, theorem
    from kvspec.report.files import write_text
    from kvspec.findings.assemble import theorem_finding
    from kvspec.report.proofs import render_table, summary, to_json

    json_path = writable(args.json, "--json")
    named = subjects(args)
    if args.list:
        for t in ([theorem(n) for n in args.theorem] if args.theorem else CATALOG):
            print(f"{t.name}: {t.statement}")
        return Outcome.OK
    proved = prove(args.theorem, budget=budget(args), seed=args.seed,
                            progress=_progress(sys.stderr.isatty() and not args.quiet))
    print(render_table(proved.results))
    counts = summary(proved.results)
    print(f"\n{counts['theorems']} theorems: {counts['proved']} proved, {counts['refuted']} refuted, "
          f"{counts['unknown']} unknown; {counts['unexpected']} not as expected"
          + (f"\nUNKNOWN: the solver budget ran out on {counts['unknown']} theorem(s): no conclusion on them "
             "(raise --rlimit or --timeout)" if counts["unknown"] else ""))
    verdicts = []
    if named:
        print("\nreal code, symbolically (CrossHair, unbounded integers): vLLM's own method vs the spec")
        verdicts = real_code(named, timeout_s=args.symbolic_timeout)
    if json_path is not None:
        known = {r.name: r for r in proved.results}
        findings = [f for f in (theorem_finding(r, versions(), known) for r in proved.results) if f]
        write_text(json_path, to_json(proved.results, proved.settings, findings,
                                      real_code=[v.as_dict() for v in verdicts]))
    return worst([proved.outcome, *(v.outcome for v in verdicts)])
