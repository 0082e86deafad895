"""``kvspec report FILE``: render stored findings (text, Markdown, JSON, SVG, test)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from kvspec import exitcodes


def cmd_report(args: argparse.Namespace) -> int:
    from kvspec.cli import UsageError
    from kvspec.plot import render_svg
    from kvspec.render_finding import render_markdown, render_text
    from kvspec.replay_command import load_findings

    findings = load_findings(args.finding)
    if args.format == "markdown":
        text = "\n".join(render_markdown(f, heading="##", plot_path=args.plot or f.artifacts.get("plot"))
                         for f in findings)
    elif args.format == "json":
        text = json.dumps([f.to_dict() for f in findings], indent=2, sort_keys=True) + "\n"
    else:
        text = "\n\n".join(render_text(f) for f in findings) + "\n"
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    if args.format == "markdown" and os.environ.get("GITHUB_STEP_SUMMARY"):
        with open(os.environ["GITHUB_STEP_SUMMARY"], "a", encoding="utf-8") as summary:
            summary.write(text)
    first = findings[0]
    if args.plot:
        if not first.sweep:
            raise UsageError("this finding has no sweep to plot: only fuzz findings against a "
                             "live subject carry one")
        Path(args.plot).write_text(render_svg(first))
    if args.emit_test:
        if not first.regression_test:
            raise UsageError("this finding has no regression test: proof findings and crashes "
                             "without per-group values have none")
        Path(args.emit_test).write_text(first.regression_test["code"])
    return exitcodes.OK


def register(sub: "argparse._SubParsersAction") -> None:
    report = sub.add_parser("report", help="render stored findings: text, Markdown, JSON, plot, test")
    report.add_argument("finding", metavar="FILE",
                        help="a stored finding, or a `kvspec fuzz --json` / `kvspec prove --json` result")
    report.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    report.add_argument("--output", metavar="FILE", help="write the report here instead of stdout")
    report.add_argument("--plot", metavar="FILE.svg", help="write the registered-vs-computed plot")
    report.add_argument("--emit-test", metavar="FILE.py",
                        help="write the regression test for tests/v1/core/")
    report.set_defaults(func=cmd_report)
