"""``kvspec report FILE``: render stored findings (text, Markdown, JSON, plot,
regression test).

The file is untrusted: what it holds is validated by the finding model, text
copied into Markdown is escaped, and a regression test is emitted anew from
the finding's inputs, never copied from the file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from kvspec.arguments import writable
from kvspec.model.errors import UsageError
from kvspec.model.outcome import Outcome

HELP = "render stored findings: text, Markdown, JSON, plot, test"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("finding", metavar="FILE",
                        help="a stored finding, or a `kvspec fuzz --json` / `kvspec prove --json` result")
    parser.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    parser.add_argument("--output", metavar="FILE", help="write the report here instead of stdout")
    parser.add_argument("--plot", metavar="FILE.svg", help="write the registered-vs-computed plot "
                        "(PNG when FILE ends in .png, else SVG)")
    parser.add_argument("--emit-test", metavar="FILE.py",
                        help="write the regression test for tests/v1/core/")
    parser.add_argument("--upstream", action="store_true",
                        help="an engine finding on a published release as a vLLM bug report (Markdown): a "
                             "standalone reproduction script, run first in a fresh process on the release")


def run(args: argparse.Namespace) -> Outcome:
    from kvspec.report.files import append_step_summary, write_text
    from kvspec.report.finding import render_markdown, render_text
    from kvspec.report.plot import render_png, render_svg
    from kvspec.emit.regression_test import emit_test
    from kvspec.report.stored import load_findings

    output = writable(args.output, "--output")
    if args.upstream:
        return _upstream(args, output)
    plot = writable(args.plot, "--plot")
    emit = writable(args.emit_test, "--emit-test")
    findings = load_findings(args.finding)
    first = findings[0]
    if plot is not None and not first.sweep:
        raise UsageError("this finding has no sweep to plot: only fuzz findings against a "
                         "live subject carry one")
    code = None
    if emit is not None:
        code = emit_test(first, first.subject_capabilities()) if first.source == "fuzz" else None
        if code is None:
            raise UsageError("this finding has no regression test: proof findings and crashes "
                             "without per-group values have none")
    if args.format == "markdown":
        text = "\n".join(render_markdown(f, heading="##", plot_path=args.plot or f.artifacts.get("plot"))
                         for f in findings)
    elif args.format == "json":
        text = json.dumps([f.to_dict() for f in findings], indent=2, sort_keys=True) + "\n"
    else:
        text = "\n\n".join(render_text(f) for f in findings) + "\n"
    if output is not None:
        write_text(output, text)
    else:
        sys.stdout.write(text)
    if args.format == "markdown" and os.environ.get("GITHUB_STEP_SUMMARY"):
        append_step_summary(text)
    if plot is not None and str(plot).lower().endswith(".png"):
        plot.write_bytes(render_png(first))
    elif plot is not None:
        write_text(plot, render_svg(first))
    if emit is not None:
        write_text(emit, code)
    return Outcome.OK


def _upstream(args: argparse.Namespace, output) -> Outcome:
    from kvspec.report.files import write_text
    from kvspec.report.stored import load_findings
    from kvspec.usecases.upstream import upstream_report

    if args.plot or args.emit_test or args.format != "text":
        raise UsageError("--upstream writes a Markdown bug report on its own: no --plot, --emit-test or --format")
    findings = load_findings(args.finding)
    if len(findings) != 1:
        raise UsageError(f"--upstream reports one finding; {args.finding} holds {len(findings)}")
    # Progress on stderr: stdout may be the report itself.
    report = upstream_report(findings[0], say=lambda line: print(line, file=sys.stderr, flush=True))
    if output is not None:
        write_text(output, report.markdown)
    else:
        sys.stdout.write(report.markdown)
    return report.outcome
