"""The lookup oracle: what a later request's cache hit may and must be.

After the writer's steps, a later request sharing the writer's first
``shared`` tokens calls vLLM's ``get_computed_blocks``.  Two kinds of check,
both from ``model.lookup`` on the integer backend:

* the **contract**, for every layout: the hit is a landing point (a multiple
  of the hash block under partial hits, of the scheduler block otherwise),
  never longer than the shared prefix or the later request minus one token,
  and never needs more of a full-attention or sliding-window group than the
  writer handed to its ``cache_blocks`` (an EAGLE group also its drop tail),
  and every group answers the one hit with ``cdiv(hit, block)`` blocks.
  Mamba groups are left out of the last check: their state checkpoints are
  keyed by their own rules, not by the registration bound alone.
* the **exact hit**, where the model is complete: layouts of full-attention
  groups only (no Mamba group, so no partial hits).  Their cached blocks
  form a prefix, and the hit is ``dense_lookup_hit`` of what the spec says
  the writer registered.

Sliding-window and Mamba layouts get the contract only: their lookups
depend on retention masks and checkpoints the model does not describe, and a
prediction there could raise a false alarm.
"""

from __future__ import annotations

from typing import Any

from kvspec.model.arith import INT
from kvspec.model.capabilities import Capabilities, expected_regime
from kvspec.model.case import Case
from kvspec.model.domain import GroupKind
from kvspec.model.finding import Category
from kvspec.model.lookup import dense_lookup_hit, group_reach, hit_alignment, hit_blocks, lookup_need
from kvspec.model.replies import Reply
from kvspec.model.spec import inputs_for_group

from .registration import Discrepancy, compare, expected_calls

__all__ = ["exact_lookup_applies", "expected_hit", "handed_tokens", "contract_violations", "group_block_violations",
           "admissible_hits", "compare_lookup", "check_case"]

_CONTRACT_KINDS = (GroupKind.FULL_ATTENTION, GroupKind.SLIDING_WINDOW)


def exact_lookup_applies(case: Case) -> bool:
    """Whether the model predicts the hit exactly: full-attention groups only,
    prefix caching on."""
    return case.config.enable_caching and all(
        g.kind is GroupKind.FULL_ATTENTION for g in case.config.groups)


def expected_hit(case: Case, capabilities: Capabilities, calls: list[dict]) -> int:
    """The spec's hit for ``case.probe`` given the writer's recorded calls
    (their ``n`` and hashed tokens are the inputs; what was registered is the
    spec's, not the subject's)."""
    config, probe = case.config, case.probe
    regime = expected_regime(config, capabilities)
    predicted = expected_calls(case, regime, calls)
    registered_blocks = predicted[-1][1] if predicted else (0,) * len(config.groups)
    groups, reaches = [], []
    for i, group in enumerate(config.groups):
        p = inputs_for_group(config, i, 0, partial=regime.partial_hash_hits,
                             eagle=regime.eagle[i], lookahead=regime.num_prefill_lookahead)
        groups.append(p)
        reaches.append(group_reach(INT, registered_blocks[i] * group.block_size, probe.shared,
                                   probe.total_tokens, config.hash_block_size))
    return dense_lookup_hit(INT, groups, reaches, probe.total_tokens - 1)


def handed_tokens(case: Case, reply: dict[str, Any]) -> list[int]:
    """Per group, the most tokens the writer handed to its ``cache_blocks``."""
    handed = [0] * len(case.config.groups)
    for call in reply.get("calls", ()):
        handed = [max(h, t or 0) for h, t in zip(handed, call["num_tokens"])]
    return handed


def contract_violations(case: Case, capabilities: Capabilities, hit: int,
                        handed: list[int]) -> list[str]:
    """What a hit of ``hit`` tokens for ``case.probe`` breaks of the contract
    (empty: the contract admits it), given what the writer handed each group."""
    config, probe = case.config, case.probe
    assert probe is not None
    regime = expected_regime(config, capabilities)
    found: list[str] = []
    p0 = inputs_for_group(config, 0, 0, partial=regime.partial_hash_hits)
    unit = hit_alignment(INT, p0)
    if hit % unit:
        found.append(f"hit {hit} is not a multiple of the hit alignment {unit}")
    if hit > probe.shared:
        found.append(f"hit {hit} is past the {probe.shared} shared tokens")
    if hit > probe.total_tokens - 1:
        found.append(f"hit {hit} leaves no token of the {probe.total_tokens}-token request to compute")
    if hit > 0:
        for i, group in enumerate(config.groups):
            if group.kind not in _CONTRACT_KINDS:
                continue
            p = inputs_for_group(config, i, 0, partial=regime.partial_hash_hits,
                                 eagle=regime.eagle[i], lookahead=regime.num_prefill_lookahead)
            need = lookup_need(INT, p, hit, group.kind.fine_grained_lookup)
            if need > handed[i]:
                found.append(f"group {i} ({group.label()}) needs {need} tokens for hit {hit}, "
                             f"the writer registered at most {handed[i]}")
    return found


def group_block_violations(case: Case, hit: int, counts: list[int] | None) -> list[str]:
    """Groups whose answer to the hit does not hold ``hit_blocks`` blocks
    (one hit, one block count per group).  Not checked under DCP, where a
    manager's block is the spec's times the DCP size, nor on a reply that
    does not say (a worker of an older kvspec)."""
    groups = case.config.groups
    if counts is None or case.config.dcp_world_size != 1 or len(counts) != len(groups):
        return []
    return [f"group {i} ({g.label()}) holds {n} blocks for a hit of {hit}; every group holds "
            f"cdiv({hit}, {g.block_size}) = {hit_blocks(INT, hit, g.block_size)}"
            for i, (g, n) in enumerate(zip(groups, counts)) if n != hit_blocks(INT, hit, g.block_size)]


def admissible_hits(case: Case, capabilities: Capabilities, handed: list[int]) -> list[int]:
    """Every hit length the contract admits for ``case.probe``."""
    assert case.probe is not None
    return [h for h in range(case.probe.total_tokens)
            if not contract_violations(case, capabilities, h, handed)]


def compare_lookup(case: Case, capabilities: Capabilities, reply: Reply) -> list[Discrepancy]:
    """Discrepancies of the later request's hit (empty if the reply has no
    probe, e.g. the writer already failed: ``oracle.compare`` reports that)."""
    if not reply.ok or case.probe is None or "probe" not in reply:
        return []
    probe = case.probe
    hit = reply["probe"]["hit"]
    found = contract_violations(case, capabilities, hit, handed_tokens(case, reply))
    found += group_block_violations(case, hit, reply["probe"].get("group_blocks"))
    if found:
        return [Discrepancy(Category.LOOKUP_CONTRACT, None, None, (), (hit,), detail="; ".join(found))]
    if exact_lookup_applies(case):
        expected = expected_hit(case, capabilities, reply.get("calls", []))
        if hit != expected:
            return [Discrepancy(Category.HIT_MISMATCH, None, None, (expected,), (hit,),
                                detail=f"later request sharing {probe.shared} of "
                                       f"{probe.total_tokens} tokens: hit expected {expected}, "
                                       f"observed {hit}")]
    return []


def check_case(case: Case, caps: Capabilities, reply: Reply) -> list[Discrepancy]:
    """Every check a reply is subject to: registration first (a lookup after a
    wrong registration would only restate it), then the later request's hit
    when the case has a lookup probe."""
    return compare(case, caps, reply) or compare_lookup(case, caps, reply)
