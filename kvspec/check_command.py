"""``kvspec check``: the main job -- proofs, then fuzz the newest release."""

from __future__ import annotations

import argparse
import os

from kvspec import exitcodes


def cmd_check(args: argparse.Namespace) -> int:
    from kvspec.cli import cmd_prove
    from kvspec.subject_commands import NEWEST_SUPPORTED, cmd_fuzz

    version = args.vllm or NEWEST_SUPPORTED
    print("== 1/2  kvspec prove: the theorem catalog over unbounded integers, and vLLM "
          f"{version}'s own registration code symbolically")
    prove_args = argparse.Namespace(theorem=None, list=False, json=None, timeout=args.timeout,
                                    seed=0, quiet=args.quiet, vllm=[version], vllm_src=None,
                                    current=False)
    proved = cmd_prove(prove_args)
    print(f"\n== 2/2  kvspec fuzz: the spec against real vLLM {version} (provisioned on first use)")
    fuzz_args = argparse.Namespace(vllm=[version], vllm_src=None, current=False,
                                   max_examples=args.max_examples, seed=args.seed, json=args.json, markdown=None,
                                   findings_dir=args.findings_dir,
                                   database=os.path.join(".kvspec", "examples"))
    fuzzed = cmd_fuzz(fuzz_args)
    verdicts = {exitcodes.OK: "OK", exitcodes.FINDING: "FINDING", exitcodes.USAGE: "ERROR",
                exitcodes.UNKNOWN: "UNKNOWN"}
    print(f"\nkvspec check: proofs {verdicts[proved]}, vLLM {version} {verdicts[fuzzed]}")
    if exitcodes.FINDING in (proved, fuzzed):
        print("VERDICT: FINDING")
        return exitcodes.FINDING
    if exitcodes.USAGE in (proved, fuzzed):
        print("VERDICT: ERROR")
        return exitcodes.USAGE
    if exitcodes.UNKNOWN in (proved, fuzzed):
        print("VERDICT: UNKNOWN")
        return exitcodes.UNKNOWN
    print("VERDICT: OK -- every theorem as expected, no discrepancy against real vLLM")
    return exitcodes.OK


def register(sub: "argparse._SubParsersAction") -> None:
    check = sub.add_parser("check", help="the main job: prove, then fuzz the newest supported release")
    check.add_argument("--vllm", metavar="VERSION", help="release to fuzz (default: newest supported)")
    check.add_argument("--max-examples", type=int, default=1000, metavar="N")
    check.add_argument("--seed", type=int, default=None)
    check.add_argument("--timeout", type=float, default=20.0)
    check.add_argument("--json", metavar="FILE", help="the fuzz result as JSON")
    check.add_argument("--findings-dir", default=os.path.join(".kvspec", "findings"))
    check.add_argument("--quiet", action="store_true")
    check.set_defaults(func=cmd_check)
