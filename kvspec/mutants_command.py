"""``kvspec mutants``: apply every mutation operator to a release, fuzz each
mutant, and print a kill matrix."""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path
from typing import Any

from kvspec import exitcodes

MUTANTS_SCHEMA = "kvspec.mutants/1"


def _model_verdict(variant_name: str) -> str:
    """What the proofs say of the variant a mutant models: 'equivalent' when
    its conformance theorem is PROVED, else 'non-equivalent' (or 'unknown')."""
    from proofs.catalog import theorem
    from proofs.runner import run_theorem
    from proofs.verdict import Status

    result = run_theorem(theorem(f"conformance.{variant_name}"), vacuity=False)
    return {Status.PROVED: "equivalent", Status.REFUTED: "non-equivalent"}.get(result.status, "unknown")


def mutant_tree(version: str, operator) -> Path:
    from oracles.mutants import make_mutant_tree
    from oracles.provision import cache_root, ensure_release

    dest = cache_root() / "mutants" / version / operator.name
    if not (dest / "MUTANT.json").exists():
        if dest.exists():
            shutil.rmtree(dest)
        make_mutant_tree(ensure_release(version), operator, dest)
    return dest


def _exhaustive_scope():
    from diff_tests.exhaustive import Scope

    return Scope(max_groups=2)


def _symbolic_cell(tree: Path, operator, version: str, model: str) -> dict[str, Any]:
    """The symbolic leg on one mutant; out of scope when the mutation lies in
    code the harness abstracts (it would be 'verified' for the wrong reason)."""
    from oracles.provision import ensure_release
    from oracles.subject import source_tree
    from oracles.symbolic import SymbolicStatus, symbolic_check

    original = (ensure_release(version) / operator.target_file).read_text(encoding="utf-8")
    method = operator.mutated_method(original)
    verdict = symbolic_check(source_tree(str(tree)))
    status = verdict.status.value
    if verdict.target and method != verdict.target and verdict.status is SymbolicStatus.VERIFIED:
        status = "out of scope"
    elif verdict.status is SymbolicStatus.VERIFIED and model == "equivalent":
        status = "verified-equivalent"  # the real code, not just the model, is equivalent
    return {"symbolic": status, "symbolic_seconds": round(verdict.seconds, 2),
            "mutated_method": method, "symbolic_detail": verdict.detail}


def kill_matrix(version: str, max_examples: int, seed: int, names: list[str] | None = None,
                symbolic: bool = False):
    from diff_tests.exhaustive import exhaust
    from diff_tests.fuzz import fuzz_subject
    from oracles.mutants import LOOKUP_MUTANTS, MUTANTS, MutationError
    from oracles.subject import SubjectError, SubjectProcess, source_tree

    exhaustive_scope = _exhaustive_scope()
    rows: list[dict[str, Any]] = []
    for operator in MUTANTS + LOOKUP_MUTANTS:
        if names and operator.name not in names:
            continue
        lookup = operator.side == "lookup"
        # A lookup-side mutant has no registration variant to prove: the model
        # column says so, and only the hit-length differential can kill it.
        row: dict[str, Any] = {"mutant": operator.name, "models_variant": operator.models_variant,
                               "summary": operator.summary, "side": operator.side,
                               "model": "lookup side" if lookup else _model_verdict(operator.models_variant)}
        started = time.perf_counter()
        try:
            tree = mutant_tree(version, operator)
            with SubjectProcess(source_tree(str(tree))) as proc:
                result = fuzz_subject(proc, max_examples, seed, stop_at_first=True, lookup=lookup)
                swept = None if lookup else exhaust([proc], exhaustive_scope)
        except (MutationError, SubjectError) as exc:
            row.update(status="error", error=str(exc))
            rows.append(row)
            print(f"  {operator.name}: ERROR {exc}", flush=True)
            continue
        killed = result.failure is not None
        row.update(
            status="killed" if killed else ("equivalent" if row["model"] == "equivalent" else "survived"),
            cases_to_kill=result.examples_to_first_failure,
            seconds_to_kill=result.seconds_to_first_failure,
            cases=result.cases,
            wall_seconds=round(time.perf_counter() - started, 2),
            category=result.failure.category if killed else None,
            example=result.failure.case.describe() if killed else None,
        )
        if swept is None:  # the exhaustive scope and the symbolic leg check registration only
            row.update(exhaustive="n/a", exhaustive_failing="", exhaustive_seconds="")
        else:
            row.update(exhaustive="killed" if swept["failing_cases"] else (
                           "equivalent" if row["model"] == "equivalent" else "survived"),
                       exhaustive_failing=f"{swept['failing_cases']}/{swept['cases']}",
                       exhaustive_seconds=swept["seconds"])
        if symbolic and lookup:
            row.update(symbolic="n/a", symbolic_seconds="")
        elif symbolic:
            row.update(_symbolic_cell(tree, operator, version, row["model"]))
        rows.append(row)
        print(f"  {operator.name}: {row['status']}"
              + (f", symbolic {row['symbolic']}" if symbolic else ""), flush=True)
    return rows


def render_matrix(rows: list[dict[str, Any]]) -> str:
    """One column per technique: the proof (model), fuzzing, the exhaustive
    two-group scope, and symbolic when run."""
    width = max(len(r["mutant"]) for r in rows)
    symbolic = any("symbolic" in r for r in rows)
    head = (f"{'mutant':<{width}}  {'proof':<14} {'fuzzing':<10} {'cases':>6} {'s to kill':>9}  "
            f"{'exhaustive':<10} {'failing':>9} {'s':>5}")
    out = [head + (f"  {'symbolic':<14} {'s':>5}" if symbolic else "") + "  category"]
    for r in rows:
        cases = "" if r.get("cases_to_kill") is None else str(r["cases_to_kill"])
        secs = "" if r.get("seconds_to_kill") is None else f"{r['seconds_to_kill']:.2f}"
        line = (f"{r['mutant']:<{width}}  {r['model']:<14} {r['status']:<10} {cases:>6} {secs:>9}  "
                f"{r.get('exhaustive', ''):<10} {r.get('exhaustive_failing', ''):>9} "
                f"{r.get('exhaustive_seconds', ''):>5}")
        if symbolic:
            line += f"  {r.get('symbolic', ''):<14} {r.get('symbolic_seconds', ''):>5}"
        out.append(line + f"  {r.get('category') or r.get('error') or ''}")
    return "\n".join(out)


def cmd_mutants(args: argparse.Namespace) -> int:
    from kvspec.cli import UsageError
    from oracles.mutants import LOOKUP_MUTANTS, MUTANTS

    known = {m.name for m in MUTANTS + LOOKUP_MUTANTS}
    unknown = [n for n in args.mutant or [] if n not in known]
    if unknown:
        raise UsageError(f"unknown mutant {unknown[0]!r}; known: {', '.join(sorted(known))}")
    print(f"kvspec mutants: vLLM {args.vllm}, seed {args.seed}, up to {args.max_examples} examples each")
    started = time.perf_counter()
    rows = kill_matrix(args.vllm, args.max_examples, args.seed, args.mutant, symbolic=args.symbolic)
    total = time.perf_counter() - started
    print(render_matrix(rows))
    killed = sum(r["status"] == "killed" for r in rows)
    survived = [r["mutant"] for r in rows if r["status"] == "survived"]
    errors = [r["mutant"] for r in rows if r["status"] == "error"]
    print(f"\n{killed}/{len(rows)} killed, {len(survived)} survived, "
          f"{sum(r['status'] == 'equivalent' for r in rows)} equivalent, {len(errors)} errors; "
          f"{total:.1f} s in all")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"schema": MUTANTS_SCHEMA, "vllm": args.vllm, "seed": args.seed,
             "max_examples": args.max_examples, "seconds": round(total, 2), "mutants": rows},
            indent=2, sort_keys=True) + "\n")
    if survived:
        return exitcodes.FINDING
    if errors:
        return exitcodes.USAGE
    return exitcodes.OK


def register(sub: "argparse._SubParsersAction") -> None:
    mutants = sub.add_parser("mutants", help="fuzz every mutant of a release and print a kill matrix")
    mutants.add_argument("--vllm", required=True, metavar="VERSION", help="release to mutate (0.28.0+)")
    mutants.add_argument("--mutant", action="append", metavar="NAME", help="only this operator (repeatable)")
    mutants.add_argument("--max-examples", type=int, default=1000, metavar="N")
    mutants.add_argument("--seed", type=int, default=0)
    mutants.add_argument("--json", metavar="FILE")
    mutants.add_argument("--symbolic", action="store_true",
                         help="add the symbolic column: each mutant's real code checked with CrossHair")
    mutants.set_defaults(func=cmd_mutants)
