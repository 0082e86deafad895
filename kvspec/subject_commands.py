"""Subcommands that drive a real vLLM (fuzz, mutants, check): registered here
so the CLI stays thin and ``kvspec prove`` never imports the subject side."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import attrs

from kvspec import exitcodes

FUZZ_SCHEMA = "kvspec.fuzz/2"
NEWEST_SUPPORTED = "0.33.0"


def _say(message: str) -> None:
    print(message, flush=True)


def _subject_specs(args: argparse.Namespace):
    """The subjects named on the command line; a bad one is a UsageError."""
    from kvspec.cli import UsageError
    from oracles.subject import SubjectError, current_environment, release, source_tree

    try:
        specs = [release(v) for v in args.vllm or []]
        specs += [source_tree(p) for p in args.vllm_src or []]
    except SubjectError as exc:
        raise UsageError(str(exc)) from None
    if args.current:
        specs.append(current_environment())
    return specs


def mutant_operators(args: argparse.Namespace):
    """The ``--mutant`` operators named on the command line (each applies to
    every ``--vllm`` release); an unknown name or no release is a UsageError."""
    from kvspec.cli import UsageError
    from oracles.mutants import mutant

    try:
        operators = [mutant(name) for name in getattr(args, "mutant", None) or []]
    except KeyError as exc:
        raise UsageError(str(exc).strip("\"'")) from None
    if operators and not args.vllm:
        raise UsageError("--mutant applies to a release: add --vllm VERSION")
    return operators


def _mutant_specs(args: argparse.Namespace):
    """Each ``--vllm`` release with each ``--mutant`` applied: the trees
    ``kvspec mutants`` fuzzes, made (and cached) here if need be."""
    from kvspec.cli import UsageError
    from kvspec.mutants_command import mutant_tree
    from oracles.mutants import MutationError
    from oracles.provision import ProvisionError
    from oracles.subject import source_tree

    specs = []
    for op in mutant_operators(args):
        for version in args.vllm:
            try:
                tree = source_tree(str(mutant_tree(version, op)))
            except (MutationError, ProvisionError) as exc:
                raise UsageError(f"--mutant {op.name} on vLLM {version}: {exc}") from None
            specs.append(attrs.evolve(tree, label=f"vllm {version} + {op.name}"))
    return specs


def _launch(spec):
    """Start a subject's worker without waiting for it (or the error that stops it)."""
    from oracles.provision import ProvisionError
    from oracles.subject import SubjectError, SubjectProcess

    try:
        return SubjectProcess(spec, wait=False)
    except (SubjectError, ProvisionError) as exc:
        return exc


def run_fuzz(specs, max_examples: int, seed: int, findings_dir: Path, progress: bool,
             database: str = "", verify_test: bool = True,
             started: float | None = None, jobs: int = 1, lookup: bool = False):
    """Fuzz each subject in its own worker (``jobs`` of them at once); returns
    (outcomes, errors), an outcome being a fuzz result and its completed
    finding (or None).

    With one job, workers start ahead: the first before kvspec's own imports,
    the next while the current one is fuzzed, so vLLM's import time overlaps
    other work."""
    started = time.perf_counter() if started is None else started
    launched = {0: _launch(specs[0])} if specs and jobs == 1 else {}

    from diff_tests.parallel import fuzz_parallel
    from oracles.provision import ProvisionError
    from oracles.subject import SubjectError

    from kvspec.fuzz_report import complete_finding
    from kvspec.render_finding import render_text
    from kvspec.render_proofs import versions

    outcomes, errors = [], []
    try:
        for index, spec in enumerate(specs):
            in_parallel = f", {jobs} jobs" if jobs > 1 else ""
            _say(f"{spec.label}: starting (seed {seed}, up to {max_examples} examples{in_parallel})")
            try:
                if jobs > 1:
                    result = fuzz_parallel(spec, jobs, max_examples, seed, database, lookup=lookup)
                    proc = _launch(spec) if result.failure is not None else None
                else:
                    proc = launched.pop(index)
                    result = None
                if isinstance(proc, Exception):
                    raise proc
                with (proc.ready() if proc is not None else contextlib.nullcontext()):
                    if jobs == 1 and index + 1 < len(specs):
                        launched[index + 1] = _launch(specs[index + 1])
                    if result is None:
                        result = _fuzz_one(proc, spec.label, max_examples, seed, database,
                                           progress, started, lookup)
                    finding = path = None
                    if result.failure is not None:
                        _say(f"{spec.label}: DISCREPANCY ({result.failure.category}) found after "
                             f"{result.examples_to_first_failure} cases, "
                             f"{result.seconds_to_first_failure:.2f} s; shrunk in {result.seconds:.1f} s; "
                             "explaining, sweeping and emitting a regression test")
                        finding, path = complete_finding(proc, result, findings_dir, versions(),
                                                         verify=verify_test)
            except (SubjectError, ProvisionError) as exc:
                errors.append({"subject": spec.as_dict(), "error": str(exc)})
                _say(f"{spec.label}: ERROR {exc}")
                continue
            outcomes.append((result, finding))
            rate = result.cases / result.seconds if result.seconds else 0.0
            if finding is None:
                _say(f"{spec.label}: no discrepancy in {result.cases} differential cases "
                     f"({result.examples} Hypothesis examples, {result.calls} cache_blocks calls, "
                     f"{result.seconds:.1f} s, {rate:.0f} cases/s{in_parallel})")
            else:
                _say(render_text(finding))
                _say(f"  stored: {path}")
                if result.other_failures:
                    _say(f"  {len(result.other_failures)} other distinct failure(s) found by other jobs: "
                         + "; ".join(f.case.describe() for f in result.other_failures))
    finally:
        for proc in launched.values():  # started ahead, never reached (an interrupt)
            if not isinstance(proc, Exception):
                proc.close()
    return outcomes, errors


def _fuzz_one(proc, label: str, max_examples: int, seed: int, database: str, progress: bool,
              started: float, lookup: bool = False):
    """One job in this process, with progress lines and the first-counterexample line."""
    from diff_tests.database import example_database
    from diff_tests.fuzz import fuzz_subject

    tick = None
    if progress:
        def tick(n: int, seconds: float) -> None:
            print(f"  {label}: {n} cases, {seconds:.1f} s", file=sys.stderr, flush=True)

    def first(result) -> None:
        _say(f"{label}: first counterexample after {result.examples_to_first_failure} "
             f"cases, {time.perf_counter() - started:.1f} s after kvspec started; shrinking")

    # Failing examples from earlier runs are replayed first.
    return fuzz_subject(proc, max_examples, seed, database=example_database(database),
                        progress=tick, on_first_failure=first, lookup=lookup)


def _fuzz_doc(outcomes, errors, seed: int, max_examples: int, lookup: bool = False) -> dict[str, Any]:
    from kvspec.render_proofs import versions

    return {
        "schema": FUZZ_SCHEMA,
        "versions": versions(),
        "settings": {"seed": seed, "max_examples": max_examples, "lookup": lookup},
        "subjects": [{**r.as_dict(), "finding": None if f is None else f.to_dict()}
                     for r, f in outcomes],
        "errors": errors,
    }


def _fuzz_exit(outcomes, errors) -> int:
    if any(f is not None for _, f in outcomes):
        return exitcodes.FINDING
    if errors:
        return exitcodes.USAGE
    return exitcodes.OK


def cmd_fuzz(args: argparse.Namespace) -> int:
    from kvspec.cli import STARTED, UsageError

    specs = _subject_specs(args) + _mutant_specs(args)
    if not specs:
        raise UsageError("name a subject: --vllm VERSION, --vllm-src PATH or --current")
    if args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: give at least 1 (this machine has {os.cpu_count()} cores)")
    from diff_tests.database import DatabaseError, example_database

    try:
        example_database(args.database)  # an unreachable server stops here, before any fuzzing
    except DatabaseError as exc:
        raise UsageError(str(exc)) from None
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    _say(f"kvspec fuzz: seed {seed} (rerun with --seed {seed})")
    results, errors = [], []
    try:
        results, errors = run_fuzz(specs, args.max_examples, seed, Path(args.findings_dir),
                                   progress=sys.stderr.isatty(), database=args.database,
                                   jobs=args.jobs, lookup=args.lookup,
                                   verify_test=not getattr(args, "no_verify_test", False),
                                   started=STARTED)
    finally:
        # Whatever was found before an error or an interrupt is still written.
        doc = _fuzz_doc(results, errors, seed, args.max_examples, args.lookup)
        if args.json:
            Path(args.json).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        markdown = None
        if getattr(args, "markdown", None) or os.environ.get("GITHUB_STEP_SUMMARY"):
            from kvspec.render_fuzz import render_markdown

            markdown = render_markdown(doc)
        if getattr(args, "markdown", None):
            Path(args.markdown).write_text(markdown)
        if os.environ.get("GITHUB_STEP_SUMMARY"):
            with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as summary:
                summary.write(markdown)
    return _fuzz_exit(results, errors)


def add_subject_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vllm", action="append", metavar="VERSION",
                        help="a vLLM release from PyPI, provisioned on first use (repeatable)")
    parser.add_argument("--vllm-src", action="append", metavar="PATH",
                        help="a directory holding the vllm package: a checkout or an unpacked wheel (repeatable)")
    parser.add_argument("--current", action="store_true",
                        help="the vLLM importable in the current environment")


def register(sub: "argparse._SubParsersAction") -> None:
    fuzz = sub.add_parser("fuzz", help="differential fuzzing against real vLLM coordinators")
    add_subject_arguments(fuzz)
    fuzz.add_argument("--mutant", action="append", metavar="NAME",
                      help="also fuzz each --vllm release with this mutation applied, as kvspec mutants "
                           "does (repeatable; e.g. refloor_50062, the #50062 regression)")
    fuzz.add_argument("--max-examples", type=int, default=2000, metavar="N")
    fuzz.add_argument("--seed", type=int, default=None, metavar="S", help="printed first when chosen at random")
    fuzz.add_argument("--json", metavar="FILE", help="write the versioned result")
    fuzz.add_argument("--markdown", metavar="FILE",
                      help="write a Markdown report (also appended to $GITHUB_STEP_SUMMARY when set)")
    fuzz.add_argument("--findings-dir", default=os.path.join(".kvspec", "findings"), metavar="DIR",
                      help="where every finding is stored for replay (default .kvspec/findings)")
    fuzz.add_argument("--no-verify-test", action="store_true",
                      help="do not run the emitted regression test against the subject")
    fuzz.add_argument("--database", default=os.path.join(".kvspec", "examples"),
                      metavar="DIR|redis://HOST:PORT[/DB]",
                      help="Hypothesis example database; failures in it are replayed first: a directory "
                           "(default .kvspec/examples; '' for none) or a Redis server shared by a fleet")
    fuzz.add_argument("--jobs", type=int, default=1, metavar="N",
                      help="independent Hypothesis runs at once, each with its own vLLM worker "
                           "(seeds S..S+N-1, the budget split between them); findings merged")
    fuzz.add_argument("--lookup", action="store_true",
                      help="follow every request with a later one that looks up (get_computed_blocks) and "
                           "check its hit too: the hit-length differential")
    fuzz.set_defaults(func=cmd_fuzz)

    from kvspec import (check_command, exhaust_command, history_command, hitrate_command, mtp_command,
                        mutants_command, recipe_command, replay_command, report_command)

    check_command.register(sub)
    exhaust_command.register(sub)
    history_command.register(sub)
    hitrate_command.register(sub)
    mtp_command.register(sub)
    mutants_command.register(sub)
    recipe_command.register(sub)
    replay_command.register(sub)
    report_command.register(sub)
