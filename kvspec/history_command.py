"""``kvspec history --vllm 0.23.0..0.33.0``: the registration and lookup
checks on every release in a range, one row per release, so a reviewer sees
when a behaviour appeared or changed.

Each row: the capabilities found by introspection (partial hash hits, the
prefill lookahead, per-group EAGLE flags, lookahead block hashes, where the
rule lives), the rule those capabilities select in the spec, the verdict of
differential fuzzing of the registration boundary against the spec, the
verdict of the hit-length differential (a later request's lookup against the
lookup model), and, with ``--symbolic``, the release's own registration code
checked symbolically."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from kvspec import exitcodes

HISTORY_SCHEMA = "kvspec.history/1"
RANGE_RE = re.compile(r"^(\d+\.\d+\.\d+)\.\.(\d+\.\d+\.\d+)$")
RELEASE_RE = re.compile(r"^\d+\.\d+\.\d+$")  # final releases only (no rc, post or dev)
CAPABILITY_COLUMNS = ("partial_hash_hits", "reprefillable_tokens", "per_group_eagle",
                      "lookahead_block_hashes", "get_num_cacheable_tokens")


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def published_releases() -> list[str]:
    """vLLM's final releases on the package index, oldest first."""
    from kvspec.cli import UsageError

    run = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "vllm"],
                         capture_output=True, text=True)
    match = re.search(r"Available versions: (.*)", run.stdout)
    if run.returncode != 0 or not match:
        raise UsageError("cannot list vLLM's releases on the package index "
                         f"({(run.stderr.strip().splitlines() or ['no output'])[-1]}); "
                         "name the releases one by one: --vllm 0.28.0 --vllm 0.33.0")
    return sorted((v.strip() for v in match.group(1).split(",") if RELEASE_RE.match(v.strip())), key=_key)


def expand(selectors: list[str], published=published_releases) -> list[str]:
    """Releases named one by one or as ranges ``LOW..HIGH`` (both included)."""
    from kvspec.cli import UsageError

    chosen: list[str] = []
    listing = None
    for selector in selectors:
        bounds = RANGE_RE.match(selector)
        if bounds:
            low, high = (_key(b) for b in bounds.groups())
            if low > high:
                raise UsageError(f"--vllm {selector}: the range is empty (low end after high end)")
            listing = listing if listing is not None else published()
            chosen += [v for v in listing if low <= _key(v) <= high]
        elif RELEASE_RE.match(selector):
            chosen.append(selector)
        else:
            raise UsageError(f"--vllm {selector!r}: give a release (0.33.0) or a range (0.23.0..0.33.0)")
    return sorted(dict.fromkeys(chosen), key=_key)


def rule_in_force(capabilities: dict[str, Any]) -> str:
    """The spec's rule for what this release can do (its era), in words."""
    if not capabilities.get("partial_hash_hits"):
        return "floor to S; EAGLE min(n, floor(n/S)*S + B)"
    rule = "partial hits: no rounding; EAGLE min(f, aligned(f) + B)"
    if capabilities.get("reprefillable_tokens"):
        rule += ", f = n - max(0, L - 1)"
    else:
        rule += ", f = n"
    if capabilities.get("get_num_cacheable_tokens"):
        rule += " (in get_num_cacheable_tokens)"
    return rule


def _fuzz_fields(result) -> dict[str, Any]:
    """What a row keeps of one fuzz run (the registration run's at the row's
    top level, the lookup run's under ``lookup``)."""
    return {"cases": result.cases, "examples": result.examples, "seconds": round(result.seconds, 2),
            "failure": None if result.failure is None else result.failure.as_dict()}


def check_release(version: str, max_examples: int, seed: int, symbolic: bool) -> dict[str, Any]:
    from diff_tests.fuzz import fuzz_subject
    from oracles.provision import ProvisionError
    from oracles.subject import SubjectError, SubjectProcess, SubjectUnsupported, release

    row: dict[str, Any] = {"version": version}
    spec = release(version)
    try:
        with SubjectProcess(spec) as proc:
            caps = proc.capabilities
            result = fuzz_subject(proc, max_examples, seed)
            # The same worker then answers the hit-length differential.
            lookup = fuzz_subject(proc, max_examples, seed, lookup=True)
    except SubjectUnsupported as exc:
        return {**row, "status": "unsupported", "detail": str(exc)}
    except (SubjectError, ProvisionError) as exc:
        return {**row, "status": "error", "detail": str(exc)}
    row.update(
        status="discrepancy" if result.failure or lookup.failure else "conforms",
        capabilities={k: caps.get(k) for k in CAPABILITY_COLUMNS},
        rule=rule_in_force(caps), **_fuzz_fields(result),
        lookup={"status": "discrepancy" if lookup.failure else "conforms", **_fuzz_fields(lookup)},
    )
    if symbolic:
        from oracles.symbolic import symbolic_check

        verdict = symbolic_check(spec)
        row["symbolic"] = {"status": verdict.status.value, "detail": verdict.detail}
    return row


def render_table(rows: list[dict[str, Any]], symbolic: bool) -> str:
    def yes(flag: Any) -> str:
        return "yes" if flag else "no"

    def verdict(cases: int, failure: dict[str, Any] | None) -> str:
        return f"conforms ({cases} cases)" if failure is None else f"DISCREPANCY: {failure['summary'][0]}"

    header = ["release", "partial hits", "lookahead", "per-group EAGLE", "lookahead hashes",
              "rule (spec era)", "registration", "lookup (hit length)"]
    if symbolic:
        header.append("real code, symbolically")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        if row["status"] in ("unsupported", "error"):
            cells = [row["version"]] + [""] * 5 + [f"{row['status']}: {row['detail']}", ""]
            cells += [""] if symbolic else []
        else:
            caps = row["capabilities"]
            lookup = row["lookup"]
            cells = [row["version"], yes(caps["partial_hash_hits"]), yes(caps["reprefillable_tokens"]),
                     yes(caps["per_group_eagle"]), yes(caps.get("lookahead_block_hashes")), row["rule"],
                     verdict(row["cases"], row["failure"]),
                     verdict(lookup["cases"], lookup["failure"])]
            if symbolic:
                cells.append(row["symbolic"]["status"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cmd_history(args: argparse.Namespace) -> int:
    from kvspec.cli import UsageError

    versions = expand(args.vllm or [])
    if not versions:
        raise UsageError("name the releases: --vllm 0.23.0..0.33.0 (a range) or --vllm VERSION (repeatable)")
    print(f"kvspec history: {len(versions)} releases ({', '.join(versions)}), seed {args.seed}, "
          f"{args.max_examples} examples each", flush=True)
    rows: list[dict[str, Any]] = []
    try:
        for version in versions:
            row = check_release(version, args.max_examples, args.seed, args.symbolic)
            rows.append(row)
            print(f"  {version}: {row['status']}" + (f" ({row['detail']})" if "detail" in row else ""),
                  flush=True)
    finally:
        # What was checked before an error or an interrupt is still written.
        if args.json:
            Path(args.json).write_text(json.dumps(
                {"schema": HISTORY_SCHEMA, "seed": args.seed, "max_examples": args.max_examples,
                 "releases": rows}, indent=2, sort_keys=True) + "\n")
    print()
    print(render_table(rows, args.symbolic))
    if any(r["status"] == "discrepancy" for r in rows):
        return exitcodes.FINDING
    if any(r["status"] in ("unsupported", "error") for r in rows):
        return exitcodes.USAGE
    return exitcodes.OK


def register(sub: "argparse._SubParsersAction") -> None:
    history = sub.add_parser("history", help="the registration and lookup checks on every release in a range")
    history.add_argument("--vllm", action="append", metavar="VERSION|LOW..HIGH",
                         help="a release or a range of releases, both ends included (repeatable)")
    history.add_argument("--max-examples", type=int, default=300, metavar="N", help="per release")
    history.add_argument("--seed", type=int, default=0)
    history.add_argument("--symbolic", action="store_true",
                         help="also check each release's own registration code symbolically")
    history.add_argument("--json", metavar="FILE")
    history.set_defaults(func=cmd_history)
