"""A stateful, registration or lookup finding, reproduced through vLLM's engine -- or labelled hand-built only.

The stateful differential (``diff_tests/stateful.py``) is the fast inner
level: it drives a ``KVCacheManager`` on a ``KVCacheConfig`` kvspec built by
hand, with kvspec's replica of the scheduler's step.  Each of its findings
is then looked for through the engine (``diff_tests/engine.py``: vLLM's real
``Scheduler`` on a configuration the release's own code built from engine
flags), within a fixed, deterministic budget:

1. the program translated to engine inputs on each of the nearest engine
   configurations (``model/nearest_engine.py``) and replayed; an eviction
   becomes a load kvspec's connector fails (a setup with that connector);
   a preemption, which the engine takes as no input, is made by pool
   pressure: a request holding blocks beside the preempted one on a pool of
   one model-length request, driven until vLLM's scheduler preempts it,
   then aborted, and the rest of the program replayed (``_under_pressure``);
2. if none shows the finding's mechanism, a targeted search: the engine
   machine's own rules over those configurations only, ``SEARCH_EXAMPLES``
   programs from seed ``SEARCH_SEED``, no example database, no shrinking.

The mechanism is the finding's: the same invariant category, in a group of
the same kind where the finding names one (for a crash, the same exception
type).  A program that shows it is replayed once more on a fresh engine
before kvspec says "reachable through vLLM's scheduler"; otherwise the
finding is hand-built only, and the budget and the configurations searched
are said with it.  A reproduction that could not run (the worker failed) is
said to be unknown, never "not reproduced".

A registration finding (under- or over-registration, a block mismatch: a
case of one request on a hand-built geometry) takes the same path
(``reproduce_case_through_engine``): its case as a stateful program, the
same configurations, translation and search: the engine differential holds
every ``cache_blocks`` call the real Scheduler makes to the registration
bound as the registration differential holds its own
(``oracles.registration.RegistrationBound``, on layouts of two or more
groups with prefix caching on: the hybrid coordinator's bound), so a
registration finding's mechanism is met as any other.  A lookup finding
(a later request's hit breaking the lookup contract, or not the exact hit:
``oracles/lookup.py``) takes it too: its case's later request is the
program's second arrival, and every lookup the real Scheduler makes is held
to the lookup rules of ``model.state`` (``model.nearest_engine.ENGINE_FORMS``
says which rule is the engine's form of which lookup category).
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import attrs
from hypothesis import Phase, strategies as st

from kvspec.model.engine import EngineProgram, EngineSetup
from kvspec.model.errors import InfrastructureError, KvspecError
from kvspec.model.finding import Category
from kvspec.model.known import recognise
from kvspec.model.outcome import Outcome
from kvspec.model.nearest_engine import (MAX_MODEL_LEN, Target, after_preemption, mechanism_kind,
                                         nearest_setups, pressure_pool, pressure_trial, program_of_case, scale_for,
                                         translate)
from kvspec.model.program import Program
from kvspec.oracles.registration import Discrepancy, RegistrationBound
from kvspec.subjects.process import SubjectProcess

from .engine import EngineResult, drive_engine_program, engine_machine
from .property import Failure, known_of
from .stateful import _exception, _machine_test, run_machine_test

__all__ = ["SEARCH_EXAMPLES", "SEARCH_SEED", "SEARCH_STEPS", "REGISTRATION", "RegistrationBound", "Reproduction", "target_of",
           "targeted_search", "reproduce_through_engine", "reproduce_case_through_engine", "budget_text"]

SEARCH_EXAMPLES = 40  # engine programs of the targeted search
SEARCH_SEED = 0
SEARCH_STEPS = 40  # rules a program, as the engine differential's
# The registration differential's categories: looked for through the engine by
# holding every cache_blocks call the scheduler makes to the registration bound.
REGISTRATION = (Category.UNDER_REGISTRATION.value, Category.OVER_REGISTRATION.value, Category.BLOCK_MISMATCH.value)
# A preemption translated under pool pressure (model.nearest_engine.pressure_trial):
# the pressure request's prompt lengths tried, and the pools tried above the
# pressure pool when vLLM refuses it.
PRESSURE_FILLERS = (1, 24)
PRESSURE_POOL_TRIES = 3


def budget_text(translated: int, search: str = "ran") -> str:
    """What ran: ``search`` "ran", "not needed" (a translation showed it) or "none built"."""
    text = f"{translated} translated program(s) replayed"
    if search == "ran":
        return (f"{text} and a targeted engine search of {SEARCH_EXAMPLES} programs (seed {SEARCH_SEED}, at most "
                f"{SEARCH_STEPS} rules each, no shrinking)")
    if search == "none built":
        return f"{text} and no search (vLLM's configuration code built none of the configurations)"
    return text


@attrs.frozen
class Reproduction:
    """What the engine showed of a stateful finding."""

    status: str  # "reproduced", "not reproduced" or "unknown" (the search did not run to its end)
    target: Target
    configurations: tuple[str, ...]  # the engine configurations searched
    budget: str
    seconds: float
    program: EngineProgram | None = None  # the engine program that shows it (reproduced only)
    how: str = ""  # "translated" (the finding's own operations) or "search"
    settings: dict[str, Any] | None = None  # what vLLM built and ran for it
    notes: tuple[str, ...] = ()  # what the translation could not carry
    others: dict[str, int] = attrs.Factory(dict)  # other mechanisms met on the way (not the finding's)
    error: str = ""
    search: str = "not needed"  # the targeted search: "ran", "not needed" or "none built"

    @property
    def summary(self) -> str:
        if self.status == "reproduced":
            assert self.program is not None
            setup = self.program.setup
            how = {"translated": "its own operations translated to engine inputs",
                   "pressure": "its own operations translated to engine inputs, its preemption made by pool "
                               "pressure (a request holding blocks beside it until vLLM's scheduler preempted it)",
                   }.get(self.how, "a targeted engine search")
            return (f"reachable through vLLM's scheduler with settings `{setup.cli_flags() or 'the release defaults'}` "
                    f"on {setup.model} (a toy model of {setup.toy.family}; the engine's other settings are the "
                    f"release's defaults): the same mechanism ({self.target.describe()}) shown by {how} and "
                    f"again on replay through the real Scheduler")
        searched = "; ".join(self.configurations) or "none"
        if self.status == "unknown":
            return (f"hand-built; reachability through vLLM's scheduler unknown: the engine reproduction did not "
                    f"run to its end ({self.error}); searched so far: {searched}")
        text = (f"hand-built only: not reproduced through the engine in {self.budget} (searched: {searched}; "
                f"mechanism sought: {self.target.describe()})")
        if self.others:
            text += "; other mechanisms met on the way: " + ", ".join(f"{k} x{n}" for k, n in sorted(self.others.items()))
        return text

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "summary": self.summary, "target": attrs.asdict(self.target),
                "configurations": list(self.configurations), "budget": self.budget,
                "search": {"examples": SEARCH_EXAMPLES, "seed": SEARCH_SEED, "steps": SEARCH_STEPS,
                           "ran": self.search == "ran"},
                "seconds": round(self.seconds, 2), "how": self.how or None,
                "engine_program": None if self.program is None else self.program.as_dict(),
                "describe": None if self.program is None else self.program.describe(),
                "cli_flags": None if self.program is None else self.program.setup.cli_flags(),
                "engine_settings": self.settings, "notes": list(self.notes), "others": dict(self.others),
                "error": self.error or None}


def target_of(program: Program, found: Discrepancy, reply: dict[str, Any]) -> Target:
    """The finding's mechanism: its category, the kind of the group it names, a crash's exception."""
    kinds = [g.kind.value for g in program.config.groups]
    exception = _exception(reply) if found.category is Category.SUBJECT_CRASH else None
    return Target(found.category.value, mechanism_kind(found, kinds), exception)


def _matches(target: Target, found: list[Discrepancy] | tuple[Discrepancy, ...], answer: dict[str, Any],
             derived: dict[str, Any]) -> bool:
    if not found or not target.shown_by(found[0].category.value):
        return False
    first = found[0]
    if target.exception is not None and _exception(answer) != target.exception:
        return False
    if target.kind is not None:
        kinds = [g["kind"] for g in derived.get("groups", ())]
        return mechanism_kind(first, kinds) == target.kind
    return True


def _replay(proc: SubjectProcess, program: EngineProgram, target: Target, known) -> tuple[bool, str | None,
                                                                                         dict[str, Any] | None]:
    """Replay ``program``: whether it shows the target (not a known vLLM bug),
    the category it showed otherwise, and what vLLM built (None: refused)."""
    derived = None
    records = drive_engine_program(proc, program)
    try:
        first = next(records)
    except InfrastructureError as error:
        if str(error).startswith("this subject cannot build the engine"):
            return False, None, None  # a flag this release does not take: not an engine it runs
        raise
    for record in itertools.chain([first], records):
        if record.op["do"] == "open":
            if record.found:
                return False, None, None  # vLLM's configuration code refused these flags: not an engine it runs
            derived = record.reply.payload.derived
            continue
        if record.found:
            if recognise(known, record.found) is not None:
                return False, None, derived
            return _matches(target, record.found, record.record, derived or {}), record.found[0].category.value, derived
    return False, None, derived


def _preempted_at(proc: SubjectProcess, trial: EngineProgram, victim: str) -> int | None:
    """The index of the trial's operation whose ``schedule()`` preempted
    ``victim`` (None: none did, or vLLM did not build the engine)."""
    index = -1
    for record in drive_engine_program(proc, trial, through=True):
        if record.op["do"] == "open":
            if record.found:
                return None
            continue
        index += 1
        scheduled = record.answer.scheduled if record.answer is not None else None
        if scheduled is not None and victim in scheduled.result.preempted:
            return index
    return None


def _under_pressure(proc: SubjectProcess, program: Program, setup: EngineSetup, derived: dict[str, Any],
                    target: Target, known, others: dict[str, int]) -> tuple[int, EngineProgram | None, str]:
    """The program's first preemption made by pool pressure on ``setup``'s
    layout (``model.nearest_engine.pressure_trial``): for each pressure
    request's length, the pool of one model-length request (or the next
    vLLM builds), the trial driven until vLLM preempts the request, then the
    rest of the program replayed.  Returns the programs driven, the one that
    showed the target (None: none), and what the pressure did."""
    scale = scale_for(program, setup)
    translated, _ = translate(program, setup, scale)
    driven = 0
    preempted = 0
    for filler in PRESSURE_FILLERS:
        base = pressure_pool(derived)
        for pool in range(base, base + PRESSURE_POOL_TRIES):
            pressured = attrs.evolve(translated, setup=attrs.evolve(setup, num_gpu_blocks=pool))
            made = pressure_trial(program, pressured, filler, MAX_MODEL_LEN + 16)
            if made is None:
                return driven, None, "no preemption"
            trial, rest, victim = made
            try:
                driven += 1
                at = _preempted_at(proc, trial, victim)
            except InfrastructureError as error:
                if str(error).startswith("this subject cannot build the engine"):
                    return driven, None, "not built"
                raise
            if at is None:
                continue  # not preempted (or this pool not built): the next pool
            preempted += 1
            candidate = after_preemption(trial, at, rest)
            driven += 1
            shown, other, _ = _replay(proc, candidate, target, known)
            if shown:
                return driven, candidate, f"{victim} preempted"
            if other is not None:
                others[other] = others.get(other, 0) + 1
            break
    return driven, None, f"the request preempted in {preempted} of {len(PRESSURE_FILLERS)} pressure trial(s)"


def targeted_search(proc: SubjectProcess, setups: list[EngineSetup], target: Target, known,
                    others: dict[str, int], shows=None) -> tuple[EngineProgram | None, dict[str, Any] | None]:
    """The engine machine over ``setups`` only: the first program that shows
    the target (``shows(found, reply, derived)``: default, the target's
    mechanism), or None."""
    shows = shows or (lambda found, reply, derived: _matches(target, found, reply, derived))
    result = EngineResult(subject=proc.describe(), capabilities=proc.capabilities, seed=SEARCH_SEED)
    failures: list[Failure] = []
    machine = engine_machine(proc, lambda machine, refused=None: None, failures.append, known,
                             setups=st.sampled_from(setups))

    class Targeted(machine):  # type: ignore[valid-type, misc]
        def _fail(self, found, reply):
            if recognise(known, found) is None and not shows(found, reply, self.derived):
                # Another mechanism: counted, the program ends there, the search goes on.
                key = found[0].category.value
                others[key] = others.get(key, 0) + 1
                self.inert = True
                return
            super()._fail(found, reply)

    test = _machine_test(Targeted, proc, SEARCH_EXAMPLES, SEARCH_SEED, SEARCH_STEPS, None,
                         [Phase.explicit, Phase.generate], key=b"kvspec-reproduce")
    run_machine_test(test, result, failures)
    if result.stopped is Outcome.INTERRUPTED:
        raise KeyboardInterrupt
    if result.stopped is not None:
        raise _Stopped(result.stopped_why)
    if result.failure is None:
        return None, None
    return result.failure.case, result.failure.reply.get("derived")


class _Stopped(Exception):
    pass


def reproduce_through_engine(proc: SubjectProcess, program: Program, found: Discrepancy,
                             reply: dict[str, Any]) -> Reproduction:
    """Look for the stateful finding (its program, its first discrepancy and
    the answer it came in) through vLLM's engine, within the fixed budget."""
    return _reproduce(proc, program, target_of(program, found, reply), found)


def reproduce_case_through_engine(proc: SubjectProcess, case, found: Discrepancy,
                                  exception: str | None = None) -> Reproduction:
    """Look for a registration or lookup finding (its minimal case and its
    first discrepancy) through vLLM's engine the same way: the case as a
    stateful program (``model.nearest_engine.program_of_case``), the same
    nearest configurations, translation and targeted search, every
    ``cache_blocks`` call the scheduler makes held to the registration bound
    (a registration finding) and every lookup to the state's lookup rules;
    the same mechanism is the same category (for a lookup finding, its engine
    form: ``Target.shown_by``) in a group of the same kind (for a crash,
    ``exception``: the same exception type)."""
    program = program_of_case(case)
    kinds = [g.kind.value for g in case.config.groups]
    return _reproduce(proc, program, Target(found.category.value, mechanism_kind(found, kinds), exception), found)


def _reproduce(proc: SubjectProcess, program: Program, target: Target, found: Discrepancy) -> Reproduction:
    started = time.perf_counter()
    setups, notes = nearest_setups(program, plain=target.kind is None)
    # The release's known bugs are passed over on the way, except the one the
    # finding is (a run with --include-known reports it), under each of its
    # entries (one bug seen by two differentials has one summary): that one is sought.
    carried = known_of(proc)
    itself = {b.summary for b in carried if recognise((b,), [found]) is not None}
    known = tuple(b for b in carried if b.summary not in itself)
    others: dict[str, int] = {}
    searched: list[str] = []
    buildable: list[EngineSetup] = []
    translation_notes: set[str] = set()
    pressure_notes: list[str] = []

    def done(status: str, **kw) -> Reproduction:
        return Reproduction(status, target, tuple(searched), budget_text(translated, search),
                            time.perf_counter() - started,
                            notes=tuple(notes) + tuple(sorted(translation_notes))
                            + tuple(f"preemption under pool pressure: {n}" for n in pressure_notes),
                            others=dict(others),
                            search=search, **kw)

    translated = 0
    search = "not needed"
    try:
        for setup in setups:
            # The tokens as they were, then each stretched to the engine's block (the same blocks covered).
            for scale in sorted({1, scale_for(program, setup)}):
                engine_program, dropped = translate(program, setup, scale)
                translation_notes.update(f"not translated: {d}" for d in dropped)
                translated += 1
                shown, other, derived = _replay(proc, engine_program, target, known)
                if derived is None:
                    break
                if shown:
                    again, _, settings = _replay(proc, engine_program, target, known)
                    if again:
                        searched.append(setup.describe())
                        return done("reproduced", program=engine_program, how="translated", settings=settings)
                elif other is not None:
                    others[other] = others.get(other, 0) + 1
            if derived is None:
                searched.append(f"{setup.describe()} (not built: vLLM's configuration code refused it or this "
                                "release does not take a flag of it)")
                continue
            searched.append(setup.describe())
            buildable.append(setup)
            if any(op["do"] == "preempt" for op in program.ops) and setup.kv_connector is None:
                driven, candidate, pressure = _under_pressure(proc, program, setup, derived, target, known, others)
                translated += driven
                pressure_notes.append(f"{setup.model}: {pressure}")
                if candidate is not None:
                    again, _, settings = _replay(proc, candidate, target, known)
                    if again:
                        return done("reproduced", program=candidate, how="pressure", settings=settings)
        search = "ran" if buildable else "none built"
        if buildable:
            candidate, _ = targeted_search(proc, buildable, target, known, others)
            if candidate is not None:
                again, _, settings = _replay(proc, candidate, target, known)
                if again:
                    return done("reproduced", program=candidate, how="search", settings=settings)
                others["shown once, not again on replay"] = others.get("shown once, not again on replay", 0) + 1
    except (KvspecError, _Stopped) as error:
        return done("unknown", error=f"{type(error).__name__}: {error}")
    return done("not reproduced")
