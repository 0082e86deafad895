"""Differential fuzzing of one subject with Hypothesis: the engine behind
``kvspec fuzz`` (the pytest properties run the same body, ``diff_tests.property``)."""

from __future__ import annotations

import time
from typing import Any, Callable

import attrs
from hypothesis import HealthCheck, Phase, Verbosity, given, seed as hypothesis_seed, settings
from hypothesis.database import ExampleDatabase
from hypothesis.errors import Flaky

from kvspec.model.capabilities import Capabilities
from kvspec.model.case import Case
from kvspec.model.errors import KvspecError, UsageError
from kvspec.model.known import known_bugs
from kvspec.model.outcome import Outcome
from kvspec.oracles.lookup import check_case
from kvspec.subjects.process import SubjectProcess
from kvspec.model.requests import Run

from .property import Failure, Tally, run_recognising
from .reduce import reduce_case
from .hypothesis_compat import set_database_key, shrink_budget
from .seeding import fixed_constant_pool
from .strategies import batches, deployment_configs, hash_schemes_of, lookup_batches

__all__ = ["Failure", "FuzzResult", "fuzz_subject", "database_key", "interrupt_behind"]


@attrs.define
class FuzzResult:
    subject: dict[str, Any]
    capabilities: Capabilities
    seed: int
    tally: Tally = attrs.Factory(Tally)
    seconds: float = 0.0
    failure: Failure | None = None
    cases_to_first_failure: int | None = None
    seconds_to_first_failure: float | None = None
    jobs: int = 1  # parallel runs merged into this result (diff_tests/parallel.py)
    other_failures: tuple[Failure, ...] = ()  # distinct from `failure`, found by other jobs
    lookup: bool = False  # cases carry a later request's lookup (the hit-length differential)
    # The hash schemes fuzzed, and those the subject has that were left out
    # (by --hash-scheme, or because a differential models only one): every
    # verdict says under which it holds.
    hash_schemes: tuple[str, ...] = ("legacy",)
    schemes_left_out: tuple[str, ...] = ()
    # The schemes left out because --hash-scheme asked for fewer (not because
    # a differential models only one): the verdict says so in every format.
    narrowed: bool = False
    # Deployment profiles drawn from (their coordinator configurations), and
    # why there are none when there are none.
    deployment_configs: int = 0
    deployments_note: str = ""
    restarts: tuple[str, ...] = ()  # worker restarts a retry did not reproduce (the machine's)
    # Why the run ended before its budget (an infrastructure error, an
    # interrupt), None when it ran in full; ``failure`` then holds what was
    # found, unshrunk.
    stopped: Outcome | None = None
    stopped_why: str = ""
    # What the tree lacks against the release it claims to be, and so was
    # not fuzzed ("" when the scope is whole).
    scope_reduction: str = ""
    # The shrinking budget (SHRINK_CASE_RUNS), when it was spent: the failing
    # batch reported is the smallest found within it.
    shrink_budget: int | None = None

    units = "cases"  # what `cases` counts, in a progress or rate line

    @property
    def differential(self) -> str:
        return "lookup" if self.lookup else "registration"

    @property
    def examples(self) -> int:
        return self.tally.examples

    def coverage(self) -> str:
        """What the run exercised, in words."""
        return (f"{self.cases} differential cases ({self.examples} Hypothesis examples, {self.calls} "
                f"cache_blocks calls{f', {self.tally.lookups} later-request lookups' if self.lookup else ''})")

    def first_failure(self) -> str | None:
        """How far in the first discrepancy came (None: none came)."""
        return None if self.cases_to_first_failure is None else f"{self.cases_to_first_failure} cases"

    @property
    def cases(self) -> int:
        return self.tally.cases

    @property
    def calls(self) -> int:
        return self.tally.calls

    @property
    def outcome(self) -> Outcome:
        if self.failure is not None:
            return Outcome.FINDING
        if self.stopped is not None:
            return self.stopped
        return Outcome.INCOMPLETE if self.scope_reduction else Outcome.OK

    @property
    def verdict(self) -> str:
        if self.failure is not None:
            return "discrepancy"
        if self.stopped is not None:
            return f"incomplete ({self.stopped_why})"
        if self.scope_reduction:
            return f"no discrepancy in a reduced scope ({self.scope_reduction})"
        verdict = "no discrepancy"
        if self.known_met:
            met = ", ".join(f"{name} in {n} example(s)" for name, n in sorted(self.known_met.items()))
            verdict += f" but known vLLM bugs (model/known.py), met and recognised: {met}"
        if self.narrowed:  # the command asked for fewer schemes than the subject has: said in every format
            verdict += f", {self.scheme_text}"
        return verdict

    def as_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "capabilities": self.capabilities.as_dict(),
            "seed": self.seed,
            "examples": self.examples,
            "cases": self.cases,
            "cache_blocks_calls": self.calls,
            "lookups": self.tally.lookups,
            "seconds": round(self.seconds, 3),
            "cases_to_first_failure": self.cases_to_first_failure,
            "seconds_to_first_failure": None if self.seconds_to_first_failure is None
            else round(self.seconds_to_first_failure, 3),
            "verdict": self.verdict,
            "stopped": None if self.stopped is None else self.stopped.name,
            "failure": None if self.failure is None else self.failure.as_dict(),
            "jobs": self.jobs,
            "lookup": self.lookup,
            "differential": self.differential,
            "other_failures": [f.as_dict() for f in self.other_failures],
            "worker_restarts": list(self.restarts),
            "hash_schemes": {"fuzzed": list(self.hash_schemes), "left_out": list(self.schemes_left_out),
                             "lookahead_cases": self.tally.lookahead_cases,
                             "legacy_cases": self.tally.cases - self.tally.lookahead_cases,
                             "eagle_branch_exercised": "legacy" in self.hash_schemes},
            "deployments": {"configs": self.deployment_configs, "cases": self.tally.deployment_cases,
                            "note": self.deployments_note},
            "not_covered": list(self.capabilities.not_covered()),
            "known_met": dict(self.known_met), "known_first": dict(self.known_first),
            "scope_reduction": self.scope_reduction or None,
            "narrowed": self.scheme_text if self.narrowed else None,
        }

    @property
    def known_met(self) -> dict[str, int]:
        """Known vLLM bugs met and recognised by their mechanism (model.known):
        name -> examples that met it (each ended there)."""
        return self.tally.known_met

    @property
    def known_first(self) -> dict[str, str]:
        """Where each known bug met was met first (a case, described)."""
        return self.tally.known_first

    @property
    def scheme_text(self) -> str:
        """Under which hash schemes this result holds, in words."""
        t = self.tally
        text = (f"hash schemes: legacy {t.cases - t.lookahead_cases} cases, lookahead {t.lookahead_cases}"
                if "lookahead" in self.hash_schemes else "legacy hashes only (this subject has no others)"
                if not self.schemes_left_out else "legacy hashes only")
        if "lookahead" in self.schemes_left_out:
            text += "; lookahead hashes (the default deployment of this release) NOT fuzzed"
        if "legacy" in self.schemes_left_out:
            text += ("; legacy hashes NOT fuzzed: the EAGLE branch of the bound never ran (it runs only with "
                     "legacy hashes: a KV connector without lookahead support, disable_lookahead_block_hashes)")
        return text


class _CaseFailed(AssertionError):
    """A case disagreed with the spec: Hypothesis shrinks it (any other
    AssertionError is not a finding)."""


def interrupt_behind(error: BaseException | None) -> bool:
    """Whether a keyboard interrupt is behind ``error``: one that lands early
    in Hypothesis's engine comes out as an AssertionError of Hypothesis's own,
    the interrupt as its context."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


class _Abort(BaseException):
    """Ends a Hypothesis run at once: Hypothesis treats an ``Exception`` from
    the test as a failing input and would shrink it, rerunning the cause."""

    def __init__(self, error: KvspecError):
        super().__init__(str(error))
        self.error = error


def fuzz_subject(
    proc: SubjectProcess,
    max_examples: int,
    seed: int,
    database: ExampleDatabase | None = None,
    progress: Callable[[int, float], None] | None = None,
    stop_at_first: bool = False,
    on_first_failure: Callable[["FuzzResult"], None] | None = None,
    lookup: bool = False,
    hash_schemes: tuple[str, ...] | None = None,
    deployments: bool = True,
    include_known: bool = False,
) -> FuzzResult:
    """Fuzz one live subject; the returned failure is Hypothesis's shrunk minimum.

    With ``lookup``, every request is followed by a later request that looks
    up (``oracles.lookup``): the hit-length differential.  ``hash_schemes``
    narrows the schemes fuzzed (default: every one the subject has);
    ``deployments`` adds the catalog's deployment profiles to the small scope.
    A known vLLM bug the release carries is recognised when an example meets
    it (counted, said, the search going on), unless ``include_known``."""
    caps = proc.capabilities
    available = hash_schemes_of(caps)
    schemes = hash_schemes_of(caps, hash_schemes)
    left_out = tuple(s for s in available if s not in schemes)
    narrowed = bool(left_out)
    if lookup and "lookahead" in schemes:
        # The lookup model describes legacy hashes (a hit needs whole hash
        # blocks of shared tokens, not L more): lookahead lookups are not judged.
        schemes = tuple(s for s in schemes if s != "lookahead")
        left_out += ("lookahead",)
    if not schemes:
        raise UsageError(f"none of the hash schemes {hash_schemes} can be fuzzed on this subject "
                         f"(it has {', '.join(available)})")
    configs = deployment_configs(proc.identity.get("vllm_version"), schemes) if deployments and not lookup else ()
    note = ("" if configs else "the hit-length differential draws the small scope only" if lookup
            else "not asked for" if not deployments
            else "no deployment profile is derived for this release (kvspec derives them from 0.28)")
    result = FuzzResult(subject=proc.describe(), capabilities=caps, seed=seed, lookup=lookup,
                        hash_schemes=schemes, schemes_left_out=left_out, narrowed=narrowed,
                        deployment_configs=len(configs),
                        deployments_note=note, scope_reduction=proc.scope_reduction)
    restarts_before = len(proc.restarts)
    failures: list[Failure] = []
    known = () if include_known else tuple(known_bugs(result.subject.get("vllm_version")))
    start = time.perf_counter()

    phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
    if not stop_at_first:
        phases.append(Phase.shrink)

    # @settings goes outside @seed: @seed alone turns the database off, and a
    # seeded run must still replay (and save) the failures of earlier runs.
    @settings(
        max_examples=max_examples, deadline=None, database=database, verbosity=Verbosity.quiet,
        suppress_health_check=list(HealthCheck), phases=phases, report_multiple_bugs=False,
    )
    @hypothesis_seed(seed)
    @given(batch=lookup_batches(caps) if lookup else batches(caps, hash_schemes=schemes, deployments=configs))
    def differential(batch: tuple[Case, ...]) -> None:
        if progress is not None and result.tally.examples % 100 == 99:
            progress(result.tally.cases, time.perf_counter() - start)
        try:
            # A known bug met ends its example at that case, unsaid to
            # Hypothesis, counted in the tally: the search goes on.
            failed = run_recognising(proc, batch, result.tally, known)
        except KvspecError as error:  # the worker, not vLLM: no input is to blame
            raise _Abort(error) from error
        if failed is not None:
            failures.append(failed)  # first: an interrupt from here on keeps it
            if result.cases_to_first_failure is None:
                # Counting stops at the failing case, so this includes it.
                result.cases_to_first_failure = result.tally.cases
                result.seconds_to_first_failure = time.perf_counter() - start
                if on_first_failure is not None:
                    on_first_failure(result)
            raise _CaseFailed(failed.discrepancies[0].summary())

    # The database is keyed by subject and differential. Hypothesis deletes a
    # saved failure that passes when replayed, so with one key for all, fuzzing
    # a correct release erased what a mutant or a PR tree had saved.
    set_database_key(differential.hypothesis.inner_test, database_key(proc.subject.label, lookup))
    budget = None
    try:
        with fixed_constant_pool(), shrink_budget(SHRINK_CASE_RUNS) as budget:
            differential()
    except _CaseFailed:
        # Hypothesis replays its minimal failing batch last.
        result.failure = failures[-1]
    except Flaky:
        result.failure = attrs.evolve(failures[-1], flaky=True) if failures else None
    except _Abort as abort:
        result.stopped, result.stopped_why = abort.error.outcome, str(abort.error)
        result.failure = failures[-1] if failures else None
    except KeyboardInterrupt:
        result.stopped, result.stopped_why = Outcome.INTERRUPTED, "interrupted"
        result.failure = failures[-1] if failures else None
    except Exception as error:
        if not interrupt_behind(error):
            raise
        result.stopped, result.stopped_why = Outcome.INTERRUPTED, "interrupted"
        result.failure = failures[-1] if failures else None
    else:
        if failures:  # met, then not reported (its replay passed): a flaky finding, never a clean run
            result.failure = attrs.evolve(failures[0], flaky=True)
    finally:
        if budget is not None and budget.exhausted:
            result.shrink_budget = budget.runs
    if result.failure is not None and not stop_at_first and result.stopped is None:
        try:
            result.failure = _minimise(proc, caps, result.failure)
        except KeyboardInterrupt:
            result.stopped, result.stopped_why = Outcome.INTERRUPTED, "interrupted while minimising"
        except KvspecError as error:
            result.stopped, result.stopped_why = error.outcome, f"while minimising: {error}"
    result.seconds = time.perf_counter() - start
    result.restarts = tuple(proc.restarts[restarts_before:])
    return result


# Test runs Hypothesis may spend shrinking a failing batch: a count where its
# own limit is five minutes of the clock.  The mutants' failures shrink in 8-258
# (0.33.0/0.34.0, 2,000 examples, seed 0), so it binds only on a pathological one.
SHRINK_CASE_RUNS = 2000


def database_key(subject_label: str, lookup: bool) -> bytes:
    """What sets a subject's saved failures apart in the example database."""
    return f"{subject_label}|{'lookup' if lookup else 'registration'}".encode()


def _minimise(proc: SubjectProcess, caps: Capabilities, failure: Failure) -> Failure:
    category = failure.category
    latest: dict[str, Any] = {}

    def still_fails(case: Case) -> bool:
        reply = proc.run(Run.of(case))
        found = check_case(case, caps, reply)
        if found and found[0].category == category:
            latest[case] = (tuple(found), reply)
            return True
        return False

    smallest, _ = reduce_case(failure.case, still_fails)
    if smallest == failure.case:
        return failure
    found, reply = latest[smallest]
    return attrs.evolve(failure, case=smallest, discrepancies=found, reply=reply)
