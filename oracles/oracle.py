"""The executable oracle: the spec's prediction for a subject's observations.

The oracle derives the regime itself (from the configuration and the
subject's introspected capabilities) and never adopts the subject's flags:
if vLLM's effective regime differs, that is a regime mismatch of its own
kind.  For each ``cache_blocks(n)`` call it predicts every group's bound and
registered full blocks with ``model.spec``, on the integer backend.
"""

from __future__ import annotations

from typing import Any

import attrs

from model.domain import CoordinatorConfig, derive_partial_hash_hits
from model.spec import RegistrationRule, StepsRule, evaluate_config, registration_bound

from .case import Case

__all__ = ["ExpectedRegime", "Discrepancy", "expected_regime", "expected_calls", "compare"]

# Categories whose summary is their detail text (no per-group token vectors).
DETAIL_CATEGORIES = ("precondition", "regime_mismatch", "subject_crash", "call_mismatch",
                     "lookup_contract", "hit_mismatch")


@attrs.frozen
class ExpectedRegime:
    partial_hash_hits: bool
    eagle: tuple[bool, ...]
    num_prefill_lookahead: int


def expected_regime(config: CoordinatorConfig, capabilities: dict[str, Any]) -> ExpectedRegime:
    partial = bool(capabilities.get("partial_hash_hits")) and derive_partial_hash_hits(
        config, require_fine_grained_lookups=bool(capabilities.get("fine_grained_lookup_fallback"))
    )
    if capabilities.get("per_group_eagle"):
        eagle = config.effective_eagle
    else:  # one global use_eagle flag: every group is EAGLE
        eagle = tuple(config.any_eagle for _ in config.groups)
    lookahead = config.num_prefill_lookahead if capabilities.get("reprefillable_tokens") else 0
    return ExpectedRegime(partial, eagle, lookahead)


@attrs.frozen
class Discrepancy:
    # precondition | regime_mismatch | under_registration | over_registration |
    # block_mismatch | subject_crash | call_mismatch; lookup side (oracles.lookup):
    # lookup_contract | hit_mismatch (expected/observed_tokens hold the hit length)
    category: str
    call: int | None  # index of the cache_blocks call (None: whole example)
    n: int | None
    expected_tokens: tuple[int, ...] = ()
    observed_tokens: tuple[Any, ...] = ()
    expected_blocks: tuple[int, ...] = ()
    observed_blocks: tuple[Any, ...] = ()
    detail: str = ""

    def summary(self) -> str:
        if self.category in DETAIL_CATEGORIES:
            return f"{self.category}: {self.detail}"
        return (
            f"{self.category} at cache_blocks call {self.call} (n={self.n}): per-group tokens "
            f"expected {list(self.expected_tokens)} vs observed {list(self.observed_tokens)}; "
            f"blocks expected {list(self.expected_blocks)} vs observed {list(self.observed_blocks)}"
        )

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def expected_calls(case: Case, regime: ExpectedRegime, observed: list[dict],
                   rule: RegistrationRule = registration_bound, steps: StepsRule | None = None):
    """Per call: the rule's per-group tokens, (running) registered blocks and
    per-group registrations (with their derivation when the steps are known).

    The call's ``n`` and hashed-token count are inputs of the unit under test
    (what ``KVCacheManager`` hands the coordinator), taken from the record.
    """
    config = case.config
    registered = [0] * len(config.groups)
    out = []
    for call in observed:
        n, hashed = call["n"], call["hashed_tokens"]
        regs = evaluate_config(
            config, n, max(n, hashed), rule, steps=steps,
            partial=regime.partial_hash_hits, eagle=regime.eagle,
            lookahead=regime.num_prefill_lookahead,
        )
        tokens = tuple(r.tokens_to_cache for r in regs)
        # A manager's registered count only grows: it skips a call that would
        # register no more full blocks than it already has.
        registered = [max(old, r.registered_full_blocks) for old, r in zip(registered, regs)]
        out.append((tokens, tuple(registered), regs))
    return out


def compare(case: Case, capabilities: dict[str, Any], reply: dict[str, Any],
            rule: RegistrationRule = registration_bound) -> list[Discrepancy]:
    """Discrepancies between the spec's prediction and one subject reply."""
    if not reply.get("ok"):
        if reply.get("phase") == "construct":
            return [Discrepancy("precondition", None, None,
                                detail=f"vLLM rejects a configuration the model accepts: {reply['error']}")]
        return [Discrepancy("subject_crash", None, None, detail=reply.get("error", "unknown error"))]
    regime = expected_regime(case.config, capabilities)
    observed_regime = reply["regime"]
    found: list[Discrepancy] = []
    if observed_regime["partial_hash_hits"] != regime.partial_hash_hits:
        found.append(Discrepancy(
            "regime_mismatch", None, None,
            detail=f"partial hash hits: the model derives {regime.partial_hash_hits}, "
                   f"vLLM chose {observed_regime['partial_hash_hits']}"))
    if tuple(observed_regime["use_eagle"]) != regime.eagle:
        found.append(Discrepancy(
            "regime_mismatch", None, None,
            detail=f"per-group EAGLE: the model derives {list(regime.eagle)}, "
                   f"vLLM chose {observed_regime['use_eagle']}"))
    if found:
        return found  # a bound under another regime would only restate it
    calls = reply["calls"]
    # Every allocate_slots step calls cache_blocks exactly once.
    if len(calls) != len(case.steps):
        return [Discrepancy("call_mismatch", None, None,
                            detail=f"{len(calls)} cache_blocks calls for {len(case.steps)} steps")]
    for index, (call, (tokens, blocks, _)) in enumerate(zip(calls, expected_calls(case, regime, calls, rule))):
        seen_tokens = tuple(call["num_tokens"])
        seen_blocks = tuple(call["registered_blocks"])
        if seen_tokens != tokens:
            over = any(s is not None and s > e for s, e in zip(seen_tokens, tokens))
            found.append(Discrepancy(
                "over_registration" if over else "under_registration", index, call["n"],
                tokens, seen_tokens, blocks, seen_blocks))
            break  # later calls inherit the first difference
        if seen_blocks != blocks:
            found.append(Discrepancy("block_mismatch", index, call["n"], tokens, seen_tokens,
                                     blocks, seen_blocks))
            break
    return found
