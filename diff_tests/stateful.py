"""The stateful differential: Hypothesis's rule-based state machine driving
one real KVCacheManager through the scheduler's moves, every observed state
held to ``model.state``'s invariants (``oracles.state``).

The registration differential sees two numbers per request on a fresh
manager; the bugs of this code live in what many requests leave behind:
shared blocks, reference counts, the free queue, the hash map.  Here requests
share prefixes (so they hit each other's blocks), the pool is small (so
blocks are evicted and requests preempted), and the cache is reset and
blocks invalidated while requests run.  A failing program is shrunk by
Hypothesis and recorded as a ``model.program.Program``, replayable alone.
"""

from __future__ import annotations

import random
import re
import sys
import time
from typing import Any, Callable

import attrs
from hypothesis import HealthCheck, Phase, Verbosity, reject, settings, strategies as st
from hypothesis.database import ExampleDatabase
from hypothesis.errors import Flaky
from hypothesis.stateful import (RuleBasedStateMachine, get_state_machine_test, initialize, precondition,
                                 rule)

from kvspec.model.capabilities import Capabilities
from kvspec.model.domain import CoordinatorConfig, GroupKind, KVCacheGroup
from kvspec.model.errors import InfrastructureError, KvspecError, SetupError
from kvspec.model.finding import Category
from kvspec.model.known import KnownBug, count_met, known_bugs, recognise_all
from kvspec.model.outcome import Outcome
from kvspec.model.program import Program, describe_op
from kvspec.model.replies import ErrorKind, Reply, record_of
from kvspec.model.requests import MachineOps, OpenMachine
from kvspec.model.state import scope_text
from kvspec.oracles.registration import Discrepancy
from kvspec.oracles.state import StateOracle
from kvspec.subjects.process import SubjectProcess

from .fuzz import _Abort, interrupt_behind
from .property import Failure, known_of
from .reduce import reduce_program
from .hypothesis_compat import set_database_key, set_seed, shrink_budget
from .seeding import fixed_constant_pool
from .strategies import configs

if sys.version_info >= (3, 11):
    _ExceptionGroup = BaseExceptionGroup  # noqa: F821 (a builtin from 3.11)
else:  # the backport Hypothesis itself depends on before 3.11
    from exceptiongroup import BaseExceptionGroup as _ExceptionGroup

__all__ = ["StatefulResult", "StatefulTally", "StateViolation", "fuzz_stateful", "replay_program", "run_machine_test",
           "programs_database_key", "state_machine", "geometries", "drive_unchecked", "STEPS_PER_PROGRAM"]

STEPS_PER_PROGRAM = 40  # Hypothesis's stateful_step_count: rules after the manager opens
MAX_PROMPT = 48
MAX_MODEL_LEN = 128  # prompt plus decoded and draft tokens stay below it
FAMILIES = 3  # shared-prefix families: requests of one family hit each other's blocks
MAX_IN_FLIGHT = 6  # requests running or waiting at once
MAX_GROUPS = 3  # KV-cache groups of a hybrid layout


def draw_scope() -> str:
    """What the programs are drawn from, for every verdict: a pass says
    nothing of what was never drawn."""
    return (f"programs drawn on hybrid layouts of 2-{MAX_GROUPS} KV-cache groups and, one in five, on one group "
            f"(vLLM's unitary coordinator: full attention three times in five, else sliding window or Mamba), "
            f"prompts of at most {MAX_PROMPT} tokens from "
            f"{FAMILIES} shared-prefix families, at most {MAX_IN_FLIGHT} requests in flight, a {MAX_MODEL_LEN}-token "
            f"model, a pool of one to two longest requests' blocks, prefix caching off in one attention-only program "
            f"in eight, at most {STEPS_PER_PROGRAM} rules a program")


@attrs.define
class StatefulTally:
    """What a stateful run exercised."""

    programs: int = 0  # Hypothesis examples: a manager opened and driven
    operations: int = 0  # operations applied and checked
    schedules: int = 0  # scheduler steps among them
    lookups: int = 0  # get_computed_blocks answers checked
    nonzero_hits: int = 0
    preemptions: int = 0
    evictions: int = 0  # blocks invalidated by evict
    resets: int = 0  # successful reset_prefix_cache calls
    refused: int = 0  # geometries the worker could not drive (see ``refusals``)
    refusals: dict[str, int] = attrs.Factory(dict)  # why -> how many

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.define
class StatefulResult:
    subject: dict[str, Any]
    capabilities: Capabilities
    seed: int
    tally: StatefulTally = attrs.Factory(StatefulTally)
    seconds: float = 0.0
    failure: Failure | None = None
    programs_to_first_failure: int | None = None
    seconds_to_first_failure: float | None = None
    stopped: Outcome | None = None
    stopped_why: str = ""
    scope_reduction: str = ""
    # What the worker reported it could not exercise on this release (an
    # operation vLLM does not have), said with the verdict.
    not_exercised: tuple[str, ...] = ()
    # Known vLLM bugs met (recognised by their mechanism, model.known): name ->
    # programs that met it, and the first such program; the search went on.
    known_met: dict[str, int] = attrs.Factory(dict)
    known_first: dict[str, str] = attrs.Factory(dict)

    units = "operations"
    differential = "stateful"
    restarts: tuple[str, ...] = ()
    other_failures: tuple[Failure, ...] = ()
    # The shrinking budget (SHRINK_RUNS), when it was spent: the failure
    # reported is the smallest found within it, perhaps not the smallest.
    shrink_budget: int | None = None

    @property
    def examples(self) -> int:
        return self.tally.programs

    @property
    def cases(self) -> int:
        return self.tally.operations

    def coverage(self) -> str:
        t = self.tally
        return (f"{t.programs} programs, {t.operations} operations ({t.schedules} scheduler steps, "
                f"{t.lookups} lookups of which {t.nonzero_hits} hit, {t.preemptions} preemptions, "
                f"{t.evictions} blocks invalidated, {t.resets} cache resets)")

    def first_failure(self) -> str | None:
        """How far in the first broken invariant came (None: none came)."""
        return None if self.programs_to_first_failure is None else f"{self.programs_to_first_failure} programs"

    @property
    def outcome(self) -> Outcome:
        if self.failure is not None:
            return Outcome.FINDING
        if self.stopped is not None:
            return self.stopped
        if self.tally.operations == 0 or self.scope_reduction:
            return Outcome.INCOMPLETE
        return Outcome.OK

    @property
    def verdict(self) -> str:
        if self.failure is not None:
            return "state invariant broken"
        if self.stopped is not None:
            return f"incomplete ({self.stopped_why})"
        if self.tally.operations == 0:
            return "incomplete (no operation ran: every geometry was refused)"
        if self.scope_reduction:
            return f"no invariant broken in a reduced scope ({self.scope_reduction})"
        if self.known_met:
            met = ", ".join(f"{name} in {n} program(s)" for name, n in sorted(self.known_met.items()))
            return f"no invariant broken but known vLLM bugs (model/known.py), met and recognised: {met}"
        return "no invariant broken"

    def scope(self) -> str:
        """What the verdict covers, in words."""
        parts = [draw_scope(), scope_text()]
        if self.not_exercised:
            parts.append("not exercised on this release: " + "; ".join(self.not_exercised))
        for name, first in sorted(self.known_first.items()):
            parts.append(f"known vLLM bug {name} met in {self.known_met[name]} program(s), each ended there (the "
                         f"state after it is not checked; the search went on with the next program); first: {first}")
        if self.tally.refused:
            reasons = "; ".join(f"{n} x {why}" for why, n in sorted(self.tally.refusals.items()))
            parts.append(f"{self.tally.refused} geometries not driven ({reasons})")
        return ". ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject, "capabilities": self.capabilities.as_dict(), "seed": self.seed,
            "differential": "stateful", "examples": self.examples, "cases": self.cases, **self.tally.as_dict(), "seconds": round(self.seconds, 3),
            "programs_to_first_failure": self.programs_to_first_failure,
            "seconds_to_first_failure": None if self.seconds_to_first_failure is None
            else round(self.seconds_to_first_failure, 3),
            "verdict": self.verdict, "stopped": None if self.stopped is None else self.stopped.name,
            "failure": None if self.failure is None else self.failure.as_dict(),
            "other_failures": [f.as_dict() for f in self.other_failures],
            "scope": self.scope(), "scope_reduction": self.scope_reduction or None,
            "not_exercised": list(self.not_exercised),
            "known_met": dict(self.known_met), "known_first": dict(self.known_first),
        }


class StateViolation(AssertionError):
    """A program broke an invariant (or made vLLM raise): Hypothesis shrinks it."""

    def __init__(self, failure: Failure):
        super().__init__(failure.discrepancies[0].summary())
        self.failure = failure


_VIOLATION_KINDS: dict[str, type[StateViolation]] = {}


def _violation_key(failure: Failure) -> str:
    """What tells two failures apart: the invariant, and for a crash the
    exception vLLM raised."""
    first = failure.discrepancies[0]
    if first.category is Category.SUBJECT_CRASH:
        return f"{first.category.value}_{_exception(failure.reply) or 'unknown'}"
    return first.category.value


def _violation(failure: Failure) -> StateViolation:
    """The failure as an exception of its own type: Hypothesis tells bugs
    apart by type, so a run shrinks and reports each broken invariant."""
    key = _violation_key(failure)
    kind = _VIOLATION_KINDS.get(key)
    if kind is None:
        kind = _VIOLATION_KINDS[key] = type(f"StateViolation_{re.sub(r'[^0-9A-Za-z_]', '_', key)}",
                                            (StateViolation,), {"__module__": __name__})
    return kind(failure)


# One program in five on a one-group layout; shrinking goes to the hybrid ones.
_ONE_GROUP = st.sampled_from((False, False, False, False, True))
_UNITARY_BLOCK = st.sampled_from((1, 2, 4, 8, 16))
_UNITARY_KIND = st.sampled_from((GroupKind.FULL_ATTENTION, GroupKind.FULL_ATTENTION, GroupKind.FULL_ATTENTION,
                                 GroupKind.SLIDING_WINDOW, GroupKind.MAMBA_ALIGN))
# One attention-only program in eight with prefix caching off; shrinking goes to on.
_CACHING_OFF = st.sampled_from((False,) * 7 + (True,))


def _blocks_needed(config: CoordinatorConfig, tokens: int) -> int:
    return sum(-(-tokens // g.block_size) for g in config.groups)


@st.composite
def geometries(draw, capabilities: Capabilities) -> Program:
    """A manager to drive: a hybrid layout vLLM accepts, a pool from just
    enough for one longest request to twice that (so blocks are evicted and
    requests preempted), and sparse retention on layouts with a
    sliding-window group (the only ones every supported release takes it for)."""
    if draw(_ONE_GROUP):
        # A one-group model: vLLM's unitary coordinator, the hash block the
        # group's block.  Full attention (most deployments, with or without
        # EAGLE), a sliding-window-only or a Mamba-only model.
        block, kind = draw(_UNITARY_BLOCK), draw(_UNITARY_KIND)
        window = draw(st.integers(1, 2 * block)) if kind is GroupKind.SLIDING_WINDOW else 0
        eagle = kind is not GroupKind.MAMBA_ALIGN and draw(st.booleans())
        config = CoordinatorConfig((KVCacheGroup(kind, block, eagle=eagle, sliding_window=window),),
                                   scheduler_block_size=block, hash_block_size=block)
    else:
        config = draw(configs(capabilities, max_groups=MAX_GROUPS))
    if not any(g.kind is GroupKind.MAMBA_ALIGN for g in config.groups) and draw(_CACHING_OFF):
        # Prefix caching off, a common deployment choice: the same manager
        # registers nothing and every lookup misses.  Attention-only layouts:
        # a Mamba group's "align" mode exists for prefix caching.
        config = attrs.evolve(config, enable_caching=False)
    one = _blocks_needed(config, MAX_MODEL_LEN) + 2
    num_blocks = draw(st.integers(one, 2 * one))
    retention = None
    if (config.enable_caching and any(g.kind is GroupKind.SLIDING_WINDOW for g in config.groups)
            and draw(st.booleans())):
        # A multiple of the scheduler block, as vLLM requires.
        retention = config.scheduler_block_size * draw(st.integers(1, 4))
    # Most deployments keep vLLM's default full-prompt admission gate.
    reserve = draw(st.sampled_from((True, True, False)))
    return Program(config, num_blocks, MAX_MODEL_LEN, (), retention, reserve_full_sequence=reserve)


def _prompt(family: int, shared: int, suffix: int, seed: int) -> list[int]:
    """``shared`` tokens of a family's prefix, then ``suffix`` tokens of its own."""
    rng = random.Random(seed)
    return [family * 1000 + i for i in range(shared)] + [50_000 + rng.randrange(1000) for _ in range(suffix)]


def state_machine(subject: SubjectProcess | Callable[[], SubjectProcess],
                  on_program: Callable[..., None] = lambda machine, refused=None: None,
                  on_violation: Callable[[Failure], None] = lambda failure: None,
                  known: Callable[[], tuple[KnownBug, ...]] = tuple,
                  check: bool = True,
                  on_known: Callable[[KnownBug, Failure], None] = lambda bug, failure: None,
                  geometry: Callable[[Capabilities], Any] | None = None,
                  ) -> type[RuleBasedStateMachine]:
    """The rule-based machine bound to one live subject, or to a function
    that gives it on first use (the shipped pytest test: no worker starts
    while tests are collected).  ``known`` gives the known vLLM bugs to
    recognise, asked once the subject is live: a program that meets one (by
    its mechanism) is handed to ``on_known`` and ends there, and the search
    goes on; nothing is kept out of the draw.  ``check`` off (the benchmark's
    baseline only, ``drive_unchecked``): the worker reads no state after an
    operation and nothing is checked, the rules and messages unchanged.
    ``geometry``: the strategy of managers to open, given the subject's
    capabilities (default ``geometries``; a release range's targeted search
    keeps to the geometries around one example)."""
    live = subject if callable(subject) else (lambda: subject)
    draw_geometry = geometries if geometry is None else geometry
    drafts_possible = st.integers(0, 3)

    class StatefulMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.program: Program | None = None  # the geometry; its operations are in `ops`
            self.ops: list[dict[str, Any]] = []  # validated once, when the program is taken
            self.oracle: StateOracle | None = None
            self.running: list[str] = []
            self.waiting: list[str] = []
            self.prompts: list[list[int]] = []
            self.serial = 0
            self.has_eagle = False
            self.can_evict = False
            self.inert = False  # a known bug was met: the rest of the program sends nothing
            self.known: tuple[KnownBug, ...] = ()
            self.proc: SubjectProcess | None = None
            self.lookups = self.hits = self.preemptions = self.evictions = self.resets = 0
            self.failed = False
            self.last_reset = 0

        @initialize(geometry=st.deferred(lambda: draw_geometry(live().capabilities)))
        def open(self, geometry: Program) -> None:
            proc = self.proc = live()
            try:
                opened = proc.session(OpenMachine(geometry.machine_case()))
            except KvspecError as error:
                raise _Abort(error) from error
            self.program = geometry
            if opened.failed_as(ErrorKind.ENVIRONMENT):
                raise _Abort(SetupError(f"{proc.subject.label}: the vLLM runtime cannot import what the "
                                        f"manager needs ({opened.error.message})"))
            if not opened.ok:
                if opened.failed_as(ErrorKind.UNSUPPORTED):
                    on_program(self, refused=opened.error.message)
                    reject()
                self._fail(geometry, [StateOracle.refused(opened.error)], opened)
            machine = opened.payload
            if machine.retention_interval != geometry.retention_interval and not (
                    geometry.retention_interval is None and machine.retention_interval in (None, 0)):
                raise _Abort(InfrastructureError(
                    f"asked for retention interval {geometry.retention_interval}, the manager took "
                    f"{machine.retention_interval} (a kvspec bug)"))
            self.oracle = StateOracle(geometry, proc.capabilities, machine.state)
            self.has_eagle = any(g.eagle for g in geometry.config.groups)
            self.known = tuple(known())
            self.can_evict = machine.can_evict
            on_program(self)

        def _fail(self, program: Program, found: list[Discrepancy], reply: dict[str, Any]) -> None:
            failure = Failure(program, tuple(found), reply)
            bugs = recognise_all(self.known, found)
            if bugs:  # known vLLM bugs again: said, and the search goes on
                self.inert = True
                for bug in bugs:
                    on_known(bug, failure)
                return
            self.failed = True
            on_violation(failure)
            raise _violation(failure)

        def _apply(self, *ops: dict[str, Any]) -> None:
            """Send ``ops`` in one message and check every answer in order; a
            failing program ends with the operation that failed."""
            assert self.program is not None and self.oracle is not None
            if self.inert:
                return
            try:
                reply = self.proc.session(MachineOps(ops, observe=check))
            except KvspecError as error:  # the worker, not vLLM: no input is to blame
                self.failed = True  # the teardown sends nothing more: the first cause is the one reported
                raise _Abort(error) from error
            if reply.failed_as(ErrorKind.KVSPEC):
                raise _Abort(InfrastructureError(f"kvspec sent an operation the worker refused "
                                                 f"({describe_op(ops[reply.error.index or 0])}): "
                                                 f"{reply.error.message} (a kvspec bug)"))
            if reply.failed_as(ErrorKind.UNSUPPORTED):
                raise _Abort(InfrastructureError(f"the worker cannot drive {describe_op(ops[0])} on this vLLM: "
                                                 f"{reply.error.message}"))
            seen = []
            for op, answer in zip(ops, reply.payload.answers):
                self.ops.append(op)
                answer, found = self.oracle.checked(op, answer) if check else (answer, None)
                seen.append(answer)
                if found:
                    self._fail(self.taken(), found, record_of(answer))
                    return
                self.running = list(answer.running)
                self.waiting = list(answer.waiting)
                result = answer.result
                self.lookups += len(result.lookups)
                self.hits += sum(lk.hit > 0 for lk in result.lookups)
                self.preemptions += len(result.preempted) + (op["do"] == "preempt")
                self.evictions += len(result.evicted)
                self.resets += bool(result.reset)
            if not reply.ok:  # vLLM raised on the operation after the last answer
                failed = _failed_at(reply)
                self.ops.append(ops[failed])
                self._fail(self.taken(), [StateOracle.crash(ops[failed], reply.error)], record_of(reply.with_answers(seen)))

        def taken(self) -> Program:
            """The program so far: the geometry and every operation applied."""
            assert self.program is not None
            return self.program.with_ops(self.ops)

        def _arrive(self, tokens: list[int], external: int = 0) -> None:
            name = f"r{self.serial}"
            self.serial += 1
            self.prompts.append(tokens)
            op: dict[str, Any] = {"do": "arrive", "id": name, "tokens": tokens}
            if external:
                op["external"] = external
            self._apply(op)

        @precondition(lambda self: len(self.running) + len(self.waiting) < MAX_IN_FLIGHT)
        @rule(family=st.integers(0, FAMILIES - 1), shared=st.integers(0, MAX_PROMPT),
              suffix=st.integers(0, 16), seed=st.integers(0, 2**16),
              external=st.one_of(st.just(0), st.integers(1, MAX_PROMPT)))
        def arrive(self, family: int, shared: int, suffix: int, seed: int, external: int) -> None:
            tokens = _prompt(family, shared, suffix, seed)[:MAX_PROMPT]
            self._arrive(tokens or [family * 1000], external)

        @precondition(lambda self: self.prompts and len(self.running) + len(self.waiting) < MAX_IN_FLIGHT)
        @rule(which=st.integers(0, 2**16))
        def resend(self, which: int) -> None:
            """The same prompt again: the whole prefix is cached if nothing evicted it."""
            self._arrive(list(self.prompts[which % len(self.prompts)]))

        @rule(budget=st.one_of(st.none(), st.integers(1, 64)), drafts=drafts_possible,
              accepted=st.integers(0, 3))
        def schedule(self, budget: int | None, drafts: int, accepted: int) -> None:
            op: dict[str, Any] = {"do": "schedule"}
            if budget is not None:
                op["budget"] = budget
            if self.has_eagle and drafts:
                op.update(drafts=drafts, accepted=min(accepted, drafts))
            self._apply(op)

        @rule(steps=st.integers(1, 4))
        def schedule_again(self, steps: int) -> None:
            """Steps are the common move: a second rule makes them more likely,
            up to four steps in one message (each one's state still checked)."""
            self._apply(*({"do": "schedule"} for _ in range(steps)))

        @precondition(lambda self: self.running)
        @rule(which=st.integers(0, 2**16))
        def finish(self, which: int) -> None:
            self._apply({"do": "finish", "id": self.running[which % len(self.running)]})

        @precondition(lambda self: self.running)
        @rule(which=st.integers(0, 2**16))
        def preempt(self, which: int) -> None:
            self._apply({"do": "preempt", "id": self.running[which % len(self.running)]})

        # A reset empties the cache the other rules fill, so it waits its turn.
        @precondition(lambda self: self.program is not None and len(self.ops) - self.last_reset >= 8)
        @rule()
        def reset(self) -> None:
            self.last_reset = len(self.ops)
            self._apply({"do": "reset"})

        @precondition(lambda self: self.running and self.can_evict)
        @rule(which=st.integers(0, 2**16), from_block=st.integers(0, 8))
        def evict(self, which: int, from_block: int) -> None:
            self._apply({"do": "evict", "id": self.running[which % len(self.running)], "from_block": from_block})

        def teardown(self) -> None:
            # Drain: every request finishes, so a leak shows as blocks not free.
            if self.program is None or self.oracle is None or self.failed or self.inert:
                return
            if self.running:
                self._apply(*({"do": "finish", "id": name} for name in self.running))

    return StatefulMachine


def programs_database_key(subject_label: str) -> bytes:
    """Saved failing programs, apart from every other differential's."""
    return f"{subject_label}|stateful".encode()


def fuzz_stateful(
    proc: SubjectProcess,
    max_examples: int,
    seed: int,
    database: ExampleDatabase | None = None,
    steps: int = STEPS_PER_PROGRAM,
    stop_at_first: bool = False,
    on_first_failure: Callable[[StatefulResult], None] | None = None,
    keep_programs: list[Program] | None = None,
    include_known: bool = False,
) -> StatefulResult:
    """Drive ``max_examples`` programs through one live subject; the returned
    failure is Hypothesis's shrunk minimum.  ``keep_programs``, when given,
    receives every program run (the benchmark replays them unchecked).
    A known vLLM bug the release carries is recognised when a program meets
    it (counted, said, the search going on), unless ``include_known``
    (``kvspec history`` shows every bug as a finding)."""
    caps = proc.capabilities
    subject = proc.describe()
    known = () if include_known else tuple(known_bugs(subject.get("vllm_version")))
    result = StatefulResult(subject=subject, capabilities=caps, seed=seed, scope_reduction=proc.scope_reduction)
    failures: list[Failure] = []
    restarts_before = len(proc.restarts)
    start = time.perf_counter()
    not_exercised: set[str] = set()

    def on_program(machine, refused: str | None = None) -> None:
        if refused is not None:
            result.tally.refused += 1
            why = refused.split(":")[0][:120]
            result.tally.refusals[why] = result.tally.refusals.get(why, 0) + 1
            return
        result.tally.programs += 1
        if not machine.can_evict:
            not_exercised.add("evict (this vLLM's KVCacheManager has no evict_blocks)")

    def on_violation(failure: Failure) -> None:
        failures.append(failure)  # first: an interrupt from here on keeps it
        if result.programs_to_first_failure is None:
            result.programs_to_first_failure = result.tally.programs
            result.seconds_to_first_failure = time.perf_counter() - start
            if on_first_failure is not None:
                on_first_failure(result)

    def on_known(bug: KnownBug, failure: Failure) -> None:
        count_met(result.known_met, result.known_first, (bug,), failure.case.describe())

    machine_class = state_machine(proc, on_program, on_violation, lambda: known, on_known=on_known)

    class Counted(machine_class):  # type: ignore[valid-type, misc]
        """Adds each finished program's counts to the tally."""

        def teardown(self) -> None:
            try:
                super().teardown()
            finally:
                if keep_programs is not None and self.program is not None:
                    keep_programs.append(self.taken())
                t = result.tally
                t.operations += len(self.ops)
                t.schedules += sum(op["do"] == "schedule" for op in self.ops)
                t.lookups += self.lookups
                t.nonzero_hits += self.hits
                t.preemptions += self.preemptions
                t.evictions += self.evictions
                t.resets += self.resets

    phases = [Phase.explicit, Phase.reuse, Phase.generate]
    if not stop_at_first:
        phases.append(Phase.shrink)
    # Shrinking, Hypothesis also reports each other invariant broken while it
    # searched (found within its own budget after the first: not a complete list).
    test = _machine_test(Counted, proc, max_examples, seed, steps, database, phases,
                         multiple=Phase.shrink in phases)
    run_machine_test(test, result, failures)
    if result.failure is not None and Phase.shrink in phases and result.stopped is None:
        try:
            result.failure = _reduced(proc, result.failure)
            result.other_failures = tuple(_reduced(proc, f) for f in result.other_failures)
        except KeyboardInterrupt:  # the failures found stay, unreduced
            result.stopped, result.stopped_why = Outcome.INTERRUPTED, "interrupted while reducing the program"
    result.seconds = time.perf_counter() - start
    result.restarts = tuple(proc.restarts[restarts_before:])
    result.not_exercised = tuple(sorted(not_exercised))
    return result


# Test runs (programs) Hypothesis may spend shrinking a run's failures (0.28.0's engine
# column ran about 6,000 in its five-minute limit): past it the smallest
# failing program found so far is the one reported.  A count, not a clock,
# so the program reported is the same on any machine.
SHRINK_RUNS = 400


def run_machine_test(test: Callable[[], None], result: StatefulResult, failures: list[Failure]) -> None:
    """Run a state machine's Hypothesis test and put its outcome in
    ``result``: the minimal failure (and the other distinct ones), or why it
    stopped.  ``failures`` holds every failure the machine met, in order."""
    budget = None
    try:
        # A seed draws the same programs whatever was imported before.
        with fixed_constant_pool(), shrink_budget(SHRINK_RUNS) as budget:
            test()
    except StateViolation:
        result.failure = failures[-1]  # Hypothesis replays its minimal program last
    except Flaky:
        result.failure = attrs.evolve(failures[-1], flaky=True) if failures else None
    except _Abort as abort:
        result.stopped, result.stopped_why = abort.error.outcome, str(abort.error)
        result.failure = failures[-1] if failures else None
    except KeyboardInterrupt:
        result.stopped, result.stopped_why = Outcome.INTERRUPTED, "interrupted"
        result.failure = failures[-1] if failures else None
    except _ExceptionGroup as group:  # several distinct failures, each shrunk
        found, aborts, other = _split(group)
        if any(interrupt_behind(e) for e in other):
            result.stopped, result.stopped_why = Outcome.INTERRUPTED, "interrupted"
            other = [e for e in other if not interrupt_behind(e)]
        if other or not (found or aborts or result.stopped):
            raise
        if aborts:
            result.stopped, result.stopped_why = aborts[0].error.outcome, str(aborts[0].error)
        # The first found comes first, as without the others.
        order = {}
        for failure in failures:
            order.setdefault(_violation_key(failure), len(order))
        found.sort(key=lambda f: order.get(_violation_key(f), len(order)))
        if found:
            result.failure, result.other_failures = found[0], tuple(found[1:])
        elif failures:
            result.failure = failures[-1]
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


def _split(group: _ExceptionGroup) -> tuple[list[Failure], list[_Abort], list[BaseException]]:
    """The failures in Hypothesis's group of distinct bugs (flaky ones
    marked), the aborts, and anything else."""
    found: list[Failure] = []
    aborts: list[_Abort] = []
    other: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, StateViolation):
            found.append(exc.failure)
        elif isinstance(exc, _Abort):
            aborts.append(exc)
        elif isinstance(exc, _ExceptionGroup):
            inner, inner_aborts, inner_other = _split(exc)
            flaky = isinstance(exc, Flaky)
            found += [attrs.evolve(f, flaky=True) if flaky else f for f in inner]
            aborts += inner_aborts
            other += inner_other
        else:
            other.append(exc)
    return found, aborts, other


def _machine_test(machine_class: type[RuleBasedStateMachine], proc: SubjectProcess, max_examples: int, seed: int,
                  steps: int, database: ExampleDatabase | None, phases: list[Phase],
                  multiple: bool = False, key: bytes | None = None) -> Callable[[], None]:
    """Hypothesis's test of ``machine_class``: ``seed`` draws the same
    programs whichever machine class (checked or not) it drives, up to the
    first failure; ``multiple``: distinct failures are all reported."""
    test = get_state_machine_test(machine_class, settings=settings(
        max_examples=max_examples, stateful_step_count=steps, deadline=None, database=database,
        verbosity=Verbosity.quiet, suppress_health_check=list(HealthCheck), phases=phases,
        report_multiple_bugs=multiple, derandomize=False))
    set_seed(test, seed)
    set_database_key(test.hypothesis.inner_test, key or programs_database_key(proc.subject.label))
    return test


def drive_unchecked(proc: SubjectProcess, max_examples: int, seed: int,
                    steps: int = STEPS_PER_PROGRAM) -> list[Program]:
    """The benchmark's baseline, never a verdict: the draw ``fuzz_stateful``
    makes with this seed, its rules sending the same messages, but the worker
    reads no state and nothing is checked.  Returns the programs driven."""
    programs: list[Program] = []
    known = known_of(proc)

    class Kept(state_machine(proc, known=lambda: known, check=False)):  # type: ignore[misc]
        def teardown(self) -> None:
            super().teardown()
            if self.program is not None:
                programs.append(self.taken())

    with fixed_constant_pool():
        _machine_test(Kept, proc, max_examples, seed, steps, None,
                      [Phase.explicit, Phase.reuse, Phase.generate])()
    return programs


def _reduced(proc: SubjectProcess, failure: Failure) -> Failure:
    """Hypothesis's minimal program with every operation the failure does not
    need deleted (each candidate replayed: the same invariant broken, or a
    crash of the same exception type)."""
    category = failure.discrepancies[0].category
    error = _exception(failure.reply)

    def still_fails(candidate: Program) -> bool:
        try:
            found, reply = replay_program(proc, candidate)
        except KvspecError:  # a candidate the machine cannot run (it names a request not running)
            return False
        return bool(found) and found[0].category is category and _exception(reply) == error

    program, _ = reduce_program(failure.case, still_fails)
    if program == failure.case:
        return failure
    try:
        found, reply = replay_program(proc, program)
    except KvspecError:
        return failure
    if not found:  # it passed this time (flaky): keep what Hypothesis found
        return failure
    return attrs.evolve(failure, case=program, discrepancies=tuple(found), reply=reply)


def _failed_at(reply: Reply) -> int:
    """The operation of a batch the failed ``reply`` stopped at: the one its
    error names, else the one after the last answered."""
    index = reply.error.index
    return index if index is not None else len(reply.payload.answers)


def _exception(reply: dict[str, Any]) -> str | None:
    """The exception type of a crash (None for a broken invariant)."""
    error = reply.get("error")
    return error.split(":", 1)[0] if isinstance(error, str) else None


def replay_program(proc: SubjectProcess, program: Program) -> tuple[list[Discrepancy], dict[str, Any]]:
    """Run a recorded program on ``proc`` and check every step: the
    discrepancies of the first step that has any (none: it passes here)."""
    opened = proc.session(OpenMachine(program.machine_case()))
    if not opened.ok:
        if opened.failed_as(ErrorKind.ENVIRONMENT):
            raise SetupError(f"the vLLM runtime cannot import what the manager needs ({opened.error.message})")
        if opened.failed_as(ErrorKind.UNSUPPORTED):
            raise InfrastructureError(f"this subject cannot drive the program: {opened.error.message}")
        return [StateOracle.refused(opened.error)], record_of(opened)
    oracle = StateOracle(program, proc.capabilities, opened.payload.state)
    reply = proc.session(MachineOps(dict(op) for op in program.ops))
    seen = []
    for op, answer in zip(program.ops, reply.payload.answers):
        answer, found = oracle.checked(op, answer)
        if found:
            return found, record_of(answer)
        seen.append(answer)
    if not reply.ok:
        if reply.failed_as(ErrorKind.KVSPEC) or reply.failed_as(ErrorKind.UNSUPPORTED):
            raise InfrastructureError(f"the program cannot run on this subject: {reply.error.message}")
        index = reply.error.index
        op = program.ops[index] if index is not None and index < len(program.ops) else None
        return [StateOracle.crash(op, reply.error)], record_of(reply.with_answers(seen))
    return [], record_of(reply.with_answers(seen))
