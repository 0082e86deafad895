"""What kvspec does, as typed functions: prove, fuzz, the kill matrix, one
release's history row.  Commands parse arguments and call these; ``check``,
the tests and the benchmarks call them too (never each other's argparse).

A fuzz run is recorded as it happens: ``FuzzRun`` holds every subject's
result and finding the moment it exists, and the ``on_update`` callback
(the command writes its JSON and Markdown there) is called after each one.
An error or an interrupt ends the run with what it has and an explicit
status, never a clean verdict.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Callable

import attrs

from kvspec.model.errors import KvspecError, UsageError
from kvspec.model.outcome import Outcome, worst

__all__ = ["hitrate_row", "compare_with_reference", "mtp_model_side", "mtp_subject_side", "FuzzSettings", "SubjectRun", "FuzzRun", "fuzz", "ProveRun", "prove", "real_code",
           "kill_matrix", "history_row", "UpstreamReport", "upstream_report"]

Say = Callable[[str], None]


def _print(message: str) -> None:
    print(message, flush=True)


# -- proofs ---------------------------------------------------------------------

@attrs.frozen
class ProveRun:
    results: tuple  # proofs.verdict.TheoremResult, in catalog order
    settings: dict[str, Any]

    @property
    def outcome(self) -> Outcome:
        from kvspec.proofs.verdict import Status

        if any(not r.as_expected and r.status is not Status.UNKNOWN for r in self.results):
            return Outcome.FINDING
        if any(r.status is Status.UNKNOWN or (r.vacuity is not None and r.vacuity.unknown)
               for r in self.results):
            return Outcome.UNKNOWN
        return Outcome.OK


def prove(names: list[str] | None = None, *, budget=None, seed: int = 0,
          progress: Callable | None = None) -> ProveRun:
    """The theorem catalog (or the named theorems) over unbounded integers,
    each solver check within ``budget`` (``proofs.runner.Budget``: resource
    units, the same verdict on any machine)."""
    from kvspec.model.errors import UsageError
    from kvspec.proofs.catalog import CATALOG, names as catalog_names, theorem
    from kvspec.proofs.runner import Budget, run_catalog

    if names:
        unknown = [n for n in names if n not in catalog_names()]
        if unknown:
            raise UsageError(f"unknown theorem {unknown[0]!r}; `kvspec prove --list` shows the catalog")
        chosen = [theorem(n) for n in names]
    else:
        chosen = list(CATALOG)
    budget = budget or Budget()
    results = run_catalog(chosen, budget=budget, seed=seed, progress=progress)
    return ProveRun(tuple(results), {**budget.as_dict(), "seed": seed})


def real_code(subjects: list, *, timeout_s: float = 60.0, say: Say = _print) -> list:
    """The symbolic leg: each subject's own registration code against the subject."""
    from kvspec.subjects.symbolic import symbolic_check

    verdicts = []
    for subject in subjects:
        verdict = symbolic_check(subject, timeout=timeout_s)
        verdicts.append(verdict)
        say(f"  {subject.label}: {verdict.status.value} {verdict.target} ({verdict.detail}; "
            f"{verdict.paths} paths, {verdict.seconds:.1f} s symbolic, {verdict.wall_seconds:.1f} s in all)")
        cx = verdict.counterexample
        if cx:
            args_text = ", ".join(f"{k}={v}" for k, v in cx["args"].items())
            say(f"    counterexample: {args_text}: vLLM {cx['real']}, subject {cx['spec']}")
            if cx["replay"].get("case"):
                say(f"    replayed as: {cx['replay']['case']}")
        for note in verdict.abstracted:
            say(f"    abstracted: {note}")
    return verdicts


# -- fuzzing --------------------------------------------------------------------

# The differentials, in the order a run takes them: "registration" compares
# each request's cache_blocks bounds on a fresh manager; "lookup" does that
# and follows each request with a later one that looks up (the hit-length
# differential); "stateful" drives one manager through many requests and
# checks its state after every operation (diff_tests.stateful).
DIFFERENTIALS = ("registration", "lookup", "stateful", "engine")
ALL_DIFFERENTIALS = ("lookup", "stateful", "engine")  # lookup includes registration
# Differentials that drive programs (many requests on one live worker), never split into jobs.
PROGRAM_DIFFERENTIALS = ("stateful", "engine")


@attrs.frozen
class FuzzSettings:
    max_examples: int = 2000
    seed: int = 0
    database: str = ""
    jobs: int = 1
    differentials: tuple[str, ...] = ("registration",)
    verify_test: bool = True
    progress: bool = False  # progress lines on stderr
    hash_schemes: tuple[str, ...] | None = None  # --hash-scheme (None: every one the subject has)
    include_known: bool = False  # --include-known: a known vLLM bug met is a finding, not recognised

    def __attrs_post_init__(self) -> None:
        unknown = set(self.differentials) - set(DIFFERENTIALS)
        if unknown or not self.differentials:
            raise UsageError(f"unknown differential {sorted(unknown)}; known: {', '.join(DIFFERENTIALS)}")

    @property
    def lookup(self) -> bool:
        return "lookup" in self.differentials

    def as_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "max_examples": self.max_examples, "lookup": self.lookup,
                "differentials": list(self.differentials), "jobs": self.jobs,
                "hash_schemes": list(self.hash_schemes) if self.hash_schemes else "all",
                "include_known": self.include_known}


@attrs.define
class SubjectRun:
    """One differential's result on one subject, and its completed finding
    (None: no discrepancy)."""

    result: Any  # diff_tests.fuzz.FuzzResult or diff_tests.stateful.StatefulResult
    finding: Any = None  # model.finding.Finding
    finding_path: Path | None = None
    differential: str = "registration"
    # The stateful differential's other distinct failures, each a finding of its own.
    others: list[tuple[Any, Path]] = attrs.Factory(list)
    # A control run's recorded result reused instead of fuzzing again: the
    # sentence every output says it with (kvspec.controls; None: it ran).
    reused: str | None = None


@attrs.define
class FuzzRun:
    settings: FuzzSettings
    planned: list[str]  # every subject's label, in order
    subjects: list[SubjectRun] = attrs.Factory(list)
    errors: list[dict[str, Any]] = attrs.Factory(list)
    # Why the run stopped before covering everything it was asked to (None: it did not).
    stopped: Outcome | None = None
    stopped_why: str = ""

    @property
    def outcome(self) -> Outcome:
        # A finding no deployment reaches, or acceptance-only, is hardening
        # (kvspec.reach); so is a stateful finding shown on hand-built geometry
        # only (diff_tests/reproduce.py): the other findings of a run count too.
        def of(finding) -> Outcome:
            return Outcome.HARDENING if finding.reach is not None and finding.reach.hardening else Outcome.FINDING

        parts = [of(s.finding) if s.finding is not None else s.result.outcome for s in self.subjects]
        parts += [of(other) for s in self.subjects for other, _ in s.others]
        parts += [Outcome.USAGE for _ in self.errors]
        if self.stopped is not None:
            parts.append(self.stopped)
        return worst(parts)

    @property
    def status(self) -> str:
        """The run's state in a word or two, first in every report of it."""
        if self.stopped is Outcome.INTERRUPTED:
            return "INTERRUPTED"
        if self.stopped is not None:
            return "INCOMPLETE"
        if self.reductions:
            return "REDUCED SCOPE"
        return "COMPLETE"

    @property
    def reductions(self) -> list[str]:
        """What each subject's tree lacks against the release it claims to be."""
        return [s.result.scope_reduction for s in self.subjects if s.result.scope_reduction]

    @property
    def why(self) -> str:
        """Why the run is not COMPLETE, in words ("" when it is)."""
        return "; ".join(filter(None, [self.stopped_why, *self.reductions]))


def _launch(subject):
    """Start a subject's worker without waiting for it (or the error that stops it)."""
    from kvspec.subjects.process import SubjectProcess

    try:
        return SubjectProcess(subject, wait=False)
    except KvspecError as exc:
        return exc


def fuzz(subjects: list, settings: FuzzSettings, findings_dir: Path, *, run: FuzzRun | None = None,
         on_update: Callable[[FuzzRun], None] = lambda run: None, say: Say = _print,
         started: float | None = None, on_finding: Callable | None = None) -> FuzzRun:
    """Fuzz each subject in its own worker; the run is handed to ``on_update``
    after every subject and finding.  A setup error of one subject is
    recorded and the next one fuzzed; an infrastructure error or an interrupt
    stops the run (status INCOMPLETE or INTERRUPTED), keeping what was found.

    With one job, workers start ahead: the next one while the current one
    is fuzzed, so vLLM's import time overlaps other work.  ``on_finding``
    (the command passes ``kvspec.reach.attach``) completes each finding with
    who it reaches, while its subject is still live; the finding is stored again."""
    from kvspec.diff_tests.database import example_database
    from kvspec.diff_tests.parallel import fuzz_parallel
    from kvspec.model.about import versions
    from kvspec.report.completion import store_finding

    started = time.perf_counter() if started is None else started
    run = FuzzRun(settings, [subject.label for subject in subjects]) if run is None else run
    jobs = settings.jobs
    # Built once, before any worker starts: a server that cannot be reached
    # is a setup error now.  Parallel jobs open it again from its location.
    database = example_database(settings.database)
    in_process = jobs == 1 or any(d in PROGRAM_DIFFERENTIALS for d in settings.differentials)
    # Controls whose recorded results stand for this run start no worker.
    controls = _controls(subjects, settings)
    needs_worker = [i for i in range(len(subjects)) if not _all_reused(controls.get(i), settings)]
    launched = {needs_worker[0]: _launch(subjects[needs_worker[0]])} if needs_worker and in_process else {}
    current = None
    try:
        for index, subject in enumerate(subjects):
            current = subject.label
            in_parallel = f", {jobs} jobs" if jobs > 1 else ""
            if index not in needs_worker:
                for differential in settings.differentials:
                    result, sentence = controls[index][differential]["reused"]
                    entry = SubjectRun(result, differential=differential, reused=sentence)
                    run.subjects.append(entry)
                    on_update(run)
                    _say_result(entry, say, in_parallel)
                continue
            say(f"{subject.label}: starting (seed {settings.seed}, up to {settings.max_examples} "
                f"examples{in_parallel}; {', '.join(settings.differentials)})")
            proc = None
            try:
                proc = launched.pop(index, None)
                if isinstance(proc, Exception):
                    raise proc
                if proc is not None:
                    proc.ready()
                ahead = next((i for i in needs_worker if i > index), None)
                if in_process and ahead is not None:
                    launched[ahead] = _launch(subjects[ahead])
                for differential in settings.differentials:
                    if differential not in PROGRAM_DIFFERENTIALS and jobs > 1:
                        result = fuzz_parallel(subject, jobs, settings.max_examples, settings.seed,
                                               settings.database, lookup=differential == "lookup",
                                               hash_schemes=settings.hash_schemes)
                        if result.failure is not None and proc is None:
                            proc = _launch(subject)
                            if isinstance(proc, Exception):
                                raise proc
                            proc.ready()
                    elif differential == "stateful":
                        result = _fuzz_stateful_one(proc, subject.label, settings, database, started, say)
                    elif differential == "engine":
                        result = _fuzz_engine_one(proc, subject.label, settings, database, started, say)
                    else:
                        result = _fuzz_one(proc, subject.label, settings, database, started, say,
                                           lookup=differential == "lookup")
                    entry = SubjectRun(result, differential=differential)
                    failed_completion: Exception | None = None
                    control = controls.get(index, {}).get(differential)
                    if control is not None:  # recorded if clean and complete (kvspec.controls.remember)
                        from kvspec.controls import remember

                        remember(control["key"], control["state"], result)
                    if result.failure is not None and result.stopped is None:
                        say(f"{subject.label}: DISCREPANCY ({result.failure.category.value}, {differential} "
                            f"differential) after {result.first_failure()} ({result.seconds_to_first_failure:.2f} s "
                            f"into fuzzing); run with shrinking {result.seconds:.1f} s; completing the finding")
                        # Outcome first: the finding is in the run's JSON and Markdown, as found,
                        # before it is completed, so no completion or storage error can lose it.
                        entry.finding = _as_found(result, differential, versions(),
                                                  "being completed (the run ended before it was)")
                        run.subjects.append(entry)
                        on_update(run)
                        try:
                            entry.finding, entry.finding_path = _complete(proc, result, differential, findings_dir,
                                                                          versions(), settings.verify_test)
                            if on_finding is not None:  # who is affected (kvspec.reach.attach), stored with it
                                entry.finding = on_finding(entry.finding, proc, say)
                                store_finding(entry.finding, entry.finding_path)
                            for other in _other_results(result, differential):
                                try:
                                    entry.others.append(_complete(proc, other, differential, findings_dir,
                                                                  versions(), settings.verify_test))
                                except KvspecError:  # the worker failed completing it: keep it as found
                                    entry.others.append(_store_raw(other, differential, findings_dir, versions()))
                        except KeyboardInterrupt:  # interrupted while completing: keep the findings as found
                            if entry.finding_path is None:
                                entry.finding, entry.finding_path = _store_raw(result, differential, findings_dir,
                                                                               versions())
                            for other in _other_results(result, differential)[len(entry.others):]:
                                entry.others.append(_store_raw(other, differential, findings_dir, versions()))
                            raise
                        except (KvspecError, OSError) as exc:  # the finding stays, as found, with the error
                            failed_completion = exc
                            entry.finding, entry.finding_path = _kept(result, differential, findings_dir,
                                                                      versions(), exc)
                    else:
                        if result.failure is not None:  # stopped mid-run: keep what was found, as found
                            entry.finding, entry.finding_path = _store_raw(result, differential, findings_dir,
                                                                           versions())
                            entry.others += [_store_raw(other, differential, findings_dir, versions())
                                             for other in _other_results(result, differential)]
                        run.subjects.append(entry)
                    if failed_completion is not None:
                        outcome = (failed_completion.outcome if isinstance(failed_completion, KvspecError)
                                   else Outcome.INFRASTRUCTURE)
                        run.stopped, run.stopped_why = outcome, (f"{subject.label}: completing or storing the "
                                                                 f"finding failed: {failed_completion}")
                    on_update(run)
                    _say_result(entry, say, in_parallel if differential not in PROGRAM_DIFFERENTIALS else "")
                    if failed_completion is not None:
                        break
                    if result.stopped is not None:
                        run.stopped, run.stopped_why = result.stopped, result.stopped_why
                        on_update(run)
                        break
            except KvspecError as exc:
                if exc.outcome is not Outcome.USAGE:
                    raise
                run.errors.append({"subject": subject.as_dict(), "error": str(exc)})
                say(f"{subject.label}: ERROR {exc}")
                on_update(run)
                continue
            finally:
                if proc is not None and not isinstance(proc, Exception):
                    proc.close()
            if run.stopped is not None:
                break
    except KeyboardInterrupt:
        run.stopped, run.stopped_why = Outcome.INTERRUPTED, f"interrupted while fuzzing {current}"
        on_update(run)
        raise
    except KvspecError as exc:
        run.stopped, run.stopped_why = exc.outcome, f"{current}: {exc}"
        say(f"{current}: {exc.outcome.name}: {exc}")
        on_update(run)
    finally:
        for proc in launched.values():  # started ahead, never reached (an interrupt)
            if not isinstance(proc, Exception):
                proc.close()
        _controls_done(controls, settings)
    return run


def _controls(subjects: list, settings: FuzzSettings) -> dict[int, dict[str, dict[str, Any]]]:
    """Per control (a release fuzzed beside its mutant) and differential: its
    key, the example database's state, and the recorded result to reuse."""
    from kvspec.controls import control_key, database_state, is_control, recall, reused_sentence

    out: dict[int, dict[str, dict[str, Any]]] = {}
    state = database_state(settings.database)
    for index, subject in enumerate(subjects):
        if not is_control(subject, subjects):
            continue
        for differential in settings.differentials:
            if differential in PROGRAM_DIFFERENTIALS:
                continue
            try:
                key = control_key(subject, settings, differential)
            except (KvspecError, OSError):  # cannot be provisioned or read: it runs, and says why then
                continue
            found = recall(key, state)
            entry: dict[str, Any] = {"key": key, "state": state, "reused": None}
            if found is not None:
                result, recorded = found
                entry["reused"] = (result, reused_sentence(subject.label, recorded))
            out.setdefault(index, {})[differential] = entry
    return out


def _all_reused(control: dict[str, dict[str, Any]] | None, settings: FuzzSettings) -> bool:
    return control is not None and all(
        control.get(d) is not None and control[d]["reused"] is not None for d in settings.differentials)


def _controls_done(controls: dict[int, dict[str, dict[str, Any]]], settings: FuzzSettings) -> None:
    """Each control's record learns the database as this command leaves it."""
    from kvspec.controls import add_database_state, database_state

    if not controls:
        return
    try:
        state = database_state(settings.database)
        for per_differential in controls.values():
            for entry in per_differential.values():
                add_database_state(entry["key"], state)
    except OSError:  # the records stay as they were: a later control runs again
        pass


def _other_results(result, differential: str) -> list[Any]:
    """The stateful run's other distinct failures, each as the run that found
    it (one finding each; a registration run's others are its jobs', said
    with the first)."""
    if differential not in PROGRAM_DIFFERENTIALS:
        return []
    return [attrs.evolve(result, failure=other, other_failures=()) for other in result.other_failures]


def _complete(proc, result, differential: str, findings_dir: Path, versions: dict[str, str], verify: bool):
    if differential == "engine":
        from kvspec.report.engine import complete_engine_finding

        return complete_engine_finding(proc, result, findings_dir, versions)
    if differential == "stateful":
        from kvspec.report.stateful import complete_stateful_finding

        return complete_stateful_finding(proc, result, findings_dir, versions)
    from kvspec.report.completion import complete_finding

    return complete_finding(proc, result, findings_dir, versions, verify=verify)


def _as_found(result, differential: str, versions: dict[str, str], incomplete: str):
    """The finding of ``result`` as found, not stored, marked ``incomplete`` with why."""
    if differential == "engine":
        from kvspec.report.engine import engine_finding

        finding = engine_finding(result, versions)
    elif differential == "stateful":
        from kvspec.report.stateful import stateful_finding

        finding = stateful_finding(result, versions)
    else:
        from kvspec.report.findings import fuzz_finding

        finding = fuzz_finding(result, versions, explain=False)
    return attrs.evolve(finding, run={**finding.run, "incomplete": incomplete})


def _kept(result, differential: str, findings_dir: Path, versions: dict[str, str], error: Exception):
    """A finding whose completion or storage failed: stored as found if the
    store works, else only in the run's reports; marked incomplete with the error."""
    why = f"completing or storing it failed: {error}"
    try:
        finding, path = _store_raw(result, differential, findings_dir, versions)
    except (KvspecError, OSError) as again:
        return _as_found(result, differential, versions, f"{why}; storing it as found failed too: {again}"), None
    finding = attrs.evolve(finding, run={**finding.run, "incomplete": why})
    try:
        from kvspec.report.completion import store_finding

        store_finding(finding, path)
    except OSError:
        pass  # stored as found a moment ago; the run's reports say why it is incomplete
    return finding, path


def _store_raw(result, differential: str, findings_dir: Path, versions: dict[str, str]):
    if differential == "engine":
        from kvspec.report.engine import store_raw_engine_finding

        return store_raw_engine_finding(result, findings_dir, versions)
    if differential == "stateful":
        from kvspec.report.stateful import store_raw_stateful_finding

        return store_raw_stateful_finding(result, findings_dir, versions)
    from kvspec.report.completion import store_raw_finding

    return store_raw_finding(result, findings_dir, versions)


def _say_result(entry: SubjectRun, say: Say, in_parallel: str) -> None:
    from kvspec.report.finding import render_text

    result, finding = entry.result, entry.finding
    label = f"{result.subject['label']} [{entry.differential}]"
    rate = result.cases / result.seconds if result.seconds else 0.0
    restarts = (f"; {len(result.restarts)} worker restart(s) the retry did not reproduce (the machine's, "
                f"not vLLM's): {result.restarts[0]}" if result.restarts else "")
    if finding is None and result.stopped is None and result.scope_reduction:
        say(f"{label}: REDUCED SCOPE: {result.scope_reduction}")
    if entry.reused:
        say(f"{label}: {result.verdict} in {result.coverage()}; {entry.reused} (it took {result.seconds:.1f} s "
            "then)")
    elif finding is None and result.stopped is None:
        say(f"{label}: {result.verdict} in {result.coverage()} ({result.seconds:.1f} s, "
            f"{rate:.0f} {result.units}/s{in_parallel}){restarts}")
        if entry.differential in PROGRAM_DIFFERENTIALS:
            say(f"  scope: {result.scope()}")
    elif finding is None:
        say(f"{label}: STOPPED after {result.cases} {result.units}: {result.stopped_why}")
    else:
        say(render_text(finding))
        if finding.reach is not None:
            say(f"  who is affected: {finding.reach.summary}")
        if entry.finding.run.get("incomplete"):
            say(f"  INCOMPLETE finding: {entry.finding.run['incomplete']}")
        say(f"  stored: {entry.finding_path}" if entry.finding_path is not None
            else "  NOT STORED: it is only in this run's reports")
        if getattr(result, "other_failures", ()) and entry.differential not in PROGRAM_DIFFERENTIALS:
            say(f"  {len(result.other_failures)} other distinct failure(s) found by other jobs: "
                + "; ".join(f.case.describe() for f in result.other_failures))
        for other, path in entry.others:
            say(f"  also broken in this run (found within Hypothesis's search after the first; not a complete "
                f"list): {other.detail}; program: {other.inputs.get('describe')}; stored: {path}")
    # Under which hash schemes and scopes the result holds, and what was not driven.
    if entry.differential == "engine":
        if finding is not None:
            say(f"  {finding.inputs.get('how_a_user_reaches_it')}")
        return
    if entry.differential == "stateful":
        if finding is not None:
            for known in result.known_excluded:
                say(f"  known vLLM bug kept out of the draw (model/known.py): {known.name}")
        return
    say(f"  {result.scheme_text}; deployment profiles: "
        + (f"{result.tally.deployment_cases} cases on {result.deployment_configs} derived configurations"
           if result.deployment_configs else result.deployments_note))
    for item in result.capabilities.not_covered():
        say(f"  not covered: {item}")
    for known in result.known_excluded:
        say(f"  known vLLM bug kept out of the draw (model/known.py): {known.name}: {known.reach}")


def _fuzz_one(proc, label: str, settings: FuzzSettings, database, started: float, say: Say, *,
              lookup: bool):
    """One job in this process, with progress lines and the first-counterexample line."""
    import sys

    from kvspec.diff_tests.fuzz import fuzz_subject

    tick = None
    if settings.progress:
        def tick(n: int, seconds: float) -> None:
            print(f"  {label}: {n} cases, {seconds:.1f} s", file=sys.stderr, flush=True)

    def first(result) -> None:
        say(f"{label}: first counterexample after {result.cases_to_first_failure} cases, "
            f"{time.perf_counter() - started:.1f} s after kvspec started; shrinking")

    # Failing examples from earlier runs are replayed first.
    return fuzz_subject(proc, settings.max_examples, settings.seed, database=database, progress=tick,
                        on_first_failure=first, lookup=lookup,
                        hash_schemes=settings.hash_schemes)


def _fuzz_engine_one(proc, label: str, settings: FuzzSettings, database, started: float, say: Say):
    from kvspec.diff_tests.engine import fuzz_engine

    def first(result) -> None:
        say(f"{label}: first broken invariant through vLLM's Scheduler after {result.programs_to_first_failure} "
            f"engine programs, {time.perf_counter() - started:.1f} s after kvspec started; shrinking")

    return fuzz_engine(proc, settings.max_examples, settings.seed, database=database, on_first_failure=first,
                       include_known=settings.include_known)


def _fuzz_stateful_one(proc, label: str, settings: FuzzSettings, database, started: float, say: Say):
    from kvspec.diff_tests.stateful import fuzz_stateful

    def first(result) -> None:
        say(f"{label}: first broken invariant after {result.programs_to_first_failure} programs, "
            f"{time.perf_counter() - started:.1f} s after kvspec started; shrinking")

    return fuzz_stateful(proc, settings.max_examples, settings.seed, database=database, on_first_failure=first,
                         include_known=settings.include_known)


# -- mutants --------------------------------------------------------------------

def _model_verdict(variant_name: str) -> str:
    """What the proofs say of the variant a mutant models: 'equivalent' when
    its conformance theorem is PROVED, else 'non-equivalent' (or 'unknown')."""
    from kvspec.proofs.catalog import theorem
    from kvspec.proofs.runner import run_theorem
    from kvspec.proofs.verdict import Status

    result = run_theorem(theorem(f"conformance.{variant_name}"), vacuity=False)
    return {Status.PROVED: "equivalent", Status.REFUTED: "non-equivalent"}.get(result.status, "unknown")


def _symbolic_cell(subject, operator, version: str, model: str) -> dict[str, Any]:
    """The symbolic leg on one mutant; out of scope when the mutation lies in
    code the harness abstracts (it would be 'verified' for the wrong reason)."""
    from kvspec.subjects.provision import ensure_release
    from kvspec.subjects.symbolic import SymbolicStatus, symbolic_check

    original = (ensure_release(version) / operator.target_file).read_text(encoding="utf-8")
    method = operator.mutated_method(original)
    verdict = symbolic_check(subject)
    status = verdict.status.value
    if verdict.target and method != verdict.target and verdict.status is SymbolicStatus.VERIFIED:
        status = "out of scope"
    elif verdict.status is SymbolicStatus.VERIFIED and model == "equivalent":
        status = "verified-equivalent"  # the real code, not just the model, is equivalent
    return {"symbolic": status, "symbolic_seconds": round(verdict.seconds, 2),
            "mutated_method": method, "symbolic_detail": verdict.detail}


def kill_matrix(version: str, max_examples: int, seed: int, names: list[str] | None = None,
                symbolic: bool = False, every_technique: bool = False, say: Say = _print,
                on_row: Callable[[list[dict[str, Any]]], None] = lambda rows: None) -> list[dict[str, Any]]:
    """Every mutant of ``version`` (or the named ones) against every technique
    (the stateful differential on state-side mutants only, unless
    ``every_technique``); ``on_row`` gets the rows so far after each one."""
    from kvspec.diff_tests.exhaustive import Scope, exhaust
    from kvspec.diff_tests.fuzz import fuzz_subject
    from kvspec.diff_tests.stateful import fuzz_stateful
    from kvspec.subjects.mutation import ALL_MUTANTS, MutationTargetNotFound
    from kvspec.subjects.process import SubjectProcess
    from kvspec.subjects.provision import ensure_release
    from kvspec.subjects.subject import mutant_subject

    exhaustive_scope = Scope(max_groups=2)
    rows: list[dict[str, Any]] = []
    for operator in ALL_MUTANTS:
        if names and operator.name not in names:
            continue
        # A registration-side mutant is fuzzed by the registration differential;
        # a lookup- or state-side one by the hit-length differential (which
        # checks registration too); every mutant then by the stateful one.
        lookup = operator.side != "registration"
        model = {"lookup": "lookup side", "state": "state side"}.get(operator.side)
        row: dict[str, Any] = {"mutant": operator.name, "models_variant": operator.models_variant,
                               "summary": operator.summary, "side": operator.side,
                               "model": model or _model_verdict(operator.models_variant)}
        started = time.perf_counter()
        subject = mutant_subject(version, operator.name)
        try:
            operator.apply((ensure_release(version) / operator.target_file).read_text(encoding="utf-8"))
        except MutationTargetNotFound as exc:
            # The release lacks the code the operator rewrites (often: it already has that shape).
            row.update(status="not applicable", error=str(exc))
            rows.append(row)
            on_row(rows)
            say(f"  {operator.name}: not applicable to {version}: {exc}")
            continue
        try:
            with SubjectProcess(subject) as proc:
                result = fuzz_subject(proc, max_examples, seed, stop_at_first=True, lookup=lookup)
                stateful = None
                if every_technique or operator.side == "state":
                    stateful = fuzz_stateful(proc, max_examples, seed, stop_at_first=True)
                swept = None if operator.side != "registration" else exhaust([proc], exhaustive_scope)
        except KvspecError as exc:
            if exc.outcome is not Outcome.USAGE:
                raise
            row.update(status="error", error=str(exc))
            rows.append(row)
            on_row(rows)
            say(f"  {operator.name}: ERROR {exc}")
            continue
        killed = result.failure is not None
        killed_stateful = stateful is not None and stateful.failure is not None
        survived = "equivalent" if row["model"] == "equivalent" else "survived"
        row.update(
            status="killed" if killed or killed_stateful else survived,
            differential="lookup" if lookup else "registration",
            fuzz="killed" if killed else survived,
            cases_to_kill=result.cases_to_first_failure,
            seconds_to_kill=result.seconds_to_first_failure,
            cases=result.cases,
            category=result.failure.category.value if killed else None,
            example=result.failure.case.describe() if killed else None,
            stateful="not run" if stateful is None else "killed" if killed_stateful else survived,
            programs_to_kill=stateful and stateful.programs_to_first_failure,
            stateful_seconds_to_kill=None if stateful is None or stateful.seconds_to_first_failure is None
            else round(stateful.seconds_to_first_failure, 2),
            stateful_category=stateful.failure.category.value if killed_stateful else None,
            stateful_example=stateful.failure.case.describe() if killed_stateful else None,
            wall_seconds=round(time.perf_counter() - started, 2),
        )
        if swept is None:  # the exhaustive scope and the symbolic leg check registration only
            row.update(exhaustive="n/a", exhaustive_failing="", exhaustive_seconds="")
        else:
            row.update(exhaustive="killed" if swept["failing_cases"] else survived,
                       exhaustive_failing=f"{swept['failing_cases']}/{swept['cases']}",
                       exhaustive_seconds=swept["seconds"])
        if symbolic and operator.side != "registration":
            row.update(symbolic="n/a", symbolic_seconds="")
        elif symbolic:
            row.update(_symbolic_cell(subject, operator, version, row["model"]))
        rows.append(row)
        on_row(rows)
        say(f"  {operator.name}: {row['status']} (fuzz {row['fuzz']}, stateful {row['stateful']})"
            + (f", symbolic {row['symbolic']}" if symbolic else ""))
    return rows


# -- one release's history row ---------------------------------------------------

def _fuzz_fields(result) -> dict[str, Any]:
    """What a row keeps of one fuzz run (the registration run's at the row's
    top level, the lookup run's under ``lookup``)."""
    return {"cases": result.cases, "examples": result.examples, "seconds": round(result.seconds, 2),
            "failure": None if result.failure is None else result.failure.as_dict(),
            # A run that stopped early is never "no discrepancy" (exit 4 or 5 for the command).
            "outcome": result.outcome.name, "stopped": result.stopped_why or None}


def _row_status(runs) -> str:
    """One word for runs: a finding first, then a run that did not finish,
    and "no discrepancy" only when every run ran in full."""
    if any(r.failure is not None for r in runs):
        return "discrepancy"
    if any(r.outcome is not Outcome.OK for r in runs):
        return "incomplete"
    return "no discrepancy"


def history_row(version: str, max_examples: int, seed: int, symbolic: bool) -> dict[str, Any]:
    """The registration, lookup, stateful and engine differentials (and,
    with ``symbolic``, the release's own code) on one release."""
    from kvspec.diff_tests.engine import fuzz_engine
    from kvspec.diff_tests.fuzz import fuzz_subject
    from kvspec.diff_tests.stateful import fuzz_stateful
    from kvspec.subjects.process import SubjectProcess
    from kvspec.subjects.subject import SubjectUnsupported, release

    row: dict[str, Any] = {"version": version}
    subject = release(version)
    try:
        with SubjectProcess(subject) as proc:
            caps = proc.capabilities
            result = fuzz_subject(proc, max_examples, seed)
            # The same worker then answers the hit-length and stateful differentials.
            lookup = fuzz_subject(proc, max_examples, seed, lookup=True)
            # History shows every bug a release carries: none recognised and passed over.
            stateful = fuzz_stateful(proc, max_examples, seed, include_known=True)
            # And through vLLM's real Scheduler, engine-built, the release's defaults included.
            engine = fuzz_engine(proc, max_examples, seed, include_known=True)
    except SubjectUnsupported as exc:
        return {**row, "status": "unsupported", "detail": str(exc)}
    except KvspecError as exc:
        if exc.outcome is not Outcome.USAGE:
            raise
        return {**row, "status": "error", "detail": str(exc)}
    runs = (result, lookup, stateful, engine)
    row.update(
        status=_row_status(runs), overall=worst([r.outcome for r in runs]).name,
        capabilities=caps.as_dict(), rule=caps.rule_text(), **_fuzz_fields(result),
        lookup={"status": _row_status([lookup]), **_fuzz_fields(lookup)},
        stateful={"status": _row_status([stateful]), **_fuzz_fields(stateful),
                  "other_failures": [f.as_dict() for f in stateful.other_failures],
                  "operations": stateful.tally.operations, "scope": stateful.scope()},
        engine={"status": _row_status([engine]), **_fuzz_fields(engine),
                "other_failures": [f.as_dict() for f in engine.other_failures],
                "operations": engine.tally.operations, "scope": engine.scope(), "settings": engine.settings,
                "refused": engine.tally.refused},
    )
    if symbolic:
        from kvspec.subjects.symbolic import symbolic_check

        verdict = symbolic_check(subject)
        row["symbolic"] = {"status": verdict.status.value, "detail": verdict.detail}
    return row


# -- the multi-module MTP question -------------------------------------------------

MTP_THEOREMS = ("mtp.no_stale_draft_reuse.partial_hits", "mtp.no_stale_draft_reuse",
                "mtp.stale_reuse_reachability", "mtp.no_stale_draft_reuse.scheduler_block_tail",
                "mtp.lookahead_hashes_prevent_stale_reuse")


def mtp_model_side() -> list[dict[str, Any]]:
    from kvspec.proofs.catalog import theorem
    from kvspec.proofs.runner import run_theorem

    out = []
    for name in MTP_THEOREMS:
        result = run_theorem(theorem(name))
        out.append(result.as_dict())
    return out


def mtp_subject_side(subject) -> dict[str, Any]:
    """The stale-reuse search on one subject (the writer chunked by its own
    scheduler), the model's condition checked per configuration, the
    suggested fix checked against what vLLM did, and which deployment
    profiles (as the release's own configuration code derives them) reach it."""
    from kvspec.oracles.mtp import HASH_SCHEMES, fix_rejects, profiles_reaching
    from kvspec.subjects.drivers.deployments import derivations
    from kvspec.subjects.drivers.mtp import search_stale_reuse
    from kvspec.subjects.process import SubjectProcess

    with SubjectProcess(subject) as proc:
        caps, version = proc.capabilities, proc.identity.get("vllm_version")
        if not caps.reprefillable_tokens:
            return {"subject": subject.label, "vllm_version": version,
                    "unsupported": "no num_prefill_lookahead (multi-module MTP's prefill lookahead "
                                   "reaches the KV cache manager from 0.28)"}
        schemes = tuple(name for name in HASH_SCHEMES
                        if HASH_SCHEMES[name](1) == 0 or caps.lookahead_block_hashes)
        found = search_stale_reuse(proc, schemes)
    results = {}
    for scheme, result in found.items():
        smallest = result.pop("smallest")
        rows = result["per_config"]
        result["smallest"] = None if smallest is None else {**smallest.as_dict(),
                                                            "text": smallest.describe()}
        # The model's condition is necessary: vLLM never shows stale reuse where
        # the model says it cannot happen.  (Not asked of lookahead hashes,
        # where the model's answer is no stale reuse at all.)
        result["model_necessary"] = all(r["model_predicts_stale"] for r in rows if r["vllm_stale"])
        result["model_condition_matches"] = all(
            bool(r["vllm_stale"]) == r["model_predicts_stale"] for r in rows)
        # The condition a single-chunk writer showed (kept to show it does not match).
        result["whole_block_condition_matches"] = all(
            bool(r["vllm_stale"]) == r["model_predicts_stale_whole_blocks"] for r in rows)
        # The suggested guard against what vLLM did: it must refuse every
        # configuration with stale reuse and nothing vLLM handles safely.
        result["fix_refuses_every_stale"] = all(r["fix_rejects"] for r in rows if r["vllm_stale"])
        result["fix_refuses_safe"] = [r["config"] for r in rows if r["fix_rejects"] and not r["vllm_stale"]]
        results[scheme] = result
    try:
        derived = derivations(subject, version)
        reach = {"profiles": profiles_reaching(derived), "derivations": len(derived),
                 "fix_refuses_profiles": [d.profile for d in derived
                                          if d.coordinator_config() is not None and d.eagle_branch_live
                                          and fix_rejects(d.coordinator_config())],
                 "called": sum(bool(d.called) for d in derived)}
    except Exception as exc:  # the deployment derivation is extra evidence; say why it is missing
        reach = {"error": f"{type(exc).__name__}: {exc}"}
    return {"subject": subject.label, "vllm_version": version, "schemes": results, "reach": reach,
            "not_covered": list(caps.not_covered())}


# -- the hit-rate replay ---------------------------------------------------------

def hitrate_row(subject, label: str, config, workload, variant_name: str | None = None) -> dict[str, Any]:
    """One subject's replay, its ideal and (for a mutant) its rule's model.

    The ideal is exact only where the model's lookup is (full-attention
    layouts); with a Mamba group it leaves out how vLLM's scheduler places
    Mamba state checkpoints, so there it is shown, never used as a verdict."""
    from kvspec.model.case import Case, prefill
    from kvspec.model.variants import variant
    from kvspec.oracles.ideal_cache import SpecCache
    from kvspec.oracles.lookup import exact_lookup_applies
    from kvspec.subjects.drivers.hitrate import SubjectCache, replay
    from kvspec.subjects.process import SubjectProcess

    with SubjectProcess(subject) as proc:
        cache = SubjectCache(proc, config, workload)
        observed = replay(workload, cache)
        version = proc.identity.get("vllm_version")
    ideal = replay(workload, SpecCache(config, cache.regime))
    model = None
    if variant_name is not None:
        model = replay(workload, SpecCache(config, cache.regime, variant(variant_name).rule,
                                           f"model of {variant_name}"))

    return {
        "label": label, "vllm_version": version, "subject": subject.as_dict(),
        "mutant": variant_name is not None,
        "scheduler_block_size": config.scheduler_block_size,
        "ideal_exact": exact_lookup_applies(Case(config, 1, (prefill(1),))),
        **{k: v for k, v in observed.as_dict().items() if k != "backend"},
        "per_turn": [round(r, 6) for r in observed.per_turn()],
        "ideal_hit_rate": round(ideal.hit_rate, 6), "ideal_hits": [o.hit for o in ideal.outcomes],
        "ideal_per_turn": [round(r, 6) for r in ideal.per_turn()],
        "model_rule": variant_name or "spec",
        "model_hit_rate": round((model or ideal).hit_rate, 6),
        "model_matches_per_request": observed.as_dict()["hits"] == [o.hit for o in (model or ideal).outcomes],
        "prompt_lengths": [o.prompt_tokens for o in observed.outcomes],
        "turns": [o.turn for o in observed.outcomes],
    }


def compare_with_reference(rows: list[dict[str, Any]]) -> None:
    """Give every row its reference and what it loses against it: the spec's
    ideal where that is exact, else (a Mamba layout) the unmodified release
    the mutant was made from, replayed at the same scheduler block."""
    releases = {(r["vllm_version"], r["scheduler_block_size"]): r for r in rows if not r["mutant"]}
    for row in rows:
        if row["ideal_exact"]:
            ref_label, ref_hits, ref_rate, ref_turns = ("spec ideal", row["ideal_hits"], row["ideal_hit_rate"],
                                                        row["ideal_per_turn"])
        elif row["mutant"] and (row["vllm_version"], row["scheduler_block_size"]) in releases:
            base = releases[(row["vllm_version"], row["scheduler_block_size"])]
            ref_label, ref_hits, ref_rate, ref_turns = (base["label"], base["hits"], base["hit_rate"],
                                                        base["per_turn"])
        else:
            row["reference"] = None  # a release on a Mamba layout: nothing exact to hold it to
            continue
        differing = [(i, h, r) for i, (h, r) in enumerate(zip(row["hits"], ref_hits)) if h != r]
        first = None
        if differing:
            i, h, r = differing[0]
            first = {"request": i, "turn": row["turns"][i], "prompt_tokens": row["prompt_lengths"][i],
                     "reference_hit": r, "observed_hit": h}
        row["reference"] = {"label": ref_label, "hit_rate": ref_rate, "per_turn": ref_turns,
                            "points": round(100 * (row["hit_rate"] - ref_rate), 3),
                            "requests_differing": len(differing),
                            "hit_tokens_lost": sum(r - h for _, h, r in differing),
                            "first_difference": first}


# -- an upstream bug report -------------------------------------------------------

@attrs.frozen
class UpstreamReport:
    markdown: str
    reproduced: bool

    @property
    def outcome(self) -> Outcome:
        # A report without a working reproduction is written but is not what was asked.
        return Outcome.OK if self.reproduced else Outcome.INCOMPLETE


def upstream_report(finding, *, say: Say = _print) -> UpstreamReport:
    """A vLLM bug report for an engine finding on a published release: the
    standalone script written from the finding's validated program, run in a
    fresh process on the release before it is offered.  A finding kvspec
    writes no script for is a ``UsageError`` (exit 2), said before anything runs."""
    from kvspec.model.engine import EngineProgram
    from kvspec.model.known import known_bugs
    from kvspec.report.upstream import render_upstream
    from kvspec.subjects.upstream_repro import repro_script, run_repro

    program = finding.inputs.get("engine_program") if isinstance(finding.inputs, dict) else None
    if finding.source != "fuzz" or not isinstance(program, dict):
        raise UsageError("kvspec report --upstream is for engine findings (kvspec fuzz --engine): this one has no "
                         "engine program")
    subject = finding.compared.get("subject") or {}
    version = subject.get("version") if subject.get("kind") == "release" else None
    if not isinstance(version, str):
        raise UsageError("kvspec report --upstream is for a finding on a published release (kvspec fuzz --vllm X.Y.Z)")
    script = repro_script(EngineProgram.from_dict(program), (finding.run or {}).get("engine_settings"),
                          finding.category, version)
    matching = known_bugs(version, finding.category, finding.detail)
    known = matching[0] if matching else None
    error = str((finding.observations or {}).get("error") or "")
    # Only the exception's class name is compared, and only when it is a plain name.
    crash = re.match(r"([A-Za-z_][A-Za-z0-9_]*)(?::|$)", error)
    say(f"kvspec report --upstream: running the reproduction in a fresh process on vLLM {version}")
    run = run_repro(script, crash.group(1) if crash else None)
    say(f"kvspec report --upstream: the script {'reproduced' if run.reproduced else 'did NOT reproduce'} "
        f"(exit status {run.returncode}, {run.seconds:.1f} s)")
    return UpstreamReport(render_upstream(finding, known=known, script=script, run=run), run.reproduced)
