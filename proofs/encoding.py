"""The Z3 encoding of one group's registration query, and its decoding.

Symbols (all unbounded integers unless noted):
  n computed tokens, t total tokens of the request (hashed prefix = t
  rounded down to H), H hash block, B = m*H the group block, S = k*B the
  scheduler block, L num_prefill_lookahead, E (bool) the group's EAGLE flag,
  P (bool) partial hash hits.
Well-formedness is written with multipliers (B = m*H, S = k*B, m, k >= 1)
rather than ``%`` constraints: measured to be what z3 handles robustly.
The same assumptions are evaluated on integers to replay solver models.
"""

from __future__ import annotations

from typing import Any

import z3

from kvspec.model.arith import Arith, Z3Arith
from kvspec.model.domain import CoordinatorConfig, GroupKind, KVCacheGroup
from kvspec.model.spec import BoundaryInputs, RegistrationRule, evaluate_config

__all__ = [
    "Vars",
    "GEOMETRY_INTS",
    "GEOMETRY_BOOLS",
    "declare",
    "well_formed",
    "inputs",
    "decode_model",
    "decode_geometry",
]

GEOMETRY_INTS = ("n", "t", "S", "H", "B", "L", "m", "k")
GEOMETRY_BOOLS = ("E", "P")


class Vars(dict):
    """Named values (Z3 terms or concrete ints), readable as attributes."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def but(self, **changes: Any) -> "Vars":
        return Vars({**self, **changes})


def declare(ar: Z3Arith, ints: tuple[str, ...], bools: tuple[str, ...]) -> Vars:
    values = Vars({name: ar.var(name) for name in ints})
    values.update({name: ar.bool_var(name) for name in bools})
    return values


def well_formed(ar: Arith, v: Vars) -> Any:
    """vLLM's preconditions on one group's geometry (as the coordinator asserts)."""
    return ar.and_(
        v.H >= 1,
        v.m >= 1,
        v.k >= 1,
        v.B == v.m * v.H,  # a cacheable block is a multiple of the hash block
        v.S == v.k * v.B,  # the group block divides the scheduler block
        v.n >= 0,
        v.L >= 0,
        v.t >= v.n,  # block hashes cover the request's tokens, computed or not
        # The lookahead guard: caching with EAGLE needs S >= num_prefill_lookahead.
        ar.implies(v.E, v.L <= v.S),
        # Partial hits need a Mamba "align" group with a block coarser than H
        # that divides S, hence H < S.
        ar.implies(v.P, v.H < v.S),
    )


def inputs(v: Vars, n: Any = None, L: Any = None) -> BoundaryInputs:
    return BoundaryInputs(
        n=v.n if n is None else n,
        S=v.S, H=v.H, B=v.B,
        L=v.L if L is None else L,
        eagle=v.E, partial=v.P,
    )


def decode_model(model: z3.ModelRef, v: Vars) -> dict[str, Any]:
    """A solver model as plain ints and bools (every symbol, completed)."""
    out: dict[str, Any] = {}
    for name, term in v.items():
        value = model.eval(term, model_completion=True)
        out[name] = z3.is_true(value) if z3.is_bool(term) else value.as_long()
    return out


def decode_geometry(values: dict[str, Any]) -> CoordinatorConfig:
    """A realizable vLLM configuration for one decoded query.

    Group 0 is the group the query is about (full attention, block B, EAGLE
    flag E).  Group 1 makes the regime what the query assumed: a Mamba
    "align" group of block S (> H, so partial hits are derived on) when P, a
    sliding-window group of block S otherwise (no Mamba group: partial hits
    off).  Neither can be an unflagged twin of group 0, so group 1 is never
    EAGLE.
    """
    S, H, B = values["S"], values["H"], values["B"]
    subject = KVCacheGroup(GroupKind.FULL_ATTENTION, B, eagle=values["E"])
    if values["P"]:
        partner = KVCacheGroup(GroupKind.MAMBA_ALIGN, S)
    else:
        partner = KVCacheGroup(GroupKind.SLIDING_WINDOW, S, sliding_window=S)
    config = CoordinatorConfig(
        groups=(subject, partner),
        scheduler_block_size=S,
        hash_block_size=H,
        num_prefill_lookahead=values["L"],
    )
    if config.partial_hash_hits != values["P"]:
        raise AssertionError(f"decoded regime differs from the model's P: {values}")
    return config


def domain_view(
    values: dict[str, Any], rules: dict[str, RegistrationRule], n_names: tuple[str, ...] = ("n",)
) -> dict[str, Any]:
    """The example in vLLM's vocabulary: configuration and per-group results."""
    config = decode_geometry(values)
    calls = []
    for n_name in n_names:
        n = values[n_name]
        per_rule = {}
        for label, rule in rules.items():
            regs = evaluate_config(config, n, max(values["t"], n), rule)
            per_rule[label] = {
                "tokens": [r.tokens_to_cache for r in regs],
                "blocks": [r.registered_full_blocks for r in regs],
                "derivation": [r.as_dict() for r in regs],
            }
        calls.append({"num_computed_tokens": n, "total_tokens": max(values["t"], n), **per_rule})
    return {
        "config": config.describe(),
        "scheduler_block_size": config.scheduler_block_size,
        "hash_block_size": config.hash_block_size,
        "num_prefill_lookahead": config.num_prefill_lookahead,
        "groups": [g.label() for g in config.groups],
        "partial_hash_hits": config.partial_hash_hits,
        "calls": calls,
    }
