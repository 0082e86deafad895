"""Lookup-side operators: the hit a later request gets, not what is registered.

Registration is untouched, so the registration differential cannot kill
them; the hit-length differential (``oracles.lookup``) must.
"""

from __future__ import annotations

import ast

from .operator import COORDINATOR_FILE, MANAGER_FILE, MutationOperator
from .source import Edit, Missing, Source, exactly_one, find_class, find_method, is_name, walk

__all__ = ["LOOKUP_MUTANTS"]

HYBRID_CLASS = "HybridKVCacheCoordinator"
FULL_ATTENTION_CLASS = "FullAttentionManager"


def _full_attention_lookup(src: Source) -> tuple[str, ast.FunctionDef]:
    cls = find_class(src.tree, FULL_ATTENTION_CLASS)
    method = find_method(cls, "find_longest_cache_hit")
    if method is None:
        raise Missing(f"{FULL_ATTENTION_CLASS}.find_longest_cache_hit")
    return f"{FULL_ATTENTION_CLASS}.find_longest_cache_hit", method


def _is_hit_decrement(node: ast.AST, hit: str) -> bool:
    return isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Sub) and is_name(node.target, hit)


def _drop_eagle_removed(src: Source) -> tuple[str, list[Edit]]:
    where, method = _full_attention_lookup(src)
    branch = exactly_one(
        [
            n for n in walk(method.body)
            if isinstance(n, ast.If)
            and isinstance(n.test, ast.BoolOp) and isinstance(n.test.op, ast.And)
            and any(is_name(v, "drop_eagle_block") for v in n.test.values)
            and len(n.body) == 1 and _is_hit_decrement(n.body[0], "hit_length")
        ],
        f"`if drop_eagle_block and ...: hit_length -= ...` in {where}",
    )
    return where, [src.replace(branch.body[0], "pass")]


def _alignment_round_removed(src: Source) -> tuple[str, list[Edit]]:
    where, method = _full_attention_lookup(src)
    stmt = exactly_one(
        [
            n for n in method.body
            if _is_hit_decrement(n, "hit_length")
            and isinstance(n.value, ast.BinOp) and isinstance(n.value.op, ast.Mod)
            and is_name(n.value.left, "hit_length") and is_name(n.value.right, "alignment_tokens")
        ],
        f"`hit_length -= hit_length % alignment_tokens` in {where}",
    )
    return where, [src.replace(stmt, "pass")]


def _eagle_margin_removed(src: Source) -> tuple[str, list[Edit]]:
    cls = find_class(src.tree, HYBRID_CLASS)
    where = f"{HYBRID_CLASS}.find_longest_cache_hit"
    method = find_method(cls, "find_longest_cache_hit")
    if method is None:
        raise Missing(where)
    add = exactly_one(
        [
            n for n in walk(method.body)
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add)
            and is_name(n.left, "curr_hit_length") and is_name(n.right, "eagle_margin")
        ],
        f"`curr_hit_length + eagle_margin` in {where}",
    )
    return where, [src.replace(add, "curr_hit_length")]


LOOKUP_MUTANTS: tuple[MutationOperator, ...] = (
    MutationOperator(
        "eagle_drop_removed",
        "FullAttentionManager.find_longest_cache_hit never drops the EAGLE tail (no recompute before drafting)",
        "", _drop_eagle_removed, MANAGER_FILE, "lookup"),
    MutationOperator(
        "hit_alignment_removed",
        "FullAttentionManager.find_longest_cache_hit no longer rounds the hit down to alignment_tokens",
        "", _alignment_round_removed, MANAGER_FILE, "lookup"),
    MutationOperator(
        "eagle_margin_removed",
        "the coordinator looks an EAGLE group up to the candidate, not one drop unit past it (the #32802 shape)",
        "", _eagle_margin_removed, COORDINATOR_FILE, "lookup"),
)
