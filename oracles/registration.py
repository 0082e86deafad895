"""The executable oracle: the spec's prediction for a subject's observations.

The oracle derives the regime itself (``model.capabilities``: from the
configuration and the subject's introspected capabilities) and never adopts
the subject's flags:
if vLLM's effective regime differs, that is a regime mismatch of its own
kind.  For each ``cache_blocks(n)`` call it predicts every group's bound and
registered full blocks with ``model.spec``, on the integer backend.
"""

from __future__ import annotations

from typing import Any

import attrs

from kvspec.model.capabilities import Capabilities, ExpectedRegime, expected_regime
from kvspec.model.case import Case
from kvspec.model.domain import GroupKind, GroupRegistration
from kvspec.model.engine import derived_config
from kvspec.model.finding import Category
from kvspec.model.replies import ErrorKind, MalformedReply, Reply
from kvspec.model.spec import RegistrationRule, StepsRule, evaluate_config, registration_bound

__all__ = ["Discrepancy", "expected_calls", "compare", "check_calls", "RegistrationBound"]

# Categories whose summary is their detail text (no per-group token vectors).
DETAIL_CATEGORIES = (Category.PRECONDITION, Category.REGIME_MISMATCH, Category.SUBJECT_CRASH,
                     Category.CALL_MISMATCH, Category.LOOKUP_CONTRACT, Category.HIT_MISMATCH,
                     *(c for c in Category if c.is_state))


def _kinds(kinds) -> tuple[GroupKind, ...]:
    return tuple(GroupKind(k) for k in kinds)


@attrs.frozen
class Discrepancy:
    # Lookup-side categories (oracles.lookup) keep the hit length in
    # expected/observed_tokens.
    category: Category = attrs.field(converter=Category)
    call: int | None  # index of the cache_blocks call (None: whole example)
    n: int | None
    expected_tokens: tuple[int, ...] = ()
    observed_tokens: tuple[Any, ...] = ()
    expected_blocks: tuple[int, ...] = ()
    observed_blocks: tuple[Any, ...] = ()
    detail: str = ""
    # At a differing cache_blocks call: the hashed tokens there, the spec's
    # per-group registrations with their derivations, and the spec's tokens
    # at every call up to it (what a finding and its regression test show).
    hashed_tokens: int | None = None
    registrations: tuple[GroupRegistration, ...] = ()
    expected_calls: tuple[tuple[int, ...], ...] = ()
    # The kinds of the groups the broken rule names as breaking it (a state
    # invariant's, or an allocation that raised): the mechanism a known vLLM
    # bug is recognised by (model.known); empty when it names none.
    group_kinds: tuple[GroupKind, ...] = attrs.field(default=(), converter=_kinds)

    def summary(self) -> str:
        if self.category in DETAIL_CATEGORIES:
            return f"{self.category.value}: {self.detail}"
        return (
            f"{self.category.value} at cache_blocks call {self.call} (n={self.n}): per-group tokens "
            f"expected {list(self.expected_tokens)} vs observed {list(self.observed_tokens)}; "
            f"blocks expected {list(self.expected_blocks)} vs observed {list(self.observed_blocks)}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {**attrs.asdict(self, recurse=True), "category": self.category.value,
                "group_kinds": [k.value for k in self.group_kinds]}


def expected_calls(case: Case, regime: ExpectedRegime, observed: list[dict],
                   rule: RegistrationRule = registration_bound, steps: StepsRule | None = None):
    """Per call: the rule's per-group tokens, (running) registered blocks and
    per-group registrations (with their derivation when the steps are known).

    The call's ``n`` and hashed-token count are inputs of the unit under test
    (what ``KVCacheManager`` hands the coordinator), taken from the record.
    """
    return _expected(case.config, regime, observed, rule, steps)


def _expected(config, regime: ExpectedRegime, observed: list[dict], rule: RegistrationRule,
              steps: StepsRule | None):
    registered: tuple[int, ...] = (0,) * len(config.groups)
    out = []
    for call in observed:
        predicted = _predicted(config, regime, call, registered, rule, steps)
        registered = predicted[1]
        out.append(predicted)
    return out


def _predicted(config, regime: ExpectedRegime, call: dict, registered: tuple[int, ...], rule: RegistrationRule,
               steps: StepsRule | None):
    """One call's prediction after calls that left ``registered`` full blocks
    per group: the rule's per-group tokens, the registered blocks after it and
    the per-group registrations."""
    n, hashed = call["n"], call["hashed_tokens"]
    regs = evaluate_config(
        config, n, max(n, hashed), rule, steps=steps,
        partial=regime.partial_hash_hits, eagle=regime.eagle,
        lookahead=regime.num_prefill_lookahead, hashed=hashed,
    )
    tokens = tuple(r.tokens_to_cache for r in regs)
    # A manager's registered count only grows: it skips a call that would
    # register no more full blocks than it already has.
    return tokens, tuple(max(old, r.registered_full_blocks) for old, r in zip(registered, regs)), regs


def compare(case: Case, capabilities: Capabilities, reply: Reply,
            rule: RegistrationRule = registration_bound) -> list[Discrepancy]:
    """Discrepancies between the spec's prediction and one subject reply."""
    if reply.error is not None:
        if reply.error.kind is ErrorKind.CONSTRUCT:
            return [Discrepancy(Category.PRECONDITION, None, None,
                                detail=f"vLLM rejects a configuration the model accepts: {reply.error.message}")]
        return [Discrepancy(Category.SUBJECT_CRASH, None, None, detail=reply.error.message)]
    regime = expected_regime(case.config, capabilities)
    observed_regime = reply.regime
    if observed_regime is None:
        raise MalformedReply("a case reply that is ok carries the regime vLLM chose")
    found: list[Discrepancy] = []
    if observed_regime.partial_hash_hits != regime.partial_hash_hits:
        found.append(Discrepancy(
            Category.REGIME_MISMATCH, None, None,
            detail=f"partial hash hits: the model derives {regime.partial_hash_hits}, "
                   f"vLLM chose {observed_regime.partial_hash_hits}"))
    if observed_regime.use_eagle != regime.eagle:
        found.append(Discrepancy(
            Category.REGIME_MISMATCH, None, None,
            detail=f"per-group EAGLE: the model derives {list(regime.eagle)}, "
                   f"vLLM chose {list(observed_regime.use_eagle)}"))
    if found:
        return found  # a bound under another regime would only restate it
    calls = reply["calls"]
    # Every allocate_slots step calls cache_blocks exactly once.
    if len(calls) != len(case.steps):
        return [Discrepancy(Category.CALL_MISMATCH, None, None,
                            detail=f"{len(calls)} cache_blocks calls for {len(case.steps)} steps")]
    return _first_difference(calls, expected_calls(case, regime, calls, rule))


def check_calls(config, regime: ExpectedRegime, calls: list[dict],
                rule: RegistrationRule = registration_bound) -> list[Discrepancy]:
    """The first of one request's ``cache_blocks`` calls (as the subject
    recorded them: ``n``, hashed tokens, each group's ``num_tokens`` and
    registered blocks) whose registration differs from ``rule``'s on the
    configuration ``config`` under ``regime``; the same comparison as
    ``compare``'s, for calls a scheduler made (the engine's)."""
    return _first_difference(calls, _expected(config, regime, calls, rule, None))


def _first_difference(calls: list[dict], predicted) -> list[Discrepancy]:
    for index, call in enumerate(calls[:len(predicted)]):
        found = _difference(index, call, predicted)
        if found is not None:
            return [found]  # later calls inherit the first difference
    return []


def _difference(index: int, call: dict, predicted) -> Discrepancy | None:
    """Call ``index``'s discrepancy against ``predicted`` (every call's
    prediction up to it at least), or None: it registered what the rule does."""
    tokens, blocks, regs = predicted[index]
    seen_tokens = tuple(call["num_tokens"])
    seen_blocks = tuple(call["registered_blocks"])
    if seen_tokens == tokens and seen_blocks == blocks:
        return None
    if seen_tokens != tokens:
        over = any(s is not None and s > e for s, e in zip(seen_tokens, tokens))
        category = Category.OVER_REGISTRATION if over else Category.UNDER_REGISTRATION
    else:
        category = Category.BLOCK_MISMATCH
    return Discrepancy(
        category, index, call["n"], tokens, seen_tokens, blocks, seen_blocks,
        hashed_tokens=call["hashed_tokens"], registrations=regs,
        expected_calls=tuple(t for t, _, _ in predicted[:index + 1]))


class RegistrationBound:
    """Every ``cache_blocks`` call vLLM's real Scheduler makes (the engine
    worker records each, per request: ``n``, the hashed tokens, each group's
    ``num_tokens`` and registered blocks after it) held to the registration
    bound, as the registration differential holds its calls (``check_calls``:
    the same prediction, call by call), on the geometry and regime vLLM built
    for the engine: on layouts of two or more groups with prefix caching on
    (the hybrid coordinator, whose bound it is).

    A request's calls are held together for one life of its blocks: the
    manager forgets what a request registered when it gives its blocks back
    (a preemption, a failed load freed, a deferred free), so the worker
    stamps each call with how often that happened before it (``life``) and a
    new life starts afresh.  A life's first call starts from the blocks the
    manager counted registered when it allocated the request's blocks
    (``registered_before``: a prefix-cache hit's blocks, and after a KV
    connector's load the null blocks standing for the groups' skipped blocks),
    which no ``cache_blocks`` call registered; the calls after it are
    predicted from it as the registration differential predicts a request's
    calls from none."""

    def __init__(self, derived: dict[str, Any], capabilities: Capabilities) -> None:
        self.config = derived_config(derived)
        self.regime = expected_regime(self.config, capabilities)
        # Nothing is registered (the coordinator without a prefix cache), or
        # one group: vLLM's unitary coordinator hands each call's n to the
        # group as is (it registers the whole blocks of it); the bound is the
        # hybrid coordinator's, as in the registration differential.
        self.live = bool(self.config.enable_caching and len(self.config.groups) >= 2)
        self.calls: dict[str, list[dict[str, Any]]] = {}  # per request, its calls in this life of its blocks
        self._predicted: dict[str, list[Any]] = {}
        self._life: dict[str, int] = {}
        self.checked = 0  # calls held to the bound
        self.lives = 0  # requests' calls started afresh after their blocks were given back

    def __call__(self, answer: Any) -> list[Discrepancy]:
        """The first call of ``answer`` (an ``OpAnswer``: every part, a
        step's schedule() then its output) outside the bound."""
        for part in answer.parts():
            found = self.check(part.result.registrations)
            if found:
                return found
        return []

    def check(self, calls) -> list[Discrepancy]:
        """The first of ``calls`` (one part's, in the order vLLM made them) outside the bound."""
        if not self.live:
            return []
        for call in calls:
            request = call["request"]
            life = call.get("life", 0)
            if self._life.get(request, life) != life:
                self.lives += 1
                self.calls.pop(request, None)
                self._predicted.pop(request, None)
            self._life[request] = life
            held = self.calls.setdefault(request, [])
            predicted = self._predicted.setdefault(request, [])
            registered = predicted[-1][1] if predicted else tuple(
                call.get("registered_before") or (0,) * len(self.config.groups))
            held.append(call)
            predicted.append(_predicted(self.config, self.regime, call, registered, registration_bound, None))
            self.checked += 1
            found = _difference(len(held) - 1, call, predicted)
            if found is not None:
                return [attrs.evolve(found, detail=f"request {request}'s cache_blocks call {found.call} through "
                                                   f"the real Scheduler")]
        return []
