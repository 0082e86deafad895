"""``kvspec history --vllm 0.23.0..0.34.0``: the registration and lookup
checks on every release in a range, one row per release, so a reviewer sees
when a behaviour appeared or changed.

Each row: the capabilities found by introspection (partial hash hits, the
prefill lookahead, per-group EAGLE flags, lookahead block hashes, where the
rule lives), the rule those capabilities select in the subject, the verdict of
differential fuzzing of the registration boundary against the subject, the
verdict of the hit-length differential (a later request's lookup against the
lookup model), and, with ``--symbolic``, the release's own registration code
checked symbolically.  The JSON is rewritten after every row.
"""

from __future__ import annotations

import argparse
import json

from kvspec.arguments import positive_int, releases, writable
from kvspec.model.errors import UsageError
from kvspec.model.outcome import Outcome, RunStatus, worst

HELP = "the registration and lookup checks on every release in a range"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vllm", action="append", metavar="VERSION|LOW..HIGH",
                        help="a release or a range of releases, both ends included (repeatable)")
    parser.add_argument("--max-examples", type=positive_int, default=300, metavar="N", help="per release")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--symbolic", action="store_true",
                        help="also check each release's own registration code symbolically")
    parser.add_argument("--json", metavar="FILE")


def run(args: argparse.Namespace) -> Outcome:
    from kvspec.usecases.history import HistoryRow, history_row
    from kvspec.model.about import SCHEMAS
    from kvspec.report.files import write_text
    from kvspec.report.history import ReleaseRow, render_table

    json_path = writable(args.json, "--json")
    versions = releases(args.vllm or [])
    if not versions:
        raise UsageError("name the releases: --vllm 0.23.0..0.34.0 (a range) or --vllm VERSION (repeatable)")
    print(f"kvspec history: {len(versions)} releases ({', '.join(versions)}), seed {args.seed}, "
          f"{args.max_examples} examples each", flush=True)
    rows: list[HistoryRow] = []

    def record(status: RunStatus) -> None:
        if json_path is not None:
            write_text(json_path, json.dumps(
                {"schema": SCHEMAS["history"], "status": status.value, "seed": args.seed,
                 "max_examples": args.max_examples, "planned": versions, "releases": [r.as_dict() for r in rows]},
                indent=2, sort_keys=True))

    status = RunStatus.INTERRUPTED
    try:
        for version in versions:
            row = history_row(version, args.max_examples, args.seed, args.symbolic)
            rows.append(row)
            record(RunStatus.INCOMPLETE)
            print(f"  {version}: {row.status}" + (f" ({row.detail})" if row.not_run else ""),
                  flush=True)
        status = RunStatus.COMPLETE
    except Exception:
        status = RunStatus.INCOMPLETE
        raise
    finally:
        # What was checked before an error or an interrupt is still written, marked so.
        record(status)
    print()
    print(render_table([ReleaseRow.parse(r.as_dict()) for r in rows], args.symbolic))
    if any(r.status == "discrepancy" for r in rows):
        return Outcome.FINDING
    if any(r.not_run for r in rows):
        return Outcome.USAGE
    # A release whose runs did not all finish is not "no discrepancy".
    return worst([r.overall or Outcome.OK for r in rows])
