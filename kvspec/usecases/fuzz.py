"""``kvspec fuzz``'s use case: the differentials on each subject in its own worker.

A fuzz run is recorded as it happens: ``FuzzRun`` holds every subject's
result and finding the moment it exists, and the ``on_update`` callback
(the command writes its JSON and Markdown there) is called after each one.
An error or an interrupt ends the run with what it has and an explicit
status, never a clean verdict.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import attrs

from kvspec.model.errors import KvspecError, UsageError
from kvspec.model.outcome import Outcome, RunStatus, worst
from kvspec.usecases import Say, print_line

__all__ = ["DIFFERENTIALS", "ALL_DIFFERENTIALS", "PROGRAM_DIFFERENTIALS", "FuzzSettings", "SubjectRun", "FuzzRun",
           "fuzz"]

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
    jobs: int = 1  # the jobs that fuzzed it (a program differential's: one)

    @property
    def drives_programs(self) -> bool:
        """A differential of programs on one live worker (never split into jobs)."""
        return self.differential in PROGRAM_DIFFERENTIALS


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
        # A reduced scope stays in the outcome beside a finding that ranks
        # below it (hardening): what was not searched is never less urgent.
        parts += [Outcome.INCOMPLETE for _ in self.reductions]
        parts += [Outcome.USAGE for _ in self.errors]
        if self.stopped is not None:
            parts.append(self.stopped)
        return worst(parts)

    @property
    def status(self) -> RunStatus:
        """The run's state in a word or two, first in every report of it."""
        if self.stopped is Outcome.INTERRUPTED:
            return RunStatus.INTERRUPTED
        if self.stopped is not None:
            return RunStatus.INCOMPLETE
        if self.reductions:
            return RunStatus.REDUCED_SCOPE
        return RunStatus.COMPLETE

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
         on_update: Callable[[FuzzRun], None] = lambda run: None, say: Say = print_line,
         started: float | None = None, on_finding: Callable | None = None,
         on_result: Callable[[SubjectRun], None] | None = None) -> FuzzRun:
    """Fuzz each subject in its own worker; the run is handed to ``on_update``
    after every subject and finding.  A setup error of one subject is
    recorded and the next one fuzzed; an infrastructure error or an interrupt
    stops the run (status INCOMPLETE or INTERRUPTED), keeping what was found.

    With one job, workers start ahead: the next one while the current one
    is fuzzed, so vLLM's import time overlaps other work.  ``on_finding``
    (the command passes ``kvspec.reach.attach``) completes each finding with
    who it reaches, while its subject is still live; the finding is stored again.
    ``on_result`` receives each subject's result as it is done (by default its
    lines, ``kvspec.report.fuzz.subject_run_lines``, are said)."""
    from kvspec.diff_tests.database import example_database
    from kvspec.diff_tests.parallel import fuzz_parallel
    from kvspec.model.about import versions
    from kvspec.findings.completion import store_finding

    if on_result is None:
        from kvspec.report.fuzz import subject_run_lines

        def on_result(entry: SubjectRun) -> None:
            for line in subject_run_lines(entry):
                say(line)

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
                    on_result(entry)
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
                                               hash_schemes=settings.hash_schemes,
                                               include_known=settings.include_known)
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
                    entry = SubjectRun(result, differential=differential,
                                       jobs=1 if differential in PROGRAM_DIFFERENTIALS else jobs)
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
                    on_result(entry)
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
        from kvspec.findings.engine import complete_engine_finding

        return complete_engine_finding(proc, result, findings_dir, versions, verify=verify)
    if differential == "stateful":
        from kvspec.findings.stateful import complete_stateful_finding

        return complete_stateful_finding(proc, result, findings_dir, versions)
    from kvspec.findings.completion import complete_finding

    return complete_finding(proc, result, findings_dir, versions, verify=verify)


def _as_found(result, differential: str, versions: dict[str, str], incomplete: str):
    """The finding of ``result`` as found, not stored, marked ``incomplete`` with why."""
    if differential == "engine":
        from kvspec.findings.engine import engine_finding

        finding = engine_finding(result, versions)
    elif differential == "stateful":
        from kvspec.findings.stateful import stateful_finding

        finding = stateful_finding(result, versions)
    else:
        from kvspec.findings.assemble import fuzz_finding

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
        from kvspec.findings.completion import store_finding

        store_finding(finding, path)
    except OSError:
        pass  # stored as found a moment ago; the run's reports say why it is incomplete
    return finding, path


def _store_raw(result, differential: str, findings_dir: Path, versions: dict[str, str]):
    if differential == "engine":
        from kvspec.findings.engine import store_raw_engine_finding

        return store_raw_engine_finding(result, findings_dir, versions)
    if differential == "stateful":
        from kvspec.findings.stateful import store_raw_stateful_finding

        return store_raw_stateful_finding(result, findings_dir, versions)
    from kvspec.findings.completion import store_raw_finding

    return store_raw_finding(result, findings_dir, versions)


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
                        hash_schemes=settings.hash_schemes, include_known=settings.include_known)


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

