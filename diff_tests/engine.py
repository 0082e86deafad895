"""The engine differential: vLLM's real ``Scheduler``, built by the release's
own configuration code from drawn engine flags, driven by engine inputs
(requests added with shared prefixes and resends, engine steps, aborts,
cache resets), the manager's state after every operation held to
``model.state``'s invariants (``oracles.state``) and the scheduler--manager
seam held to its own contracts: ``schedule()`` never raises on a
configuration the engine accepted, and an allocation takes no more free
blocks than the groups estimated.

Where the stateful differential (``diff_tests/stateful.py``) drives the
manager as kvspec's replica of the scheduler would, this one drives it as the
engine does, defaults included (the retention interval, async scheduling,
the admission gate, chunked prefill): a finding here is reachable through
vLLM's scheduler with the engine settings it names.
"""

from __future__ import annotations

import random
import time
from collections.abc import Collection
from typing import Any, Callable, Iterator

import attrs
from hypothesis import Phase, reject, strategies as st
from hypothesis.database import ExampleDatabase
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from kvspec.model.engine import (MAX_MTP_MODULES, MODELLED_STEPS, MTP_TOY, OWN_CONNECTOR, QWEN3_NEXT_TOYS, TOY_MODELS, EngineProgram, EngineSetup,
                                 derived_config, describe_engine_op, retention_layout)
from kvspec.model.errors import InfrastructureError, KvspecError, SetupError
from kvspec.model.finding import Category
from kvspec.model.known import KnownBug, count_met, known_bugs, recognise_all
from kvspec.model.domain import KVCacheGroup
from kvspec.model.replies import AllocationSeen, ErrorKind, OpAnswer, Reply, WorkerError, record_of
from kvspec.model.requests import EngineOps, OpenEngine
from kvspec.model.state import Allocation, groups_over_estimate, over_estimate_kinds, scope_text
from kvspec.oracles.registration import Discrepancy, RegistrationBound
from kvspec.oracles.state import StateOracle
from kvspec.subjects.process import SubjectProcess

from .fuzz import _Abort
from .property import Failure
from .stateful import StatefulResult, _failed_at, _machine_test, _violation, run_machine_test

__all__ = ["EngineResult", "fuzz_engine", "replay_engine_program", "engine_setups", "release_setups",
           "as_the_release_takes", "engine_draw_scope",
           "engine_database_key", "engine_machine", "engine_crash"]

STEPS_PER_PROGRAM = 40
MAX_IN_FLIGHT = 6
FAMILIES = 3
DRAIN_STEPS = 64  # the teardown's steps to finish every request


def engine_draw_scope() -> str:
    models = ", ".join(f"{m.name} ({m.family})" for m in TOY_MODELS)
    return (f"engine programs on {models}; vLLM's own configuration code builds each (the release's defaults for "
            f"every flag not drawn: the retention interval, async scheduling, chunked prefill, the admission gate "
            f"are drawn half the time and otherwise left to the release); prompts of up to 3 blocks of shared "
            f"prefix from {FAMILIES} families plus a suffix, resends, at most {MAX_IN_FLIGHT} requests in flight, "
            f"1-8 output tokens each, engine steps, aborts, cache resets; a pool from about one to two longest "
            f"requests (--num-gpu-blocks-override); vLLM's DecodeBenchConnector (synchronous loads of every prompt token but the last) in one program in four; "
            f"kvspec's own connector ({OWN_CONNECTOR}, against vLLM's public KVConnectorBase_V1, passed by "
            f"kv_connector_module_path) in one program in four: each request offered a drawn number of external "
            f"prompt tokens, loaded synchronously or asynchronously (finished 0-3 executed steps later), one load "
            f"plan in three failing from a drawn loaded block (invalid_block_ids; reported only on one-group layouts, "
            f"the only ones where vLLM maps failed blocks back to requests: a hybrid layout's loads succeed), under "
            f"kv_load_failure_policy 'fail' (the release's default: vLLM evicts the failed blocks and fails the "
            f"requests) or 'recompute'; not drawn: failed_recving (request-level failures, 0.34), the connector's "
            f"lookahead block hashes and partial-tail offloads, connectors that send (request_finished delays no "
            f"free); EAGLE3 speculative decoding with the toy Llama's drafter in one Llama program in three, and MTP "
            f"(vLLM's method 'mtp') on the toy Qwen3-Next with the model's own modules (its config.json's "
            f"num_nextn_predict_layers: the toy's 1, or 2 or 3 in two MTP programs in three, where the release has "
            f"multi-module MTP), and "
            f"EAGLE3 on the same toy with a drafter of twice its KV page (hypothetical drafter geometry: its group's "
            f"block is half the scheduler block), each in two of its programs in three, 1-3 speculative tokens (with "
            f"several MTP modules up to the modules, 2 or more in most programs; each step's drafts, up to that many, proposed "
            f"and accepted drawn per step, as the drafter proposes them), under the release's default hashes or "
            f"legacy ones (disable_lookahead_block_hashes, where the release takes it); on the Qwen3-Next toys, "
            f"--prefix-match-unit 8 or 16 in one program in two (partial hash hits; where the release takes it); "
            f"not drawn: more MTP modules than {MAX_MTP_MODULES} or speculative tokens than modules with several, "
            f"--prefix-match-unit on other toys, EAGLE3 on the Nemotron-H toy; no structured "
            f"output (not drawn yet); at most {STEPS_PER_PROGRAM} rules a program. Modelled: " + "; ".join(MODELLED_STEPS))


_OPTION_WORDS = {
    "retention": "the prefix-cache retention interval (every engine ran the release's own retention)",
    "mamba_default": "the release's default Mamba caching (every hybrid toy ran with --mamba-cache-mode align "
                     "--enable-prefix-caching)",
    "legacy_hashes": "legacy block hashes (--speculative-config disable_lookahead_block_hashes)",
    "match_unit": "--prefix-match-unit (partial hash hits on the toy Qwen3-Next)",
    "multi_module_mtp": "multi-module MTP (the toy Qwen3-Next with 2 or 3 MTP modules, num_nextn_predict_layers)",
}


@attrs.define
class EngineResult(StatefulResult):
    """A stateful result whose programs ran through the engine; ``settings``
    counts the engine settings vLLM reported it ran (a scope in words)."""

    settings: dict[str, dict[str, int]] = attrs.Factory(dict)
    owed_lookups: int = 0  # lookups retention owed a hit (model.retention): how often retention_hit bit
    # The registration bound (oracles.registration.RegistrationBound): the
    # programs whose layout has it (two or more groups, prefix caching on),
    # the cache_blocks calls held to it, and the requests whose calls started
    # afresh after the manager gave their blocks back.
    bound_programs: int = 0
    bound_calls: int = 0
    bound_lives: int = 0
    # What the release's engine does not take, asked once (``not_drawn``), and
    # why: a retention interval, legacy hashes, --prefix-match-unit, a toy
    # model; none of it drawn.
    not_drawn: dict[str, str] = attrs.Factory(dict)
    differential = "engine"

    def note_settings(self, derived: dict[str, Any]) -> None:
        for key in ("scheduler_class", "retention_interval", "async_scheduling", "reserve_full_isl",
                    "chunked_prefill", "partial_hash_hits", "kv_connector", "kv_load_failure_policy", "speculative_method",
                    "use_eagle_block_drop", "num_hash_lookahead_tokens", "multi_module_mtp", "num_prefill_lookahead"):
            value = str(derived.get(key))
            self.settings.setdefault(key, {})
            self.settings[key][value] = self.settings[key].get(value, 0) + 1
        layout = "+".join(f"{g['kind']}[{g['block_size']}]" for g in derived["groups"])
        self.settings.setdefault("groups", {})
        self.settings["groups"][layout] = self.settings["groups"].get(layout, 0) + 1

    def settings_text(self) -> str:
        parts = []
        for key, counts in sorted(self.settings.items()):
            parts.append(f"{key}: " + ", ".join(f"{v} x{n}" for v, n in sorted(counts.items())))
        return "; ".join(parts) or "no engine was built"

    def scope(self) -> str:
        parts = [engine_draw_scope(), "engine settings vLLM built and ran (programs each): " + self.settings_text(),
                 f"retention (the interval above, as vLLM's planning set it): {self.owed_lookups} of "
                 f"{self.tally.lookups} lookups were owed a hit by an earlier request's kept boundaries and held to "
                 f"it (retention_hit)", self.bound_text(), scope_text()]
        for key, why in sorted(self.not_drawn.items()):
            parts.append(f"{_OPTION_WORDS.get(key, f'the toy model {key}')} not drawn on this release: {why}")
        for name, first in sorted(self.known_first.items()):
            parts.append(f"known vLLM bug {name} met in {self.known_met[name]} program(s), each ended there (the "
                         f"state after it is not checked; the search went on with the next program); first: {first}")
        if self.tally.refused:
            reasons = "; ".join(f"{n} x {why}" for why, n in sorted(self.tally.refusals.items()))
            parts.append(f"{self.tally.refused} engine setups not driven (vLLM's configuration code refused them, "
                         f"or this release cannot express them): {reasons}")
        return ". ".join(parts)

    def bound_text(self) -> str:
        return (f"registration bound (model.spec, held as the registration differential holds it): every "
                f"cache_blocks call vLLM's Scheduler made on a layout of two or more groups with prefix caching on "
                f"({self.bound_programs} programs; the hybrid coordinator's bound: one group registers the whole "
                f"blocks of each call's n) held to it, {self.bound_calls} calls, each request's calls from the last "
                f"time the manager gave its blocks back ({self.bound_lives} started afresh after a preemption or a "
                f"freed load)")

    @property
    def verdict(self) -> str:
        if self.failure is None and self.stopped is None and self.tally.operations and not self.scope_reduction:
            return super().verdict.replace("no invariant broken", "no invariant broken through vLLM's scheduler", 1)
        return super().verdict

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        out["differential"] = "engine"
        out["engine_settings"] = self.settings
        out["retention_owed_lookups"] = self.owed_lookups
        out["registration_bound"] = {"programs": self.bound_programs, "calls": self.bound_calls,
                                     "restarted": self.bound_lives}
        out["not_drawn"] = dict(self.not_drawn)
        return out


_MAYBE_BOOL = st.sampled_from((None, None, True, False))
@st.composite
def engine_setups(draw, leaving_out: Collection[str] = ()) -> EngineSetup:
    """Engine flags over a toy model: each setting left to the release's
    default half the time (so defaults are what is drawn most).
    ``leaving_out``: what the release's engine does not take, the keys of
    ``not_drawn`` (asked once per release): ``retention``, a retention interval
    (before 0.29); ``legacy_hashes``, --speculative-config's
    disable_lookahead_block_hashes (before 0.33); ``match_unit``,
    --prefix-match-unit (before 0.28); ``multi_module_mtp``, the MTP toy
    with several MTP modules (before 0.27); a toy model's name, a toy the release
    cannot build or whose layout kvspec cannot model; ``mamba_default``, a
    hybrid's default Mamba caching (``as_the_release_takes``)."""
    retention, legacy_hashes, match_unit, multi_mtp = (key not in leaving_out for key in (
        "retention", "legacy_hashes", "match_unit", "multi_module_mtp"))
    models = [m.name for m in TOY_MODELS if m.name not in leaving_out] or [m.name for m in TOY_MODELS]
    model = draw(st.sampled_from(models))
    toy = next(m for m in TOY_MODELS if m.name == model)
    block = draw(st.sampled_from((None, 16, 32))) if toy.attention_block else None
    max_model_len = 256
    # The release chooses a hybrid's block (16 on 0.33, 64 on 0.34): the pool
    # is sized for the smallest, so every release can build it.
    unit = block or 16
    # About the blocks one longest request needs (its full-attention blocks, a
    # few for each sliding-window or Mamba layer), so requests compete and are
    # preempted; a pool below the engine's own minimum is refused by vLLM,
    # counted and said.
    attention_groups = 1 + any(kind.startswith("sliding") for kind in toy.layers)
    need = attention_groups * -(-max_model_len // unit) + 2 + 2 * sum(kind == "mamba" for kind in toy.layers)
    # A hash block finer than the GDN hybrid's block (partial hash hits, where
    # the EAGLE branch of the registration bound reads it): 8 and 16 divide
    # every block a release chose for it (32 on 0.33, 64 on 0.34).
    unit_drawn = draw(st.sampled_from((None, None, 8, 16))) if match_unit and model in QWEN3_NEXT_TOYS else None
    return as_the_release_takes(EngineSetup(
        model=model, num_gpu_blocks=draw(st.integers(need, 2 * need)), max_model_len=max_model_len,
        max_num_batched_tokens=draw(st.sampled_from((None, 64, 128, 256))),
        max_num_seqs=draw(st.sampled_from((None, 4))), block_size=block,
        prefix_caching=draw(st.sampled_from((None, None, None, False))) if not toy.hybrid else None,
        retention_interval=draw(st.sampled_from((None, None, None, 0, 64))) if retention and (
            toy.hybrid or "sliding" in "".join(toy.layers)) else None,
        async_scheduling=draw(_MAYBE_BOOL), reserve_full_isl=draw(_MAYBE_BOOL), prefix_match_unit=unit_drawn,
        **_connector(draw), **_speculative(draw, toy, legacy_hashes, multi_mtp)), leaving_out)


def as_the_release_takes(setup: EngineSetup, leaving_out: Collection[str]) -> EngineSetup:
    """``setup`` on a release whose hybrid default kvspec cannot model (no
    prefix caching for Mamba groups: ``not_drawn``'s ``mamba_default``, before
    0.28): its hybrids aligned with prefix caching on, the flags a user sets
    there (flags, not draws).  Any other setup as it is."""
    if "mamba_default" not in leaving_out or not setup.toy.hybrid:
        return setup
    return attrs.evolve(setup, mamba_cache_mode="align", prefix_caching=True)


def _connector(draw) -> dict[str, Any]:
    """vLLM's DecodeBenchConnector in one program in four, kvspec's own in
    one in four (each request's load plan drawn as it arrives), under the
    release's default failure policy ("fail": failed blocks evicted, the
    requests failed) or "recompute"."""
    connector = draw(st.sampled_from((None, None, None, None, "DecodeBenchConnector", "DecodeBenchConnector",
                                      OWN_CONNECTOR, OWN_CONNECTOR)))
    if connector != OWN_CONNECTOR:
        return {"kv_connector": connector}
    return {"kv_connector": connector, "kv_load_failure_policy": draw(st.sampled_from((None, None, "recompute")))}


# A request's load plan for kvspec's connector (None: it offers nothing):
# whole blocks and extra tokens the store holds, asynchronous or not, the
# executed steps an asynchronous load takes, and the loaded block that fails
# (one plan in three fails; the connector reports it only where vLLM maps
# invalid_block_ids back to requests: one KV-cache group).
_LOAD = st.one_of(st.none(), st.tuples(st.integers(0, 4), st.sampled_from((0, 1, 3, 15)), st.booleans(),
                                       st.integers(0, 3), st.sampled_from((None, None, 0, 1, 2))))


def _speculative(draw, toy, legacy_hashes: bool = True, multi_mtp: bool = True) -> dict[str, Any]:
    """Speculative decoding with the toy's drafter (EAGLE3 on the Llama, the
    model's own MTP modules on Qwen3-Next, or an EAGLE3 drafter of twice its KV
    page) in one program in three, two in three on the Qwen3-Next toys (they
    are there for it), under the release's default
    hashes or, where the release takes them, legacy ones (the EAGLE drop live).
    On the MTP toy, where the release has multi-module MTP, 2 to
    ``MAX_MTP_MODULES`` modules in two programs in three, with speculative
    tokens up to the modules, mostly 2 or more (multi-module MTP proper: one
    token drafts with the first module alone; vLLM refuses more tokens than
    modules unless a multiple)."""
    odds = (False, True, True) if toy.name in QWEN3_NEXT_TOYS else (False, False, True)
    if toy.spec_method is None or not draw(st.sampled_from(odds)):
        return {}
    legacy = draw(st.sampled_from((None, True))) if legacy_hashes else None
    modules = None
    if toy.spec_method == "mtp" and multi_mtp:
        modules = draw(st.sampled_from((None,) + tuple(range(2, MAX_MTP_MODULES + 1))))
    if modules is None:
        tokens = draw(st.integers(1, 3))
    else:
        tokens = draw(st.sampled_from((1,) + tuple(range(2, modules + 1)) * 2))
    out: dict[str, Any] = {"num_speculative_tokens": tokens, "legacy_hashes": legacy}
    if modules is not None:
        out["num_nextn_predict_layers"] = modules
    return out


# An arrival: family, whole blocks of its shared prefix, extra tokens, a suffix
# of its own, the suffix's seed, max_tokens.  Block-boundary lengths (a block
# and one token, a whole block) are where chunk and load boundaries meet, so
# they are drawn often.
_ARRIVAL = st.tuples(st.integers(0, FAMILIES - 1), st.integers(0, 3),
                     st.one_of(st.sampled_from((0, 1)), st.integers(2, 15)),
                     st.one_of(st.just(0), st.integers(1, 48)), st.integers(0, 2**16), st.integers(1, 8))


def _prompt(family: int, shared: int, suffix: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [family * 1000 + i for i in range(shared)] + [500 + rng.randrange(400) for _ in range(suffix)]


def engine_database_key(subject_label: str) -> bytes:
    return f"{subject_label}|engine".encode()


def engine_machine(subject: SubjectProcess | Callable[[], SubjectProcess], on_program: Callable[..., None],
                   on_violation: Callable[[Failure], None],
                   known: tuple[KnownBug, ...] | Callable[[], tuple[KnownBug, ...]] = (),
                   on_known: Callable[[KnownBug, Failure], None] = lambda bug, failure: None,
                   setups: st.SearchStrategy[EngineSetup] | None = None) -> type[RuleBasedStateMachine]:
    """The rule-based machine on one live subject, or on a function that
    gives it on first use (the shipped pytest test: no worker starts while
    tests are collected).  A program that meets a known vLLM bug of
    ``known`` (recognised by its mechanism; a function is asked once the
    subject is live) is handed to ``on_known`` and ends there; the search
    goes on.  ``setups``: the engine configurations drawn (default: what
    the release takes, asked of it on the first draw: ``release_setups``;
    a stateful finding's reproduction searches the nearest ones,
    ``diff_tests/reproduce.py``)."""
    live = subject if callable(subject) else (lambda: subject)
    if setups is None:
        # Asked when first drawn: the subject may not be live before (the shipped pytest test).
        setups = st.deferred(lambda: release_setups(live())[0])
    known_bugs_of = known if callable(known) else (lambda: known)

    class EngineStateMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.program: EngineProgram | None = None
            self.ops: list[dict[str, Any]] = []
            self.oracle: StateOracle | None = None
            self.bound: RegistrationBound | None = None
            self.live: list[str] = []  # requests added and not yet finished or aborted
            self.prompts: list[list[int]] = []
            self.serial = 0
            self.block = 16
            self.failed = False
            self.inert = False  # a known bug was met: the rest of the program sends nothing
            self.last_reset = 0
            self.lookups = self.hits = self.preemptions = self.resets = self.evictions = 0
            self.derived: dict[str, Any] = {}

        # The first arrivals come with the engine: Hypothesis's swarm testing
        # switches some rules off for a whole program, and a program of steps
        # on an empty engine would check nothing.
        @initialize(setup=setups,
                    first=st.lists(st.tuples(_ARRIVAL, _LOAD), min_size=1, max_size=3))
        def open(self, setup: EngineSetup, first: list[tuple[tuple[int, int, int, int, int, int], Any]]) -> None:
            try:
                opened = live().session(OpenEngine(setup.message()))
            except KvspecError as error:
                raise _Abort(error) from error
            self.program = EngineProgram(setup)
            if opened.failed_as(ErrorKind.ENVIRONMENT):
                raise _Abort(SetupError(f"{live().subject.label}: the vLLM runtime cannot import what the engine "
                                        f"needs ({opened.error.message})"))
            if opened.failed_as(ErrorKind.UNSUPPORTED):
                # A flag this release does not take: a setup it cannot express, counted and said.
                on_program(self, refused=f"not expressible on this release: {opened.error.message}")
                reject()
            if not opened.ok:
                if opened.error.in_kvspecs_code:
                    raise _Abort(InfrastructureError(f"kvspec's engine driver failed building {setup.describe()}: "
                                                     f"{opened.error.message} (a kvspec bug)"))
                # vLLM's configuration code refused the flags: not an engine it runs.
                on_program(self, refused=opened.error.message)
                reject()
            self.derived = opened.payload.derived
            try:
                config = derived_config(self.derived)
            except KvspecError as error:
                # A layout the state model does not know (0.27's Mamba groups
                # without prefix caching, "mamba_none"): not driven, counted
                # and said in the scope, and the search goes on with others.
                on_program(self, refused=f"not checked: kvspec cannot model what the engine built: {error}")
                reject()
            self.block = config.scheduler_block_size
            self.oracle = StateOracle(self.program, live().capabilities, opened.payload.state, config=config,
                                      retention=retention_layout(self.derived, config))
            self.bound = RegistrationBound(self.derived, live().capabilities)
            on_program(self)
            for arrival, load in first:
                self._arrive_drawn(arrival, load)

        def _fail(self, found: list[Discrepancy], reply: OpAnswer | Reply) -> None:
            # What vLLM derived for this engine goes with the failure: the
            # finding records it (run["engine_settings"]) for the reader and
            # for an upstream reproduction's hand-built KVCacheConfig.
            failure = Failure(self.taken(), tuple(found), {**record_of(reply), "derived": self.derived})
            bugs = recognise_all(known_bugs_of(), found)
            if bugs:  # known vLLM bugs again: said, and the search goes on
                self.inert = True
                for bug in bugs:
                    on_known(bug, failure)
                return
            self.failed = True
            on_violation(failure)
            raise _violation(failure)

        def taken(self) -> EngineProgram:
            assert self.program is not None
            return self.program.with_ops(self.ops)

        def _apply(self, *ops: dict[str, Any]) -> None:
            assert self.program is not None and self.oracle is not None
            if self.inert:
                return
            try:
                reply = live().session(EngineOps(ops))
            except KvspecError as error:
                raise _Abort(error) from error
            if reply.failed_as(ErrorKind.KVSPEC):
                raise _Abort(InfrastructureError(f"kvspec's engine driver failed on "
                                                 f"{describe_engine_op(ops[reply.error.index or 0])}: "
                                                 f"{reply.error.message} (a kvspec bug, not vLLM's)"))
            seen = []
            for op, answer in zip(ops, reply.payload.answers):
                self.ops.append(op)
                answer, found = check_answer(self.oracle, op, answer, bound=self.bound)
                seen.append(answer)
                if found:
                    self._fail(found, answer)
                    return
                self.live = [r for r in self.live if r in answer.running or r in answer.waiting]
                for part in answer.parts():
                    result = part.result
                    self.lookups += len(result.lookups)
                    self.hits += sum(lk.hit > 0 for lk in result.lookups)
                    self.preemptions += len(result.preempted)
                    self.resets += bool(result.reset)
                    self.evictions += len(result.evicted)  # blocks a failed KV load invalidated
            if not reply.ok:  # vLLM raised on the operation after the last answer
                failed = _failed_at(reply)
                self.ops.append(ops[failed])
                self._fail([engine_crash(ops[failed], reply.error, reply.payload.allocations,
                                         self.oracle.config.groups)], reply.with_answers(seen))

        def _arrive(self, tokens: list[int], max_tokens: int, load: Any = None) -> None:
            # vLLM's input processing refuses a prompt of max_model_len tokens
            # or more before the scheduler sees it (a toy whose scheduler block
            # is 128, as the Qwen3-Next toy with an EAGLE3 drafter on 0.34, can
            # draw 3 blocks of shared prefix past 256).
            tokens = tokens[:max(1, int(self.derived.get("max_model_len") or len(tokens) + 1) - 1)]
            name = f"r{self.serial}"
            self.serial += 1
            self.prompts.append(tokens)
            self.live.append(name)
            op: dict[str, Any] = {"do": "arrive", "id": name, "tokens": tokens, "max_tokens": max_tokens}
            plan = self._plan(load)
            if plan is not None:
                op["load"] = plan
            self._apply(op)

        def _plan(self, load: Any) -> dict[str, Any] | None:
            """The drawn load plan, recorded in the arrival (so a replay
            gives the connector the same), where kvspec's connector runs."""
            if load is None or self.program is None or self.program.setup.kv_connector != OWN_CONNECTOR:
                return None
            blocks, extra, load_async, delay, fail = load
            return {"offer": blocks * self.block + extra, "async": load_async, "delay": delay if load_async else 0,
                    "fail": fail}

        def _arrive_drawn(self, arrival: tuple[int, int, int, int, int, int], load: Any = None) -> None:
            family, shared_blocks, extra, suffix, seed, max_tokens = arrival
            tokens = _prompt(family, shared_blocks * self.block + extra, suffix, seed)
            self._arrive(tokens or [family * 1000], max_tokens, load)

        @precondition(lambda self: len(self.live) < MAX_IN_FLIGHT)
        @rule(arrival=_ARRIVAL, load=_LOAD)
        def arrive(self, arrival: tuple[int, int, int, int, int, int], load: Any) -> None:
            self._arrive_drawn(arrival, load)

        @precondition(lambda self: self.prompts and len(self.live) < MAX_IN_FLIGHT)
        @rule(which=st.integers(0, 2**16), max_tokens=st.integers(1, 8), load=_LOAD)
        def resend(self, which: int, max_tokens: int, load: Any) -> None:
            self._arrive(list(self.prompts[which % len(self.prompts)]), max_tokens, load)

        @rule(steps=st.integers(1, 4), drafts=st.integers(0, 3), accepted=st.integers(0, 3))
        def step(self, steps: int, drafts: int, accepted: int) -> None:
            # The drafter proposes ``drafts`` tokens a step, the target accepts ``accepted`` of them.
            op: dict[str, Any] = {"do": "step"}
            if self.program is not None and self.program.setup.num_speculative_tokens and drafts:
                op.update(drafts=drafts, accepted=min(accepted, drafts))
            self._apply(*(dict(op) for _ in range(steps)))

        @precondition(lambda self: self.live)
        @rule(which=st.integers(0, 2**16))
        def abort(self, which: int) -> None:
            self._apply({"do": "abort", "id": self.live[which % len(self.live)]})

        @precondition(lambda self: self.program is not None and len(self.ops) - self.last_reset >= 8)
        @rule()
        def reset(self) -> None:
            self.last_reset = len(self.ops)
            self._apply({"do": "reset"})

        def teardown(self) -> None:
            # Every request runs to its end, so a leak shows as blocks not free.
            if self.program is None or self.oracle is None or self.failed or self.inert:
                return
            for _ in range(DRAIN_STEPS // 8):
                if not self.live:
                    break
                self._apply(*({"do": "step"} for _ in range(8)))
            self._apply({"do": "step"}, {"do": "step"})  # an async batch queue drains

    return EngineStateMachine


def check_answer(oracle: StateOracle, op: dict[str, Any], answer: OpAnswer, *, through: bool = False,
                 bound: RegistrationBound | None = None) -> tuple[OpAnswer, list[Discrepancy]]:
    """An engine step is two transitions, each checked: its ``schedule()``
    (lookups, allocations, zeroing, and every ``cache_blocks`` call it made
    held to the registration bound) and the processing of an output (its
    ``cache_blocks`` calls too); the second only when the first held every
    rule, unless ``through`` (the oracle and the bound then stay in step with
    the worker's answers, each of which sends only the parts changed since the
    last).  The answer as checked (states made whole), and its discrepancies."""
    def registered(part: OpAnswer, found: list[Discrepancy]) -> list[Discrepancy]:
        if bound is None or (found and not through):
            return found
        return found + bound.check(part.result.registrations)

    if answer.scheduled is None:
        answer, found = oracle.checked(op, answer)
        return answer, registered(answer, found)
    scheduled, found = oracle.checked(op, answer.scheduled)
    found = registered(scheduled, found)
    answer = answer.with_scheduled(scheduled)
    if found and not through:
        return answer, found
    answer, more = oracle.checked({**op, "do": "update"}, answer)
    return answer, found + registered(answer, more)


def engine_crash(op: dict[str, Any], error: WorkerError, allocations: tuple[AllocationSeen, ...] = (),
                 groups: tuple[KVCacheGroup, ...] = ()) -> Discrepancy:
    """The finding of an engine operation vLLM raised on (``allocations``:
    the operation's allocate_slots calls as the worker observed them)."""
    raised_in = _raised_in_allocation(allocations)
    over = groups_over_estimate(groups, raised_in, "asked for") if raised_in else ""
    return Discrepancy(Category.SUBJECT_CRASH, None, None,
                       detail=f"vLLM raised during {describe_engine_op(op)} through the real Scheduler: "
                              f"{_said(error)}"
                              + (f" (in allocate_slots for request {raised_in.request}{over})" if over else ""),
                       group_kinds=over_estimate_kinds(groups, raised_in) if over else ())


def _said(error: WorkerError) -> str:
    """The exception as vLLM raised it; one that says nothing (a bare
    ``assert``) is named by the vLLM function that raised it (line numbers
    move between releases, so none is given)."""
    message = error.message.strip()
    if error.origin != "vllm" or not error.where or not (message.endswith(":") or ":" not in message):
        return error.message
    file, _, rest = error.where.partition(":")
    return f"{message.rstrip(':')} (raised in {rest.partition(' in ')[2] or '?'}, {file})"


def _raised_in_allocation(allocations: tuple[AllocationSeen, ...]) -> Allocation | None:
    """For a crash inside allocate_slots, the allocation that raised, with
    what each group asked the pool for: the crash's mechanism is the groups
    that asked for more than they estimated, as block_estimate names them for
    an allocation that succeeded."""
    last = allocations[-1] if allocations else None
    if last is None or last.free_after is not None:
        return None
    return Allocation(last.request, last.estimates, last.free_before, None, last.taken)


def fuzz_engine(proc: SubjectProcess, max_examples: int, seed: int, database: ExampleDatabase | None = None,
                steps: int = STEPS_PER_PROGRAM, stop_at_first: bool = False,
                on_first_failure: Callable[[EngineResult], None] | None = None,
                keep_programs: list[EngineProgram] | None = None, include_known: bool = False) -> EngineResult:
    """Drive ``max_examples`` engine programs through one live subject;
    ``keep_programs``, when given, receives every program run (the benchmark
    replays them)."""
    result = EngineResult(subject=proc.describe(), capabilities=proc.capabilities, seed=seed,
                          scope_reduction=proc.scope_reduction)
    failures: list[Failure] = []
    restarts_before = len(proc.restarts)
    start = time.perf_counter()

    def on_program(machine, refused: str | None = None) -> None:
        if refused is not None:
            result.tally.refused += 1
            why = refused.split("\n")[0][:160]
            result.tally.refusals[why] = result.tally.refusals.get(why, 0) + 1
            return
        result.tally.programs += 1
        result.note_settings(machine.derived)

    def on_violation(failure: Failure) -> None:
        failures.append(failure)
        if result.programs_to_first_failure is None:
            result.programs_to_first_failure = result.tally.programs
            result.seconds_to_first_failure = time.perf_counter() - start
            if on_first_failure is not None:
                on_first_failure(result)

    def on_known(bug: KnownBug, failure: Failure) -> None:
        count_met(result.known_met, result.known_first, (bug,), failure.case.describe())

    known = () if include_known else tuple(known_bugs(result.subject.get("vllm_version")))
    setups, result.not_drawn = release_setups(proc)
    machine_class = engine_machine(proc, on_program, on_violation, known, on_known, setups=setups)

    class Counted(machine_class):  # type: ignore[valid-type, misc]
        def teardown(self) -> None:
            try:
                super().teardown()
            finally:
                if keep_programs is not None and self.program is not None:
                    keep_programs.append(self.taken())
                t = result.tally
                t.operations += len(self.ops)
                t.schedules += sum(op["do"] == "step" for op in self.ops)
                t.lookups += self.lookups
                t.nonzero_hits += self.hits
                t.preemptions += self.preemptions
                t.resets += self.resets
                t.evictions += self.evictions
                if self.oracle is not None:
                    result.owed_lookups += self.oracle.owed_lookups
                if self.bound is not None and self.bound.live:
                    result.bound_programs += 1
                    result.bound_calls += self.bound.checked
                    result.bound_lives += self.bound.lives

    phases = [Phase.explicit, Phase.reuse, Phase.generate]
    if not stop_at_first:
        phases.append(Phase.shrink)
    test = _machine_test(Counted, proc, max_examples, seed, steps, database, phases, multiple=Phase.shrink in phases,
                         key=engine_database_key(proc.subject.label))
    run_machine_test(test, result, failures)
    result.seconds = time.perf_counter() - start
    result.restarts = tuple(proc.restarts[restarts_before:])
    return result


def release_setups(proc: SubjectProcess) -> tuple[st.SearchStrategy[EngineSetup], dict[str, str]]:
    """The engine setups drawn on this release, and what is left out of
    them: what the release's engine does not take, asked of it
    (``not_drawn``).  The one source of the draw for ``kvspec fuzz --engine``
    and the pytest plugin's engine class (``engine_machine``'s default)."""
    left_out = not_drawn(proc)
    return engine_setups(leaving_out=left_out), left_out


def _refusal(proc: SubjectProcess, probe: EngineSetup, refused: Callable[[Any], bool]) -> str:
    try:
        opened = proc.session(OpenEngine(probe.message()))
    except KvspecError:
        return ""  # undecided: the run's own first engine meets the same error and stops as it should
    if refused(opened):
        return " ".join(opened.error.message.split())[:300]  # a validation error names the field on a later line
    return ""


def not_drawn(proc: SubjectProcess) -> dict[str, str]:
    """What this release's engine does not take, asked once per run, each with
    why: ``retention``, --prefix-cache-retention-interval (0.29+: asked with 0
    on a sliding-window toy); ``legacy_hashes``, --speculative-config's
    disable_lookahead_block_hashes (0.33+); each toy model its engine refuses
    to build (the Qwen3-Next toys asked with their speculative decoding: the
    model's own MTP module, an EAGLE3 drafter) or builds with a layout
    kvspec's state model does not know (0.25's Nemotron-H: Mamba groups
    without prefix caching, ``mamba_none``); ``match_unit``,
    --prefix-match-unit (0.28+), asked on the toy Qwen3-Next where it is
    drawn; ``multi_module_mtp``, the toy Qwen3-Next with two MTP modules and
    two speculative tokens (vLLM's ``use_multi_module_mtp``, 0.27+).  A refusal in kvspec's own code, or an environment's, is not the
    release's answer: the option stays drawn and the run meets it."""
    def refused(opened) -> bool:
        return not opened.ok and not opened.error.in_kvspecs_code and not opened.failed_as(ErrorKind.ENVIRONMENT)

    out: dict[str, str] = {}
    retention = EngineSetup(model="toy-gpt-oss", num_gpu_blocks=64, retention_interval=0)
    why = _refusal(proc, retention, lambda opened: opened.failed_as(ErrorKind.UNSUPPORTED)
                   and "prefix_cache_retention_interval" in opened.error.message)
    if why:
        out["retention"] = why
    legacy = EngineSetup(model="toy-llama", num_gpu_blocks=64, num_speculative_tokens=1, legacy_hashes=True)
    why = _refusal(proc, legacy, lambda opened: refused(opened)
                   and "disable_lookahead_block_hashes" in opened.error.message)
    if why:
        out["legacy_hashes"] = why
    def unmodelled(setup: EngineSetup) -> str | None:
        """Why ``setup``'s engine is not drawn ("": it is), None: undecided."""
        try:
            opened = proc.session(OpenEngine(setup.message()))
        except KvspecError:
            return None
        if refused(opened):
            return "vLLM refused to build it: " + " ".join(opened.error.message.split())[:300]
        if opened.ok:
            try:
                derived_config(opened.payload.derived)
            except KvspecError as error:
                return f"its engine builds a layout kvspec cannot model ({error})"
        return ""

    for toy in TOY_MODELS:
        if not toy.hybrid:
            continue
        probe = EngineSetup(model=toy.name, num_gpu_blocks=64,
                            num_speculative_tokens=1 if toy.name in QWEN3_NEXT_TOYS else None)
        why = unmodelled(probe)
        if why and "mamba_none" in why:
            # Before 0.28 a hybrid's Mamba groups cache nothing by default; aligned, they are modelled.
            aligned = unmodelled(attrs.evolve(probe, mamba_cache_mode="align", prefix_caching=True))
            if aligned == "":
                out["mamba_default"] = ("its hybrids' Mamba groups cache no prefix by default (mamba_none), a "
                                        "layout kvspec's state model does not know")
                continue
            why = why if aligned is None else aligned
        if why is None:
            return out  # undecided: the run's own first engine meets the same error and stops as it should
        if why:
            out[toy.name] = why
    if MTP_TOY not in out:
        unit = EngineSetup(model=MTP_TOY, num_gpu_blocks=64, prefix_match_unit=16)
        why = _refusal(proc, unit, lambda opened: refused(opened) and "prefix_match_unit" in opened.error.message)
        if why:
            out["match_unit"] = why
        why = _multi_module_mtp(proc, as_the_release_takes(EngineSetup(
            model=MTP_TOY, num_gpu_blocks=64, num_speculative_tokens=2, num_nextn_predict_layers=2), out), refused)
        if why:
            out["multi_module_mtp"] = why
    return out


def _multi_module_mtp(proc: SubjectProcess, probe: EngineSetup, refused: Callable[[Any], bool]) -> str:
    """Why the release does not take multi-module MTP on the MTP toy (""
    it does): it refuses two MTP modules with two speculative tokens, or its
    SpeculativeConfig has no use_multi_module_mtp (before 0.27: it knows no
    multi-module drafter), or says the setup is not one."""
    try:
        opened = proc.session(OpenEngine(probe.message()))
    except KvspecError:
        return ""  # undecided: the run's own engines meet the same error
    if refused(opened):
        return "vLLM refused to build it: " + " ".join(opened.error.message.split())[:300]
    if not opened.ok:
        return ""
    multi = opened.payload.derived.get("multi_module_mtp")
    if multi is None:
        return ("this release's SpeculativeConfig has no use_multi_module_mtp (it has no multi-module MTP: its "
                "scheduler reserves no prefill lookahead for the modules)")
    if not multi:
        return ("its SpeculativeConfig.use_multi_module_mtp() says two MTP modules with two speculative tokens "
                "are not multi-module MTP")
    return ""


@attrs.frozen
class EngineStepRecord:
    """One operation of a recorded engine program as it ran: its answer
    (states made whole; None where the worker's ``reply`` is all there is:
    the engine's build, op ``open``, and the operation vLLM raised on), and
    what broke (nothing: every rule held)."""

    op: dict[str, Any]
    answer: OpAnswer | None = None
    found: tuple[Discrepancy, ...] = ()
    reply: Reply | None = None

    @property
    def record(self) -> dict[str, Any]:
        """The JSON object the worker sent for it, states made whole: what a
        finding or a run's JSON keeps."""
        return record_of(self.answer if self.answer is not None else self.reply)


def drive_engine_program(proc: SubjectProcess, program: EngineProgram, *, through: bool = False,
                         oracle_out: list[StateOracle] | None = None,
                         bound_out: list[RegistrationBound] | None = None) -> Iterator[EngineStepRecord]:
    """Run a recorded engine program on ``proc``, checking every operation:
    first the engine's build (op ``open``, whose reply says what vLLM
    derived), then one record per operation up to the first that broke a
    rule (or vLLM raised); a subject that cannot build the engine raises.
    ``through``: every operation's record, past broken rules (the oracle goes
    on; the impact measurement reads what follows), up to vLLM raising.
    ``oracle_out`` receives the oracle (its lookups' owed hits), ``bound_out``
    the registration bound every ``cache_blocks`` call is held to (the calls
    it held)."""
    opened = proc.session(OpenEngine(program.setup.message()))
    if opened.ok:
        yield EngineStepRecord({"do": "open"}, reply=opened)
    else:
        if opened.failed_as(ErrorKind.ENVIRONMENT):
            raise SetupError(f"the vLLM runtime cannot import what the engine needs ({opened.error.message})")
        if opened.error.in_kvspecs_code:
            raise InfrastructureError(f"kvspec's engine driver failed building {program.setup.describe()}: "
                                      f"{opened.error.message} (a kvspec bug)")
        if opened.failed_as(ErrorKind.UNSUPPORTED):
            raise InfrastructureError(f"this subject cannot build the engine: {opened.error.message}")
        yield EngineStepRecord({"do": "open"}, found=(StateOracle.refused(opened.error),), reply=opened)
        return
    engine = opened.payload
    config = derived_config(engine.derived)
    oracle = StateOracle(program, proc.capabilities, engine.state, config=config,
                         retention=retention_layout(engine.derived, config))
    bound = RegistrationBound(engine.derived, proc.capabilities)
    if oracle_out is not None:
        oracle_out.append(oracle)
    if bound_out is not None:
        bound_out.append(bound)
    reply = proc.session(EngineOps(dict(op) for op in program.ops))
    seen = []
    for op, answer in zip(program.ops, reply.payload.answers):
        answer, found = check_answer(oracle, op, answer, through=through, bound=bound)
        seen.append(answer)
        yield EngineStepRecord(op, answer, tuple(found))
        if found and not through:
            return
    if not reply.ok:
        if reply.failed_as(ErrorKind.KVSPEC):
            raise InfrastructureError(f"the engine program cannot run on this subject: {reply.error.message}")
        index = reply.error.index
        op = program.ops[index] if index is not None and index < len(program.ops) else None
        yield EngineStepRecord(op or {"do": "unknown"},
                               found=(engine_crash(op, reply.error, reply.payload.allocations, config.groups) if op
                                      else StateOracle.crash(None, reply.error),),
                               reply=reply.with_answers(seen))


def replay_engine_program(proc: SubjectProcess, program: EngineProgram) -> tuple[list[Discrepancy], dict[str, Any]]:
    """Run a recorded engine program on ``proc``, checking every operation:
    the discrepancies of the first that has any and its answer, or none and
    every operation's answer (it passes here)."""
    answers = []
    for record in drive_engine_program(proc, program):
        if record.found:
            return list(record.found), record.record
        if record.op["do"] != "open":
            answers.append(record.record)
    return [], {"ok": True, "answers": answers}
