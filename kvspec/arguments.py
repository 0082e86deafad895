"""Argument handling every command shares: subjects, numbers, output files.

Numbers are validated by argparse itself (a bad one is a usage error with
exit 2 before anything runs), and every output path is checked writable
before the work starts, so a long run never ends in an unwritable file.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from kvspec.model.errors import UsageError

__all__ = ["positive_int", "job_count", "non_negative_int", "positive_seconds", "add_subject_arguments",
           "add_budget_arguments", "budget",
           "add_mutant_argument", "add_run_arguments", "subjects", "releases", "writable", "check_writable"]


def _whole_number(low: int):
    """An argparse type: a whole number of at least ``low``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected {low} or more, got {value}")
        return value

    return parse


positive_int = _whole_number(1)
non_negative_int = _whole_number(0)
# Each job is two processes (the engine and a vLLM worker of ~20 MB and a
# second of import): beyond a few per core they only thrash the machine.
JOBS_PER_CPU = 4


def job_count(text: str) -> int:
    """``--jobs``: a whole number from 1 to JOBS_PER_CPU times the CPU count."""
    jobs = positive_int(text)
    most = JOBS_PER_CPU * (os.cpu_count() or 1)
    if jobs > most:
        raise argparse.ArgumentTypeError(f"at most {most} jobs on this machine ({JOBS_PER_CPU} per CPU), got {jobs}")
    return jobs


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds above 0, got {text}")
    return value


def add_budget_arguments(parser: argparse.ArgumentParser) -> None:
    """The proofs' budget, shared by prove and check."""
    from kvspec.proofs.budgets import DEFAULT_RLIMIT, SAFETY_NET_S

    parser.add_argument("--rlimit", type=positive_int, default=DEFAULT_RLIMIT, metavar="UNITS",
                        help=f"Z3 resource units per solver check (default {DEFAULT_RLIMIT:,}): the budget, "
                             "the same on any machine; running out is UNKNOWN, never PROVED")
    parser.add_argument("--timeout", type=positive_seconds, default=SAFETY_NET_S, metavar="SECONDS",
                        help=f"wall-clock safety net per solver check (default {SAFETY_NET_S:.0f}); its "
                             "expiry is UNKNOWN and says it was the machine")
    parser.add_argument("--symbolic-timeout", type=positive_seconds, default=60.0, metavar="SECONDS",
                        help="CrossHair's time for the real code's symbolic check (default 60); "
                             "running out is INCONCLUSIVE, never VERIFIED")


def budget(args: argparse.Namespace):
    from kvspec.proofs.runner import Budget

    return Budget(rlimit=args.rlimit, safety_net_s=args.timeout)


def add_subject_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vllm", action="append", metavar="VERSION",
                        help="a vLLM release from PyPI, provisioned on first use (repeatable)")
    parser.add_argument("--vllm-src", action="append", metavar="PATH",
                        help="a directory holding the vllm package: a checkout or an unpacked wheel "
                             "(repeatable)")
    parser.add_argument("--current", action="store_true",
                        help="the vLLM importable in the current environment")


def add_mutant_argument(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--mutant", action="append", metavar="NAME",
                        help=f"also {what} each --vllm release with this mutation applied (repeatable; "
                             "e.g. refloor_50062, the #50062 regression)")


def add_run_arguments(parser: argparse.ArgumentParser, max_examples: int) -> None:
    """The fuzzing options ``fuzz`` and ``check`` share."""
    parser.add_argument("--max-examples", type=positive_int, default=max_examples, metavar="N")
    parser.add_argument("--seed", type=int, default=None, metavar="S", help="printed first when chosen at random")
    parser.add_argument("--json", metavar="FILE", help="write the versioned result")
    parser.add_argument("--findings-dir", default=os.path.join(".kvspec", "findings"), metavar="DIR",
                        help="where every finding is stored for replay (default .kvspec/findings)")
    parser.add_argument("--database", default=os.path.join(".kvspec", "examples"),
                        metavar="DIR|redis://HOST:PORT[/DB]",
                        help="Hypothesis example database; failures in it are replayed first: a directory "
                             "(default .kvspec/examples; '' for none) or a Redis server shared by a fleet")
    parser.add_argument("--jobs", type=job_count, default=1, metavar="N",
                        help="independent Hypothesis runs at once, each with its own vLLM worker "
                             "(seeds S..S+N-1, the budget split between them); findings merged")


def subjects(args: argparse.Namespace, *, mutants: bool = False) -> list:
    """The subjects named on the command line, in order: releases, trees,
    the current environment, then each release with each ``--mutant``."""
    from kvspec.subjects.mutation import mutant
    from kvspec.subjects.subject import current_environment, mutant_subject, release, source_tree

    subjects_named = [release(v) for v in args.vllm or []]
    subjects_named += [source_tree(p) for p in args.vllm_src or []]
    if args.current:
        subjects_named.append(current_environment())
    if mutants:
        operators = [mutant(name) for name in getattr(args, "mutant", None) or []]
        if operators and not args.vllm:
            raise UsageError("--mutant applies to a release: add --vllm VERSION")
        subjects_named += [mutant_subject(version, op.name) for op in operators for version in args.vllm]
    return subjects_named


def writable(path: str | os.PathLike | None, what: str) -> Path | None:
    """``path`` if a file can be written there (checked now, by creating its
    folder and opening it for appending), else a UsageError naming ``what``."""
    if path is None or str(path) == "":
        return None
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        existed = target.exists()
        with open(target, "a", encoding="utf-8"):
            pass
        if not existed:
            target.unlink()
    except OSError as exc:
        raise UsageError(f"{what} {path}: cannot write there ({exc.strerror or exc})") from None
    return target


def check_writable(directory: str | os.PathLike | None, what: str) -> Path | None:
    """A directory kvspec will write into: created and probed now."""
    if directory is None or str(directory) == "":
        return None
    folder = Path(directory)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".kvspec-write-probe"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"{what} {directory}: cannot write there ({exc.strerror or exc})") from None
    return folder


def releases(selectors: list[str], published=None) -> list[str]:
    """Releases named one by one or as ranges ``LOW..HIGH`` (both included,
    final releases on the package index; ``published`` lists them)."""
    import re

    from kvspec.model.about import release_key

    one = re.compile(r"^\d+\.\d+\.\d+$")
    span = re.compile(r"^(\d+\.\d+\.\d+)\.\.(\d+\.\d+\.\d+)$")
    chosen: list[str] = []
    listing = None
    for selector in selectors:
        bounds = span.match(selector)
        if bounds:
            low, high = (release_key(b) for b in bounds.groups())
            if low > high:
                raise UsageError(f"--vllm {selector}: the range is empty (its low end is after its high end)")
            if listing is None:
                if published is None:
                    from kvspec.subjects.provision import published_releases as published
                listing = published()
            inside = [v for v in listing if low <= release_key(v) <= high]
            if not inside:
                raise UsageError(f"--vllm {selector}: no final release of vLLM on the package index lies "
                                 "in that range")
            chosen += inside
        elif one.match(selector):
            chosen.append(selector)
        else:
            raise UsageError(f"--vllm {selector!r}: give a release (0.33.0) or a range (0.23.0..0.34.0)")
    return sorted(dict.fromkeys(chosen), key=release_key)
