"""Registration-side operators: re-introduce a known-wrong registration rule.

No PyPI release of vLLM contains the #50062 regression (it lived only on main
between two PRs), and none contains the other wrong shapes of
``model.variants``.  Each operator here rewrites the registration rule of a
release tree so that it behaves like one named wrong variant of the model
(``models_variant``).

The rule is found by structure in one method (``manager.use_eagle and cached
> 0``, ``max(0, n - self.num_reprefillable_tokens)``, ``min(fin, aligned +
manager.block_size)``, ...); local variable names are not relied upon, so the
same operator applies to the 0.28-0.31 form (inside
``HybridKVCacheCoordinator.cache_blocks``) and the 0.32+ form
(``HybridKVCacheCoordinator.get_num_cacheable_tokens``).  Every operator needs
the complete #52419 anatomy; on older trees it is missing and the operator
raises ``MutationTargetNotFound`` rather than silently doing nothing.
"""

from __future__ import annotations

import ast
from typing import Callable

import attrs

from .operator import MutationOperator, Rewrite
from .source import (Edit, Missing, Source, exactly_one, find_class, find_method, floor_text, is_attr,
                     is_call, is_const, is_method_call, is_name, walk)

__all__ = ["REGISTRATION_MUTANTS"]

HYBRID_CLASS = "HybridKVCacheCoordinator"
BASE_CLASS = "KVCacheCoordinator"


@attrs.frozen
class _RuleAnatomy:
    """The #52419 registration rule, found by structure in one method."""

    src: Source
    method: ast.FunctionDef
    self_name: str  # the method's ``self`` parameter
    n_name: str  # its ``num_computed_tokens`` parameter
    guard: ast.BoolOp  # ``manager.use_eagle and cached > 0``
    guard_flag: ast.Attribute  # ``manager.use_eagle``
    guard_cmp: ast.Compare  # ``cached > 0``
    cached_name: str
    eagle_if: ast.If
    finalized_call: ast.Call  # ``max(0, n - self.num_reprefillable_tokens)``
    finalized_sub: ast.BinOp  # ``n - self.num_reprefillable_tokens``
    fin_name: str  # the variable holding the finalized tokens
    align_fin_call: ast.Call  # ``self._align_cacheable(fin)``
    bound_min: ast.Call  # ``min(fin, <aligned fin> + manager.block_size)``
    lookahead_add: ast.BinOp  # ``<aligned fin> + manager.block_size``
    non_eagle_value: ast.Name  # ``cached`` where it becomes the non-EAGLE result

    @property
    def qualname(self) -> str:
        return f"{HYBRID_CLASS}.{self.method.name}"


def _rule_method(tree: ast.Module) -> ast.FunctionDef:
    cls = find_class(tree, HYBRID_CLASS)
    for name in ("get_num_cacheable_tokens", "cache_blocks"):
        method = find_method(cls, name)
        if method is not None:
            return method
    raise Missing(f"{HYBRID_CLASS} defines neither get_num_cacheable_tokens nor cache_blocks")


def _rule_anatomy(src: Source) -> _RuleAnatomy:
    method = _rule_method(src.tree)
    where = f"{HYBRID_CLASS}.{method.name}"
    params = [a.arg for a in method.args.args]
    if len(params) < 2:
        raise Missing(f"{where}: expected (self, num_computed_tokens, ...) parameters")
    if method.name == "cache_blocks":
        if len(params) < 3:
            raise Missing(f"{where}: expected (self, request, num_computed_tokens)")
        self_name, n_name = params[0], params[2]
    else:
        self_name, n_name = params[0], params[1]

    # The EAGLE branch: ``if <mgr>.use_eagle and <cached> > 0:``.
    def is_guard(node: ast.AST) -> bool:
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.BoolOp)):
            return False
        t = node.test
        if not (isinstance(t.op, ast.And) and len(t.values) == 2):
            return False
        flag, cmp = t.values
        return (
            is_attr(flag, "use_eagle")
            and isinstance(cmp, ast.Compare)
            and is_name(cmp.left)
            and len(cmp.ops) == 1
            and isinstance(cmp.ops[0], ast.Gt)
            and is_const(cmp.comparators[0], 0)
        )

    eagle_if = exactly_one(
        [n for n in walk(method.body) if is_guard(n)],
        f"EAGLE branch `if <manager>.use_eagle and <cached> > 0:` in {where}",
    )
    guard = eagle_if.test
    guard_flag, guard_cmp = guard.values
    cached_name = guard_cmp.left.id
    body = list(eagle_if.body)

    # The cached value must come from ``self._align_cacheable(n)``.
    exactly_one(
        [
            n
            for n in walk(method.body)
            if isinstance(n, ast.Assign)
            and len(n.targets) == 1
            and is_name(n.targets[0], cached_name)
            and is_method_call(n.value, self_name, "_align_cacheable", 1)
            and is_name(n.value.args[0], n_name)
        ],
        f"`{cached_name} = {self_name}._align_cacheable({n_name})` in {where}"
        " (the #52419 shape, vLLM >= 0.28)",
    )

    # Finalized tokens: ``<fin> = max(0, n - self.num_reprefillable_tokens)``.
    def is_finalized(node: ast.AST) -> bool:
        if not is_call(node, "max", 2) or not is_const(node.args[0], 0):
            return False
        sub = node.args[1]
        return (
            isinstance(sub, ast.BinOp)
            and isinstance(sub.op, ast.Sub)
            and is_name(sub.left, n_name)
            and is_attr(sub.right, "num_reprefillable_tokens", self_name)
        )

    finalized_call = exactly_one(
        [n for n in walk(body) if is_finalized(n)],
        f"finalized tokens `max(0, {n_name} - {self_name}.num_reprefillable_tokens)`"
        f" in the EAGLE branch of {where} (pre-0.28 shape?)",
    )
    fin_assign = exactly_one(
        [
            n
            for n in walk(body)
            if isinstance(n, ast.Assign)
            and n.value is finalized_call
            and len(n.targets) == 1
            and is_name(n.targets[0])
        ],
        f"assignment of the finalized tokens to a local in {where}",
    )
    fin_name = fin_assign.targets[0].id

    align_fin_call = exactly_one(
        [
            n
            for n in walk(body)
            if is_method_call(n, self_name, "_align_cacheable", 1)
            and is_name(n.args[0], fin_name)
        ],
        f"`{self_name}._align_cacheable({fin_name})` in the EAGLE branch of {where}",
    )

    bound_min = exactly_one(
        [n for n in walk(body) if is_call(n, "min", 2)],
        f"`min(...)` in the EAGLE branch of {where}",
    )
    if not is_name(bound_min.args[0], fin_name):
        raise Missing(f"expected `min({fin_name}, ...)` in the EAGLE branch of {where}")
    manager_name = guard_flag.value.id if is_name(guard_flag.value) else None
    lookahead_add = bound_min.args[1]
    if not (
        isinstance(lookahead_add, ast.BinOp)
        and isinstance(lookahead_add.op, ast.Add)
        and is_attr(lookahead_add.right, "block_size", manager_name)
    ):
        raise Missing(
            f"expected `min({fin_name}, <aligned> + <manager>.block_size)` in {where}"
        )
    # The aligned finalized value reaches the bound either directly (0.32+)
    # or through one local (0.28-0.31).
    left = lookahead_add.left
    if left is not align_fin_call:
        holder = exactly_one(
            [
                n
                for n in walk(body)
                if isinstance(n, ast.Assign) and n.value is align_fin_call
                and len(n.targets) == 1 and is_name(n.targets[0])
            ],
            f"the aligned finalized tokens feeding the lookahead bound in {where}",
        )
        if not is_name(left, holder.targets[0].id):
            raise Missing(f"the lookahead bound in {where} does not use the aligned finalized tokens")

    # Where ``cached`` becomes the non-EAGLE result: ``return cached`` (0.32+)
    # or ``<to_cache> = cached`` (0.28-0.31), outside the EAGLE branch.
    inside = {id(n) for n in ast.walk(eagle_if)}
    non_eagle = [
        n.value
        for n in walk(method.body)
        if id(n) not in inside
        and isinstance(n, (ast.Return, ast.Assign))
        and (isinstance(n, ast.Return) or len(n.targets) == 1)
        and n.value is not None
        and is_name(n.value, cached_name)
    ]
    non_eagle_value = exactly_one(
        non_eagle, f"non-EAGLE result `{cached_name}` (a return or an assignment) in {where}"
    )

    return _RuleAnatomy(
        src=src,
        method=method,
        self_name=self_name,
        n_name=n_name,
        guard=guard,
        guard_flag=guard_flag,
        guard_cmp=guard_cmp,
        cached_name=cached_name,
        eagle_if=eagle_if,
        finalized_call=finalized_call,
        finalized_sub=finalized_call.args[1],
        fin_name=fin_name,
        align_fin_call=align_fin_call,
        bound_min=bound_min,
        lookahead_add=lookahead_add,
        non_eagle_value=non_eagle_value,
    )


# ---------------------------------------------------------------------------
# The rewrites.  Each returns (qualified name of the method it changes, edits).


def _on_rule(fn: Callable[[_RuleAnatomy], list[Edit]]) -> Rewrite:
    def rewrite(src: Source) -> tuple[str, list[Edit]]:
        a = _rule_anatomy(src)
        return a.qualname, fn(a)

    return rewrite


@_on_rule
def _refloor(a: _RuleAnatomy) -> list[Edit]:
    return [a.src.replace(a.align_fin_call, floor_text(a.fin_name, a.self_name, "scheduler_block_size"))]


@_on_rule
def _drop_lookahead(a: _RuleAnatomy) -> list[Edit]:
    return [a.src.replace(a.lookahead_add, f"({a.src.segment(a.lookahead_add.left)})")]


@_on_rule
def _ignore_finalized(a: _RuleAnatomy) -> list[Edit]:
    return [a.src.replace(a.bound_min.args[0], a.n_name)]


@_on_rule
def _guard_always(a: _RuleAnatomy) -> list[Edit]:
    cmp = a.guard_cmp
    return [a.src.replace(cmp, f"{a.src.segment(cmp.left)} >= {a.src.segment(cmp.comparators[0])}")]


@_on_rule
def _floor_non_eagle(a: _RuleAnatomy) -> list[Edit]:
    return [a.src.replace(a.non_eagle_value, floor_text(a.n_name, a.self_name, "scheduler_block_size"))]


@_on_rule
def _drop_clamp_at_zero(a: _RuleAnatomy) -> list[Edit]:
    return [a.src.replace(a.finalized_call, f"({a.src.segment(a.finalized_sub)})")]


@_on_rule
def _clamp_as_conditional(a: _RuleAnatomy) -> list[Edit]:
    # max(0, n - R) written as a conditional: the same value everywhere, so an
    # equivalent mutant every technique must *not* kill.
    sub = a.finalized_sub
    left, right = a.src.segment(sub.left), a.src.segment(sub.right)
    return [a.src.replace(a.finalized_call, f"({left} - {right} if {left} > {right} else 0)")]


@_on_rule
def _unclamp_lookahead(a: _RuleAnatomy) -> list[Edit]:
    return [a.src.replace(a.bound_min, f"({a.src.segment(a.lookahead_add)})")]


@_on_rule
def _lookahead_scheduler(a: _RuleAnatomy) -> list[Edit]:
    return [a.src.replace(a.lookahead_add.right, f"{a.self_name}.scheduler_block_size")]


@_on_rule
def _eagle_everywhere(a: _RuleAnatomy) -> list[Edit]:
    return [a.src.replace(a.guard, a.src.segment(a.guard_cmp))]


@_on_rule
def _lookahead_condition(a: _RuleAnatomy) -> list[Edit]:
    fin = a.fin_name
    floored = floor_text(fin, a.self_name, "scheduler_block_size")
    block = a.src.segment(a.lookahead_add.right)
    return [a.src.replace(a.bound_min, f"({fin} if {fin} - {floored} <= {block} else {floored})")]


@_on_rule
def _add_reprefillable(a: _RuleAnatomy) -> list[Edit]:
    sub = a.finalized_sub
    return [a.src.replace(sub, f"{a.src.segment(sub.left)} + {a.src.segment(sub.right)}")]


def _round_align_to_hash_block(src: Source) -> tuple[str, list[Edit]]:
    # Needs the rule's anatomy too: the variant is defined on the #52419 shape.
    _rule_anatomy(src)
    cls = find_class(src.tree, HYBRID_CLASS)
    where = f"{HYBRID_CLASS}._align_cacheable"
    method = find_method(cls, "_align_cacheable")
    if method is None or len(method.args.args) != 2:
        raise Missing(f"{where}(self, num_tokens)")
    self_name, x_name = (a.arg for a in method.args.args)
    if not any(
        isinstance(n, ast.Assign)
        and any(is_attr(t, "hash_block_size", "self") for t in n.targets)
        for n in ast.walk(cls)
    ):
        raise Missing(f"an assignment to self.hash_block_size in {HYBRID_CLASS}")
    branch = exactly_one(
        [
            n
            for n in walk(method.body)
            if isinstance(n, ast.If)
            and is_attr(n.test, "enable_partial_hash_hits", self_name)
            and len(n.body) == 1
            and isinstance(n.body[0], ast.Return)
            and n.body[0].value is not None
            and is_name(n.body[0].value, x_name)
        ],
        f"`if {self_name}.enable_partial_hash_hits: return {x_name}` in {where}",
    )
    value = branch.body[0].value
    return where, [src.replace(value, floor_text(x_name, self_name, "hash_block_size"))]


def _reprefillable_lookahead(src: Source) -> tuple[str, list[Edit]]:
    # Needs the rule's anatomy too: on trees without the EAGLE finalized
    # computation the variant has nothing to act on.
    _rule_anatomy(src)
    cls = find_class(src.tree, BASE_CLASS)
    where = f"{BASE_CLASS}.__init__"
    init = find_method(cls, "__init__")
    if init is None:
        raise Missing(where)
    assign = exactly_one(
        [
            n
            for n in walk(init.body)
            if isinstance(n, ast.Assign)
            and len(n.targets) == 1
            and is_attr(n.targets[0], "num_reprefillable_tokens")
        ],
        f"assignment to self.num_reprefillable_tokens in {where}",
    )
    sub = exactly_one(
        [
            n
            for n in ast.walk(assign.value)
            if isinstance(n, ast.BinOp)
            and isinstance(n.op, ast.Sub)
            and is_name(n.left, "num_prefill_lookahead")
            and is_const(n.right, 1)
        ],
        f"`num_prefill_lookahead - 1` in the num_reprefillable_tokens assignment of {where}",
    )
    return where, [src.replace(sub, src.segment(sub.left))]


REGISTRATION_MUTANTS: tuple[MutationOperator, ...] = (
    MutationOperator(
        "refloor_50062",
        "#50062: the EAGLE branch floors the finalized tokens to scheduler_block_size, partial hits or not",
        "regression_50062", _refloor),
    MutationOperator(
        "lookahead_dropped",
        "EAGLE bound without `+ manager.block_size`: no lookahead block",
        "lookahead_dropped", _drop_lookahead),
    MutationOperator(
        "finalized_ignored",
        "EAGLE clamp min(num_computed_tokens, ...) instead of min(finalized, ...)",
        "finalized_ignored", _ignore_finalized),
    MutationOperator(
        "eagle_guard_always",
        "EAGLE guard `cached > 0` weakened to `cached >= 0`",
        "eagle_guard_always", _guard_always),
    MutationOperator(
        "reprefillable_off_by_one",
        "KVCacheCoordinator.__init__: num_reprefillable_tokens = max(0, num_prefill_lookahead)",
        "reprefillable_off_by_one", _reprefillable_lookahead),
    MutationOperator(
        "floor_non_eagle_under_partial",
        "the non-EAGLE result floors num_computed_tokens to scheduler_block_size even under partial hits",
        "floor_non_eagle_under_partial", _floor_non_eagle),
    MutationOperator(
        "missing_clamp_at_zero",
        "finalized = num_computed_tokens - num_reprefillable_tokens, without max(0, ...)",
        "missing_clamp_at_zero", _drop_clamp_at_zero),
    MutationOperator(
        "clamp_as_conditional",
        "finalized = n - R if n > R else 0 instead of max(0, n - R): equivalent, must survive",
        "cacheable_tokens_032", _clamp_as_conditional),
    MutationOperator(
        "lookahead_unclamped",
        "EAGLE bound = aligned finalized + manager.block_size, without min(finalized, ...)",
        "lookahead_unclamped", _unclamp_lookahead),
    MutationOperator(
        "lookahead_scheduler_block",
        "EAGLE lookahead `+ self.scheduler_block_size` instead of `+ manager.block_size`",
        "lookahead_scheduler_block", _lookahead_scheduler),
    MutationOperator(
        "round_to_hash_block",
        "_align_cacheable rounds down to hash_block_size under partial hits instead of not at all",
        "round_to_hash_block", _round_align_to_hash_block),
    MutationOperator(
        "eagle_rule_everywhere",
        "EAGLE guard without `manager.use_eagle`: the lookahead rule applies to every group",
        "eagle_rule_everywhere", _eagle_everywhere),
    MutationOperator(
        "lookahead_as_condition",
        "EAGLE keeps the finalized tail only if it fits in one manager block, else floors to S",
        "lookahead_as_condition", _lookahead_condition),
    MutationOperator(
        "reprefillable_added",
        "sign error: finalized = max(0, num_computed_tokens + num_reprefillable_tokens)",
        "reprefillable_added", _add_reprefillable),
)
