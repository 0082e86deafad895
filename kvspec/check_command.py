"""``kvspec check``: the main job -- proofs, then fuzz one vLLM.

On a fresh machine it checks the newest supported release; in a vLLM
checkout's CI, ``kvspec check --vllm-src . --out kvspec-results`` checks the
PR's own tree and leaves the JSON and a Markdown report for the pipeline to
post and upload (the recipes in ``kvspec/recipes/``)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from kvspec import exitcodes

VERDICTS = {exitcodes.OK: "OK", exitcodes.FINDING: "FINDING", exitcodes.USAGE: "ERROR",
            exitcodes.UNKNOWN: "UNKNOWN"}


def _overall(proved: int, fuzzed: int) -> int:
    for code in (exitcodes.FINDING, exitcodes.USAGE, exitcodes.UNKNOWN):
        if code in (proved, fuzzed):
            return code
    return exitcodes.OK


def cmd_check(args: argparse.Namespace) -> int:
    from kvspec.cli import UsageError, cmd_prove
    from kvspec.subject_commands import NEWEST_SUPPORTED, cmd_fuzz

    if args.vllm and args.vllm_src:
        raise UsageError("check one subject: give --vllm VERSION or --vllm-src PATH, not both")
    releases = [args.vllm or NEWEST_SUPPORTED] if not args.vllm_src else []
    trees = [args.vllm_src] if args.vllm_src else []
    label = f"vLLM {releases[0]}" if releases else f"the vLLM tree {os.path.abspath(args.vllm_src)}"
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)

    print(f"== 1/2  kvspec prove: the theorem catalog over unbounded integers, and {label}'s "
          "own registration code symbolically")
    prove_args = argparse.Namespace(theorem=None, list=False, timeout=args.timeout, seed=0,
                                    quiet=args.quiet, vllm=releases, vllm_src=trees, current=False,
                                    json=str(out / "prove.json") if out else None)
    proved = cmd_prove(prove_args)
    print(f"\n== 2/2  kvspec fuzz: the spec against {label} (provisioned on first use)")
    fuzz_json = str(out / "fuzz.json") if out else args.json
    fuzz_args = argparse.Namespace(vllm=releases, vllm_src=trees, current=False,
                                   max_examples=args.max_examples, seed=args.seed, json=fuzz_json,
                                   markdown=None, findings_dir=args.findings_dir,
                                   database=args.database, jobs=args.jobs, lookup=False)
    fuzzed = cmd_fuzz(fuzz_args)
    overall = _overall(proved, fuzzed)
    print(f"\nkvspec check: proofs {VERDICTS[proved]}, {label} {VERDICTS[fuzzed]}")
    if out is not None:
        (out / "report.md").write_text(_report(out, proved, fuzzed, overall, label))
        print(f"results: {out / 'prove.json'}, {out / 'fuzz.json'}, {out / 'report.md'}")
    if overall == exitcodes.OK:
        print("VERDICT: OK -- every theorem as expected, no discrepancy against real vLLM")
    else:
        print(f"VERDICT: {VERDICTS[overall]}")
    return overall


def _report(out: Path, proved: int, fuzzed: int, overall: int, label: str) -> str:
    """The Markdown a CI job posts: the verdict, the proof summary, the real
    code's symbolic verdict, then the fuzz report (findings in full)."""
    from kvspec.render_fuzz import render_markdown

    lines = [f"# kvspec check: {VERDICTS[overall]}", ""]
    prove_path = out / "prove.json"
    if prove_path.exists():
        prove = json.loads(prove_path.read_text())
        s = prove["summary"]
        lines.append(f"- kvspec prove {VERDICTS[proved]}: {s['theorems']} theorems, {s['proved']} proved, "
                     f"{s['refuted']} refuted, {s['unexpected']} not as expected, "
                     f"{s['unknown']} unknown")
        for verdict in prove.get("real_code", []):
            lines.append(f"- the registration code of {label}, symbolically: {verdict['status']} "
                         f"({verdict['detail']})")
    lines.append(f"- differential fuzzing against {label}: {VERDICTS[fuzzed]}")
    lines.append("")
    fuzz_path = out / "fuzz.json"
    if fuzz_path.exists():
        lines.append(render_markdown(json.loads(fuzz_path.read_text())))
    return "\n".join(lines).rstrip("\n") + "\n"


def register(sub: "argparse._SubParsersAction") -> None:
    check = sub.add_parser("check", help="the main job: prove, then fuzz one vLLM (default: the newest release)")
    check.add_argument("--vllm", metavar="VERSION", help="release to check (default: newest supported)")
    check.add_argument("--vllm-src", metavar="PATH",
                       help="a vLLM tree to check instead, e.g. the PR's checkout in CI")
    check.add_argument("--max-examples", type=int, default=1000, metavar="N")
    check.add_argument("--jobs", type=int, default=1, metavar="N", help="parallel fuzzing runs")
    check.add_argument("--seed", type=int, default=None)
    check.add_argument("--timeout", type=float, default=20.0)
    check.add_argument("--json", metavar="FILE", help="the fuzz result as JSON")
    check.add_argument("--out", metavar="DIR",
                       help="write prove.json, fuzz.json and report.md (Markdown) there, for CI")
    check.add_argument("--database", default=os.path.join(".kvspec", "examples"),
                       metavar="DIR|redis://HOST:PORT[/DB]", help="Hypothesis example database")
    check.add_argument("--findings-dir", default=os.path.join(".kvspec", "findings"))
    check.add_argument("--quiet", action="store_true")
    check.set_defaults(func=cmd_check)
