"""``kvspec report --upstream``'s use case: a vLLM bug report for an engine finding."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import attrs

from kvspec.model.errors import UsageError
from kvspec.model.outcome import Outcome
from kvspec.usecases import Say, print_line

__all__ = ["UpstreamReport", "upstream_report"]


@attrs.frozen
class UpstreamReport:
    markdown: str
    reproduced: bool

    @property
    def outcome(self) -> Outcome:
        # A report without a working reproduction is written but is not what was asked.
        return Outcome.OK if self.reproduced else Outcome.INCOMPLETE


def upstream_report(finding, *, say: Say = print_line) -> UpstreamReport:
    """A vLLM bug report for an engine finding on a published release: the
    standalone script written from the finding's validated program, run in a
    fresh process on the release before it is offered.  A finding kvspec
    writes no script for is a ``UsageError`` (exit 2), said before anything runs."""
    from kvspec.emit.engine_test import ENGINE_TEST_KINDS, rule_check
    from kvspec.model.engine import EngineProgram
    from kvspec.model.known import known_bugs
    from kvspec.report.upstream import render_upstream
    from kvspec.subjects.provision import ensure_release
    from kvspec.subjects.upstream_repro import UPSTREAM_KINDS, Unscriptable, repro_script, run_repro

    program = finding.inputs.get("engine_program") if isinstance(finding.inputs, dict) else None
    if finding.source != "fuzz" or not isinstance(program, dict):
        raise UsageError("kvspec report --upstream is for engine findings (kvspec fuzz --engine): this one has no "
                         "engine program")
    subject = finding.compared.get("subject") or {}
    version = subject.get("version") if subject.get("kind") == "release" else None
    if not isinstance(version, str):
        raise UsageError("kvspec report --upstream is for a finding on a published release (kvspec fuzz --vllm X.Y.Z)")
    engine_program, settings = EngineProgram.from_dict(program), (finding.run or {}).get("engine_settings")
    # Any kind but a crash or an estimate: the script makes the check the finding's engine test makes.
    rule = None
    if finding.category in ENGINE_TEST_KINDS and finding.category not in UPSTREAM_KINDS:
        try:
            rule = rule_check(engine_program, settings, finding.category, finding.detail)
        except Unscriptable as exc:
            raise Unscriptable(f"no upstream reproduction script, as no engine test is written for this finding: "
                               f"{exc}") from None
    script = repro_script(engine_program, settings, finding.category, version, rule)
    matching = known_bugs(version, finding.category, finding.detail)
    known = matching[0] if matching else None
    error = str((finding.observations or {}).get("error") or "")
    # Only the exception's class name is compared, and only when it is a plain name.
    crash = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(?::|$)", error)
    crash_type = crash.group(1) if crash else None
    # The other side, for a known bug: the first release without it, where the
    # script should run clean; run beside the release's run, shown only if that reproduced.
    fixed = known.fixed_in if known is not None and known.fixed_in else None
    say(f"kvspec report --upstream: running the reproduction in a fresh process on vLLM {version}"
        + (f", and on vLLM {fixed}, the first release without the known bug" if fixed else ""))
    with ThreadPoolExecutor(2) as pool:
        fixed_future = None
        if fixed:
            fixed_tree = str(ensure_release(fixed))
            fixed_future = pool.submit(run_repro, script, crash_type, tree=fixed_tree, label=f"vLLM {fixed}")
        run = run_repro(script, crash_type)
        fixed_run = fixed_future.result() if fixed_future is not None else None
    say(f"kvspec report --upstream: the script {'reproduced' if run.reproduced else 'did NOT reproduce'} "
        f"(exit status {run.returncode}, {run.seconds:.1f} s){_last_line(run)}")
    if not run.reproduced:
        fixed_run = None  # nothing to contrast
    if fixed_run is not None:
        say(f"kvspec report --upstream: on vLLM {fixed} it "
            f"{'ran clean' if fixed_run.ran_clean else 'did NOT run clean'} (exit status {fixed_run.returncode}, "
            f"{fixed_run.seconds:.1f} s){_last_line(fixed_run)}")
    return UpstreamReport(render_upstream(finding, known=known, script=script, run=run, fixed_run=fixed_run),
                          run.reproduced)


def _last_line(run) -> str:
    """What the script said last: its Actual line, or that it ran to its end."""
    if run.ran_clean:
        return ": no failure: the finding did not reproduce"
    lines = run.tail.splitlines()
    return f": {lines[-1]}" if lines else ""
