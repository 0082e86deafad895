"""The kvspec command line: thin argparse subcommands over the packages."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

from kvspec import exitcodes


# When this command started (as near as kvspec can tell): progress lines say
# how long the user has waited, not just how long the fuzzer ran.
STARTED = time.perf_counter()


class UsageError(Exception):
    """A one-line cause and what to do; exits with code 2."""


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text if text.endswith("\n") else text + "\n")


def _progress(enabled: bool):
    def report(result) -> None:
        print(f"  {result.status.value:<8} {result.name} ({result.seconds:.2f}s)", file=sys.stderr)

    return report if enabled else None


def cmd_prove(args: argparse.Namespace) -> int:
    from proofs.catalog import CATALOG, names, theorem
    from proofs.runner import run_catalog
    from proofs.verdict import Status

    from kvspec.render_proofs import render_table, summary, to_json

    if args.theorem:
        unknown = [n for n in args.theorem if n not in names()]
        if unknown:
            raise UsageError(
                f"unknown theorem {unknown[0]!r}; `kvspec prove --list` shows the catalog"
            )
        chosen = [theorem(n) for n in args.theorem]
    else:
        chosen = list(CATALOG)
    if args.list:
        for t in chosen:
            print(f"{t.name}: {t.statement}")
        return exitcodes.OK
    results = run_catalog(
        chosen, timeout_ms=int(args.timeout * 1000), seed=args.seed,
        progress=_progress(sys.stderr.isatty() and not args.quiet),
    )
    print(render_table(results))
    counts = summary(results)
    print(
        f"\n{counts['theorems']} theorems: {counts['proved']} proved, {counts['refuted']} refuted, "
        f"{counts['unknown']} unknown; {counts['unexpected']} not as expected"
    )
    real_code = _real_code_verdicts(args)
    if args.json:
        from kvspec.findings import theorem_finding
        from kvspec.render_proofs import versions

        known = {r.name: r for r in results}
        findings = [f for f in (theorem_finding(r, versions(), known) for r in results) if f]
        _write(args.json, to_json(results, {"timeout_s": args.timeout, "seed": args.seed}, findings,
                                  real_code=[v.as_dict() for v in real_code]))
    unexpected = [r for r in results if not r.as_expected and r.status is not Status.UNKNOWN]
    statuses = {v.status.value for v in real_code}
    if unexpected or "REFUTED" in statuses:
        return exitcodes.FINDING
    if "UNSUPPORTED" in statuses:
        return exitcodes.USAGE
    if any(r.status is Status.UNKNOWN for r in results) or "INCONCLUSIVE" in statuses:
        return exitcodes.UNKNOWN
    return exitcodes.OK


def _real_code_verdicts(args: argparse.Namespace) -> list:
    """The symbolic leg: vLLM's own registration code against the spec."""
    from kvspec.subject_commands import _subject_specs
    from oracles.provision import ProvisionError
    from oracles.subject import SubjectError

    specs = _subject_specs(args)
    if not specs:
        return []
    from oracles.symbolic import symbolic_check

    print("\nreal code, symbolically (CrossHair, unbounded integers): vLLM's own method vs the spec")
    verdicts = []
    for spec in specs:
        try:
            verdict = symbolic_check(spec, timeout=args.timeout * 3)
        except (SubjectError, ProvisionError) as exc:
            raise UsageError(str(exc)) from None
        verdicts.append(verdict)
        print(f"  {spec.label}: {verdict.status.value} {verdict.target} ({verdict.detail}; "
              f"{verdict.paths} paths, {verdict.seconds:.1f} s symbolic, {verdict.wall_seconds:.1f} s "
              "in all)")
        cx = verdict.counterexample
        if cx:
            args_text = ", ".join(f"{k}={v}" for k, v in cx["args"].items())
            print(f"    counterexample: {args_text}: vLLM {cx['real']}, spec {cx['spec']}")
            if cx["replay"].get("case"):
                print(f"    replayed as: {cx['replay']['case']}")
        for note in verdict.abstracted:
            print(f"    abstracted: {note}")
    return verdicts


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvspec",
        description="Formal model and differential tests for vLLM's prefix-cache registration boundary.",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    prove = sub.add_parser("prove", help="run the Z3 theorem catalog")
    prove.add_argument("--theorem", action="append", metavar="NAME", help="run only this theorem (repeatable)")
    prove.add_argument("--list", action="store_true", help="list the theorems and exit")
    prove.add_argument("--json", metavar="FILE", help="write the versioned machine-readable result")
    prove.add_argument("--timeout", type=float, default=20.0, metavar="SECONDS",
                       help="per solver query (default 20); a timeout is UNKNOWN, never PROVED")
    prove.add_argument("--seed", type=int, default=0, help="z3 random seed (default 0)")
    prove.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    prove.set_defaults(func=cmd_prove)

    from kvspec import subject_commands

    subject_commands.add_subject_arguments(prove)  # the real code, checked symbolically

    subject_commands.register(sub)
    return parser


def _version() -> str:
    import kvspec

    return f"kvspec {kvspec.__version__}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help is 0, a usage error is 2
        return int(exc.code or 0)
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"kvspec: error: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    except KeyboardInterrupt:
        print("kvspec: interrupted", file=sys.stderr)
        return 130
