"""Mutation operators: re-introduce a known-wrong registration rule into vLLM.

No PyPI release of vLLM contains the #50062 regression (it lived only on main
between two PRs), and none contains the other wrong shapes of
``model.variants``.  To have buggy subjects to test kvspec against, each
operator here rewrites the registration rule of a release tree so that it
behaves like one named wrong variant of the model (``models_variant``).

Operators are located with ``ast``, never by global text search: the
coordinator module is parsed, the class and method are found by name, the
nodes of the rule are recognised by their structure (``manager.use_eagle and
cached > 0``, ``max(0, n - self.num_reprefillable_tokens)``, ``min(fin,
aligned + manager.block_size)``, ...) and exactly the intended span is
rewritten from the nodes' line/column offsets.  Local variable names are not
relied upon, so the same operator applies to the 0.28-0.31 form (rule inside
``HybridKVCacheCoordinator.cache_blocks``) and the 0.32+ form
(``HybridKVCacheCoordinator.get_num_cacheable_tokens``).

Every operator needs the complete #52419 anatomy (an EAGLE branch computing
finalized tokens and re-aligning them with ``_align_cacheable``): the model's
wrong variants are defined as one-piece changes of that shape.  On older trees
(before 0.28) the anatomy is missing and the operator raises
``MutationTargetNotFound`` rather than silently doing nothing.  After
rewriting, the result must parse and only the targeted method may differ from
the original (compared by ``ast.dump``).
"""

from __future__ import annotations

import ast
import hashlib
import json
import shutil
from pathlib import Path
from typing import Callable, Iterator

import attrs

__all__ = [
    "COORDINATOR_FILE",
    "MUTANTS",
    "LOOKUP_MUTANTS",
    "MutationError",
    "MutationOperator",
    "MutationTargetNotFound",
    "make_mutant_tree",
    "mutant",
]

COORDINATOR_FILE = "vllm/v1/core/kv_cache_coordinator.py"
MANAGER_FILE = "vllm/v1/core/single_type_kv_cache_manager.py"
MARKER_FILE = "MUTANT.json"

HYBRID_CLASS = "HybridKVCacheCoordinator"
FULL_ATTENTION_CLASS = "FullAttentionManager"
BASE_CLASS = "KVCacheCoordinator"


class MutationError(Exception):
    """A mutation could not be applied: a one-line cause."""


class MutationTargetNotFound(MutationError):
    """The code an operator rewrites is absent or ambiguous in this source."""


class _Missing(Exception):
    """Internal: what was looked for and not found (exactly once)."""


# ---------------------------------------------------------------------------
# Source spans


@attrs.frozen
class _Edit:
    start: int  # byte offsets into the UTF-8 encoded source
    end: int
    text: str


class _Source:
    """A module's text with byte-accurate node spans (``col_offset`` counts
    UTF-8 bytes, so all slicing happens on the encoded source)."""

    def __init__(self, text: str):
        self.text = text
        self.data = text.encode("utf-8")
        starts = [0]
        for line in self.data.splitlines(keepends=True):
            starts.append(starts[-1] + len(line))
        self._line_starts = starts
        try:
            self.tree = ast.parse(text)
        except SyntaxError as e:
            raise _Missing(f"source does not parse ({e.msg}, line {e.lineno})") from None

    def span(self, node: ast.AST) -> tuple[int, int]:
        start = self._line_starts[node.lineno - 1] + node.col_offset
        end = self._line_starts[node.end_lineno - 1] + node.end_col_offset
        return start, end

    def segment(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.data[start:end].decode("utf-8")

    def replace(self, node: ast.AST, text: str) -> _Edit:
        start, end = self.span(node)
        return _Edit(start, end, text)

    def apply(self, edits: list[_Edit]) -> str:
        data = self.data
        ordered = sorted(edits, key=lambda e: e.start, reverse=True)
        for later, earlier in zip(ordered, ordered[1:]):
            if earlier.end > later.start:
                raise MutationError("internal: overlapping edits")
        for e in ordered:
            data = data[: e.start] + e.text.encode("utf-8") + data[e.end :]
        return data.decode("utf-8")


# ---------------------------------------------------------------------------
# Structural matching


def _walk(nodes: ast.AST | list[ast.AST]) -> Iterator[ast.AST]:
    for node in nodes if isinstance(nodes, list) else [nodes]:
        yield from ast.walk(node)


def _exactly_one(found: list[ast.AST], what: str) -> ast.AST:
    if len(found) != 1:
        raise _Missing(f"expected exactly one {what}, found {len(found)}")
    return found[0]


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return _exactly_one(
        [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name],
        f"class {name}",
    )


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    found = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name]
    if len(found) > 1:
        raise _Missing(f"expected at most one {cls.name}.{name}, found {len(found)}")
    return found[0] if found else None


def _is_name(node: ast.AST, name: str | None = None) -> bool:
    return isinstance(node, ast.Name) and (name is None or node.id == name)


def _is_attr(node: ast.AST, attr: str, owner: str | None = None) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == attr
        and (owner is None or _is_name(node.value, owner))
    )


def _is_const(node: ast.AST, value: int) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) is int and node.value == value


def _is_call(node: ast.AST, func: str, nargs: int) -> bool:
    return (
        isinstance(node, ast.Call)
        and _is_name(node.func, func)
        and len(node.args) == nargs
        and not node.keywords
    )


def _is_method_call(node: ast.AST, owner: str, attr: str, nargs: int) -> bool:
    return (
        isinstance(node, ast.Call)
        and _is_attr(node.func, attr, owner)
        and len(node.args) == nargs
        and not node.keywords
    )


def _floor(x: str, self_name: str, unit: str) -> str:
    return f"({x} // {self_name}.{unit} * {self_name}.{unit})"


@attrs.frozen
class _RuleAnatomy:
    """The #52419 registration rule, found by structure in one method."""

    src: _Source
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
    cls = _class(tree, HYBRID_CLASS)
    for name in ("get_num_cacheable_tokens", "cache_blocks"):
        method = _method(cls, name)
        if method is not None:
            return method
    raise _Missing(f"{HYBRID_CLASS} defines neither get_num_cacheable_tokens nor cache_blocks")


def _rule_anatomy(src: _Source) -> _RuleAnatomy:
    method = _rule_method(src.tree)
    where = f"{HYBRID_CLASS}.{method.name}"
    params = [a.arg for a in method.args.args]
    if len(params) < 2:
        raise _Missing(f"{where}: expected (self, num_computed_tokens, ...) parameters")
    if method.name == "cache_blocks":
        if len(params) < 3:
            raise _Missing(f"{where}: expected (self, request, num_computed_tokens)")
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
            _is_attr(flag, "use_eagle")
            and isinstance(cmp, ast.Compare)
            and _is_name(cmp.left)
            and len(cmp.ops) == 1
            and isinstance(cmp.ops[0], ast.Gt)
            and _is_const(cmp.comparators[0], 0)
        )

    eagle_if = _exactly_one(
        [n for n in _walk(method.body) if is_guard(n)],
        f"EAGLE branch `if <manager>.use_eagle and <cached> > 0:` in {where}",
    )
    guard = eagle_if.test
    guard_flag, guard_cmp = guard.values
    cached_name = guard_cmp.left.id
    body = list(eagle_if.body)

    # The cached value must come from ``self._align_cacheable(n)``.
    _exactly_one(
        [
            n
            for n in _walk(method.body)
            if isinstance(n, ast.Assign)
            and len(n.targets) == 1
            and _is_name(n.targets[0], cached_name)
            and _is_method_call(n.value, self_name, "_align_cacheable", 1)
            and _is_name(n.value.args[0], n_name)
        ],
        f"`{cached_name} = {self_name}._align_cacheable({n_name})` in {where}"
        " (the #52419 shape, vLLM >= 0.28)",
    )

    # Finalized tokens: ``<fin> = max(0, n - self.num_reprefillable_tokens)``.
    def is_finalized(node: ast.AST) -> bool:
        if not _is_call(node, "max", 2) or not _is_const(node.args[0], 0):
            return False
        sub = node.args[1]
        return (
            isinstance(sub, ast.BinOp)
            and isinstance(sub.op, ast.Sub)
            and _is_name(sub.left, n_name)
            and _is_attr(sub.right, "num_reprefillable_tokens", self_name)
        )

    finalized_call = _exactly_one(
        [n for n in _walk(body) if is_finalized(n)],
        f"finalized tokens `max(0, {n_name} - {self_name}.num_reprefillable_tokens)`"
        f" in the EAGLE branch of {where} (pre-0.28 shape?)",
    )
    fin_assign = _exactly_one(
        [
            n
            for n in _walk(body)
            if isinstance(n, ast.Assign)
            and n.value is finalized_call
            and len(n.targets) == 1
            and _is_name(n.targets[0])
        ],
        f"assignment of the finalized tokens to a local in {where}",
    )
    fin_name = fin_assign.targets[0].id

    align_fin_call = _exactly_one(
        [
            n
            for n in _walk(body)
            if _is_method_call(n, self_name, "_align_cacheable", 1)
            and _is_name(n.args[0], fin_name)
        ],
        f"`{self_name}._align_cacheable({fin_name})` in the EAGLE branch of {where}",
    )

    bound_min = _exactly_one(
        [n for n in _walk(body) if _is_call(n, "min", 2)],
        f"`min(...)` in the EAGLE branch of {where}",
    )
    if not _is_name(bound_min.args[0], fin_name):
        raise _Missing(f"expected `min({fin_name}, ...)` in the EAGLE branch of {where}")
    manager_name = guard_flag.value.id if _is_name(guard_flag.value) else None
    lookahead_add = bound_min.args[1]
    if not (
        isinstance(lookahead_add, ast.BinOp)
        and isinstance(lookahead_add.op, ast.Add)
        and _is_attr(lookahead_add.right, "block_size", manager_name)
    ):
        raise _Missing(
            f"expected `min({fin_name}, <aligned> + <manager>.block_size)` in {where}"
        )
    # The aligned finalized value reaches the bound either directly (0.32+)
    # or through one local (0.28-0.31).
    left = lookahead_add.left
    if left is not align_fin_call:
        holder = _exactly_one(
            [
                n
                for n in _walk(body)
                if isinstance(n, ast.Assign) and n.value is align_fin_call
                and len(n.targets) == 1 and _is_name(n.targets[0])
            ],
            f"the aligned finalized tokens feeding the lookahead bound in {where}",
        )
        if not _is_name(left, holder.targets[0].id):
            raise _Missing(f"the lookahead bound in {where} does not use the aligned finalized tokens")

    # Where ``cached`` becomes the non-EAGLE result: ``return cached`` (0.32+)
    # or ``<to_cache> = cached`` (0.28-0.31), outside the EAGLE branch.
    inside = {id(n) for n in ast.walk(eagle_if)}
    non_eagle = [
        n.value
        for n in _walk(method.body)
        if id(n) not in inside
        and isinstance(n, (ast.Return, ast.Assign))
        and (isinstance(n, ast.Return) or len(n.targets) == 1)
        and n.value is not None
        and _is_name(n.value, cached_name)
    ]
    non_eagle_value = _exactly_one(
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

Rewrite = Callable[[_Source], tuple[str, list[_Edit]]]


def _on_rule(fn: Callable[[_RuleAnatomy], list[_Edit]]) -> Rewrite:
    def rewrite(src: _Source) -> tuple[str, list[_Edit]]:
        a = _rule_anatomy(src)
        return a.qualname, fn(a)

    return rewrite


@_on_rule
def _refloor(a: _RuleAnatomy) -> list[_Edit]:
    return [a.src.replace(a.align_fin_call, _floor(a.fin_name, a.self_name, "scheduler_block_size"))]


@_on_rule
def _drop_lookahead(a: _RuleAnatomy) -> list[_Edit]:
    return [a.src.replace(a.lookahead_add, f"({a.src.segment(a.lookahead_add.left)})")]


@_on_rule
def _ignore_finalized(a: _RuleAnatomy) -> list[_Edit]:
    return [a.src.replace(a.bound_min.args[0], a.n_name)]


@_on_rule
def _guard_always(a: _RuleAnatomy) -> list[_Edit]:
    cmp = a.guard_cmp
    return [a.src.replace(cmp, f"{a.src.segment(cmp.left)} >= {a.src.segment(cmp.comparators[0])}")]


@_on_rule
def _floor_non_eagle(a: _RuleAnatomy) -> list[_Edit]:
    return [a.src.replace(a.non_eagle_value, _floor(a.n_name, a.self_name, "scheduler_block_size"))]


@_on_rule
def _drop_clamp_at_zero(a: _RuleAnatomy) -> list[_Edit]:
    return [a.src.replace(a.finalized_call, f"({a.src.segment(a.finalized_sub)})")]


@_on_rule
def _clamp_as_conditional(a: _RuleAnatomy) -> list[_Edit]:
    # max(0, n - R) written as a conditional: the same value everywhere, so an
    # equivalent mutant every technique must *not* kill.
    sub = a.finalized_sub
    left, right = a.src.segment(sub.left), a.src.segment(sub.right)
    return [a.src.replace(a.finalized_call, f"({left} - {right} if {left} > {right} else 0)")]


@_on_rule
def _unclamp_lookahead(a: _RuleAnatomy) -> list[_Edit]:
    return [a.src.replace(a.bound_min, f"({a.src.segment(a.lookahead_add)})")]


@_on_rule
def _lookahead_scheduler(a: _RuleAnatomy) -> list[_Edit]:
    return [a.src.replace(a.lookahead_add.right, f"{a.self_name}.scheduler_block_size")]


@_on_rule
def _eagle_everywhere(a: _RuleAnatomy) -> list[_Edit]:
    return [a.src.replace(a.guard, a.src.segment(a.guard_cmp))]


@_on_rule
def _lookahead_condition(a: _RuleAnatomy) -> list[_Edit]:
    fin = a.fin_name
    floored = _floor(fin, a.self_name, "scheduler_block_size")
    block = a.src.segment(a.lookahead_add.right)
    return [a.src.replace(a.bound_min, f"({fin} if {fin} - {floored} <= {block} else {floored})")]


@_on_rule
def _add_reprefillable(a: _RuleAnatomy) -> list[_Edit]:
    sub = a.finalized_sub
    return [a.src.replace(sub, f"{a.src.segment(sub.left)} + {a.src.segment(sub.right)}")]


def _round_align_to_hash_block(src: _Source) -> tuple[str, list[_Edit]]:
    # Needs the rule's anatomy too: the variant is defined on the #52419 shape.
    _rule_anatomy(src)
    cls = _class(src.tree, HYBRID_CLASS)
    where = f"{HYBRID_CLASS}._align_cacheable"
    method = _method(cls, "_align_cacheable")
    if method is None or len(method.args.args) != 2:
        raise _Missing(f"{where}(self, num_tokens)")
    self_name, x_name = (a.arg for a in method.args.args)
    if not any(
        isinstance(n, ast.Assign)
        and any(_is_attr(t, "hash_block_size", "self") for t in n.targets)
        for n in ast.walk(cls)
    ):
        raise _Missing(f"an assignment to self.hash_block_size in {HYBRID_CLASS}")
    branch = _exactly_one(
        [
            n
            for n in _walk(method.body)
            if isinstance(n, ast.If)
            and _is_attr(n.test, "enable_partial_hash_hits", self_name)
            and len(n.body) == 1
            and isinstance(n.body[0], ast.Return)
            and n.body[0].value is not None
            and _is_name(n.body[0].value, x_name)
        ],
        f"`if {self_name}.enable_partial_hash_hits: return {x_name}` in {where}",
    )
    value = branch.body[0].value
    return where, [src.replace(value, _floor(x_name, self_name, "hash_block_size"))]


def _reprefillable_lookahead(src: _Source) -> tuple[str, list[_Edit]]:
    # Needs the rule's anatomy too: on trees without the EAGLE finalized
    # computation the variant has nothing to act on.
    _rule_anatomy(src)
    cls = _class(src.tree, BASE_CLASS)
    where = f"{BASE_CLASS}.__init__"
    init = _method(cls, "__init__")
    if init is None:
        raise _Missing(where)
    assign = _exactly_one(
        [
            n
            for n in _walk(init.body)
            if isinstance(n, ast.Assign)
            and len(n.targets) == 1
            and _is_attr(n.targets[0], "num_reprefillable_tokens")
        ],
        f"assignment to self.num_reprefillable_tokens in {where}",
    )
    sub = _exactly_one(
        [
            n
            for n in ast.walk(assign.value)
            if isinstance(n, ast.BinOp)
            and isinstance(n.op, ast.Sub)
            and _is_name(n.left, "num_prefill_lookahead")
            and _is_const(n.right, 1)
        ],
        f"`num_prefill_lookahead - 1` in the num_reprefillable_tokens assignment of {where}",
    )
    return where, [src.replace(sub, src.segment(sub.left))]


# ---------------------------------------------------------------------------
# Lookup-side rewrites: the hit a later request gets, not what is registered.


def _full_attention_lookup(src: _Source) -> tuple[str, ast.FunctionDef]:
    cls = _class(src.tree, FULL_ATTENTION_CLASS)
    method = _method(cls, "find_longest_cache_hit")
    if method is None:
        raise _Missing(f"{FULL_ATTENTION_CLASS}.find_longest_cache_hit")
    return f"{FULL_ATTENTION_CLASS}.find_longest_cache_hit", method


def _is_hit_decrement(node: ast.AST, hit: str) -> bool:
    return isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Sub) and _is_name(node.target, hit)


def _drop_eagle_removed(src: _Source) -> tuple[str, list[_Edit]]:
    where, method = _full_attention_lookup(src)
    branch = _exactly_one(
        [
            n for n in _walk(method.body)
            if isinstance(n, ast.If)
            and isinstance(n.test, ast.BoolOp) and isinstance(n.test.op, ast.And)
            and any(_is_name(v, "drop_eagle_block") for v in n.test.values)
            and len(n.body) == 1 and _is_hit_decrement(n.body[0], "hit_length")
        ],
        f"`if drop_eagle_block and ...: hit_length -= ...` in {where}",
    )
    return where, [src.replace(branch.body[0], "pass")]


def _alignment_round_removed(src: _Source) -> tuple[str, list[_Edit]]:
    where, method = _full_attention_lookup(src)
    stmt = _exactly_one(
        [
            n for n in method.body
            if _is_hit_decrement(n, "hit_length")
            and isinstance(n.value, ast.BinOp) and isinstance(n.value.op, ast.Mod)
            and _is_name(n.value.left, "hit_length") and _is_name(n.value.right, "alignment_tokens")
        ],
        f"`hit_length -= hit_length % alignment_tokens` in {where}",
    )
    return where, [src.replace(stmt, "pass")]


def _eagle_margin_removed(src: _Source) -> tuple[str, list[_Edit]]:
    cls = _class(src.tree, HYBRID_CLASS)
    where = f"{HYBRID_CLASS}.find_longest_cache_hit"
    method = _method(cls, "find_longest_cache_hit")
    if method is None:
        raise _Missing(where)
    add = _exactly_one(
        [
            n for n in _walk(method.body)
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add)
            and _is_name(n.left, "curr_hit_length") and _is_name(n.right, "eagle_margin")
        ],
        f"`curr_hit_length + eagle_margin` in {where}",
    )
    return where, [src.replace(add, "curr_hit_length")]


# ---------------------------------------------------------------------------
# Operators


def _function_dumps(tree: ast.Module) -> dict[str, str]:
    """ast.dump of every top-level function and class method, by qualified name."""
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = ast.dump(node)
        elif isinstance(node, ast.ClassDef):
            rest = []
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[f"{node.name}.{item.name}"] = ast.dump(item)
                else:
                    rest.append(ast.dump(item))
            out[f"{node.name}.<body>"] = "\n".join(rest)
        else:
            out.setdefault("<module>", "")
            out["<module>"] += ast.dump(node) + "\n"
    return out


@attrs.frozen
class MutationOperator:
    name: str
    summary: str  # one line
    models_variant: str  # the name of the wrong variant in model.variants
    rewrite: Rewrite = attrs.field(repr=False, eq=False)
    target_file: str = COORDINATOR_FILE  # relative to a tree root
    side: str = "registration"  # or "lookup": caught by the hit-length differential

    def mutated_method(self, source: str) -> str:
        """The qualified name of the one method this operator rewrites in ``source``."""
        try:
            qualname, _ = self.rewrite(_Source(source))
        except _Missing as e:
            raise MutationTargetNotFound(f"{self.name}: {self.target_file}: {e}") from None
        return qualname

    def apply(self, source: str) -> str:
        """The mutated text of ``target_file``.

        Raises ``MutationTargetNotFound`` when the code to rewrite is absent
        or ambiguous, ``MutationError`` if the result is not the intended
        single-method change.
        """
        try:
            src = _Source(source)
            qualname, edits = self.rewrite(src)
        except _Missing as e:
            raise MutationTargetNotFound(f"{self.name}: {self.target_file}: {e}") from None
        out = src.apply(edits)
        if out == source:
            raise MutationError(f"{self.name}: {self.target_file}: the rewrite changed nothing")
        try:
            after = ast.parse(out)
        except SyntaxError as e:
            raise MutationError(
                f"{self.name}: {self.target_file}: the result does not parse ({e.msg}, line {e.lineno})"
            ) from None
        before_dumps, after_dumps = _function_dumps(src.tree), _function_dumps(after)
        changed = sorted(
            k for k in before_dumps.keys() | after_dumps.keys()
            if before_dumps.get(k) != after_dumps.get(k)
        )
        if changed != [qualname]:
            raise MutationError(
                f"{self.name}: {self.target_file}: expected a change in {qualname} only, "
                f"changed: {', '.join(changed) or 'nothing'}"
            )
        return out


MUTANTS: tuple[MutationOperator, ...] = (
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

# Lookup-side operators: registration is untouched, so ``kvspec mutants``
# (the registration differential) cannot kill them; the hit-length
# differential (``oracles.lookup``) must.
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

_BY_NAME = {op.name: op for op in MUTANTS + LOOKUP_MUTANTS}


def mutant(name: str) -> MutationOperator:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown mutation operator {name!r}; known: {', '.join(_BY_NAME)}") from None


def make_mutant_tree(release_root: Path, operator: MutationOperator, dest_root: Path) -> Path:
    """Copy the tree holding the ``vllm`` package to ``dest_root`` (which must
    not exist), apply ``operator`` to its target file and mark it with
    ``MUTANT.json``.  Put ``dest_root`` first on ``PYTHONPATH`` to run it."""
    release_root, dest_root = Path(release_root), Path(dest_root)
    original_path = release_root / operator.target_file
    if not original_path.is_file():
        raise MutationTargetNotFound(
            f"{operator.name}: {operator.target_file}: no such file under {release_root}"
        )
    original = original_path.read_text(encoding="utf-8")
    mutated = operator.apply(original)  # raises before anything is copied
    try:
        ast.parse(mutated)
    except SyntaxError as e:  # apply() checks this too; never write a broken tree
        raise MutationError(f"{operator.name}: {operator.target_file}: result does not parse: {e.msg}") from None
    if mutated == original:
        raise MutationError(f"{operator.name}: {operator.target_file}: the rewrite changed nothing")
    shutil.copytree(release_root, dest_root)
    (dest_root / operator.target_file).write_text(mutated, encoding="utf-8")
    # The release's bytecode comes along (worker start-up, see provision.byte_compile),
    # except the mutated module's: a source of equal size written in the same second
    # would pass for the original and its bytecode would run instead of the mutation.
    target = dest_root / operator.target_file
    for stale in (target.parent / "__pycache__").glob(f"{target.stem}.*.pyc"):
        stale.unlink()
    marker = {
        "operator": operator.name,
        "models_variant": operator.models_variant,
        "summary": operator.summary,
        "target_file": operator.target_file,
        "source_root": str(release_root.resolve()),
        "original_sha256": hashlib.sha256(original.encode("utf-8")).hexdigest(),
        "mutated_sha256": hashlib.sha256(mutated.encode("utf-8")).hexdigest(),
    }
    (dest_root / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    return dest_root
