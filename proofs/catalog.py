"""The theorem catalog: every claim kvspec proves or refutes, by name."""

from __future__ import annotations

from typing import Any, Callable

from kvspec.model.errors import UnknownName
from kvspec.model.arith import Arith
from kvspec.model.spec import (
    finalized_tokens,
    hashed_tokens,
    registered_full_blocks,
    registration_bound,
    reprefillable_tokens,
)
from kvspec.model.variants import VARIANTS, Conformance, variant

from .encoding import Vars, domain_view, inputs
from .geometry import geometry_theorem as _geometry
from .lemmas import LEMMAS, Lemma, lemma
from .lookup_catalog import LOOKUP_THEOREMS
from .theorem import Target, Theorem
from .verdict import Status

__all__ = ["CATALOG", "WORST_CASE_S_MAX", "theorem", "names"]


def _rule(name: str) -> Target:
    return Target(name, variant(name).rule)


SPEC = Target("spec", registration_bound)


def _blocks(ar: Arith, v: Vars, tokens: Any) -> Any:
    return registered_full_blocks(ar, tokens, hashed_tokens(ar, v.t, v.H), v.B)


def _explain(*rules: str, n_names: tuple[str, ...] = ("n",)) -> Callable[[dict], dict]:
    chosen = {"spec": registration_bound}
    chosen.update({name: variant(name).rule for name in rules})
    return lambda values: domain_view(values, chosen, n_names)


# --- claims, each over a registration rule ``f`` --------------------------------

def _equivalent(ar: Arith, v: Vars, f: Callable) -> Any:
    return f(ar, inputs(v)) == registration_bound(ar, inputs(v))


def _at_most_n(ar: Arith, v: Vars, f: Callable) -> Any:
    return f(ar, inputs(v)) <= v.n


def _eagle_within_finalized(ar: Arith, v: Vars, f: Callable) -> Any:
    p = inputs(v)
    return ar.implies(v.E, f(ar, p) <= finalized_tokens(ar, p))


def _non_negative(ar: Arith, v: Vars, f: Callable) -> Any:
    return f(ar, inputs(v)) >= 0


def _no_loss_under_partial(ar: Arith, v: Vars, f: Callable) -> Any:
    p = inputs(v)
    bound = f(ar, p)
    return ar.implies(
        v.P,
        ar.ite(v.E, bound == finalized_tokens(ar, p), bound == v.n),
    )


def _later_call(ar: Arith, v: Vars) -> Any:
    return ar.and_(v.n <= v.n2, v.n2 <= v.t)


def _monotone_tokens(ar: Arith, v: Vars, f: Callable) -> Any:
    return f(ar, inputs(v)) <= f(ar, inputs(v, n=v.n2))


def _monotone_blocks(ar: Arith, v: Vars, f: Callable) -> Any:
    return _blocks(ar, v, f(ar, inputs(v))) <= _blocks(ar, v, f(ar, inputs(v, n=v.n2)))


def _more_lookahead(ar: Arith, v: Vars) -> Any:
    return ar.and_(v.L <= v.L2, ar.implies(v.E, v.L2 <= v.S))


def _antimonotone_reprefill(ar: Arith, v: Vars, f: Callable) -> Any:
    return f(ar, inputs(v, L=v.L2)) <= f(ar, inputs(v))


def _restricted_equivalent(restriction: Callable) -> Callable:
    def claim(ar: Arith, v: Vars, f: Callable) -> Any:
        return ar.implies(restriction(ar, inputs(v)), _equivalent(ar, v, f))
    return claim


# --- the #50062 regression: exact reachability and loss ----------------------

REGRESSION = variant("regression_50062").rule


def _regression_tokens_differ(ar: Arith, v: Vars) -> Any:
    p = inputs(v)
    return REGRESSION(ar, p) != registration_bound(ar, p)


def _regression_blocks_differ(ar: Arith, v: Vars) -> Any:
    p = inputs(v)
    return _blocks(ar, v, REGRESSION(ar, p)) != _blocks(ar, v, registration_bound(ar, p))


def _reach_tokens(cmp: str) -> Callable:
    def condition(ar: Arith, v: Vars) -> Any:
        p = inputs(v)
        R = reprefillable_tokens(ar, p)
        tail = ar.mod(v.n - R, v.S)
        past = {">": tail > v.B, ">=": tail >= v.B, "!=0": tail != 0}[cmp]
        return ar.and_(v.P, v.E, v.n > R, past)
    return condition


def _reach_blocks(margin: int) -> Callable:
    def condition(ar: Arith, v: Vars) -> Any:
        p = inputs(v)
        finalized = v.n - reprefillable_tokens(ar, p)
        floor = ar.round_down(finalized, v.S)
        reach = ar.min(finalized, hashed_tokens(ar, v.t, v.H))
        return ar.and_(v.P, v.E, finalized > 0, floor + margin * v.B <= reach)
    return condition


def _iff(differ: Callable) -> Callable:
    def claim(ar: Arith, v: Vars, condition: Callable) -> Any:
        return ar.iff(differ(ar, v), condition(ar, v))
    return claim


def _closed_form_loss(with_block: bool) -> Callable:
    def loss(ar: Arith, v: Vars) -> Any:
        p = inputs(v)
        R = reprefillable_tokens(ar, p)
        tail = ar.mod(v.n - R, v.S) - (v.B if with_block else 0)
        return ar.ite(_reach_tokens(">")(ar, v), tail, ar.const(0))
    return loss


def _loss_claim(ar: Arith, v: Vars, formula: Callable) -> Any:
    p = inputs(v)
    return registration_bound(ar, p) - REGRESSION(ar, p) == formula(ar, v)


def _worst_case_claim(ar: Arith, v: Vars, formula: Callable) -> Any:
    p = inputs(v)
    return registration_bound(ar, p) - REGRESSION(ar, p) <= formula(ar, v)


WORST_CASE_S_MAX = 64


def _declared_bounds(ar: Arith, v: Vars) -> Any:
    return v.S <= WORST_CASE_S_MAX


def _worst_case_value(ar: Arith, v: Vars) -> Any:
    # With B >= H >= 1, the unregistered tail (n - R) mod S - B is at most S - 2.
    return ar.const(WORST_CASE_S_MAX - 2)


def _just_below_worst_case(ar: Arith, v: Vars) -> Any:
    # Refuting "loss <= S_max - 3" exhibits an input where S_max - 2 is attained.
    return ar.const(WORST_CASE_S_MAX - 3)


# --- observability of rounding to the hash block -----------------------------

ROUND_TO_H = variant("round_to_hash_block").rule


def _same_blocks(ar: Arith, v: Vars, f: Callable) -> Any:
    p = inputs(v)
    return _blocks(ar, v, f(ar, p)) == _blocks(ar, v, registration_bound(ar, p))


def _same_hash_blocks(ar: Arith, v: Vars, f: Callable) -> Any:
    p = inputs(v)
    return ar.div(f(ar, p), v.H) == ar.div(registration_bound(ar, p), v.H)


def _lemma_theorem(lemma: Lemma) -> Theorem:
    def claim(ar: Arith, v: Vars, body: Callable) -> Any:
        return body(ar, *(v[name] for name in lemma.params))

    return Theorem(
        name=f"lemma.{lemma.name}",
        category="lemma",
        statement=lemma.statement,
        assumptions_text="all integers",
        ints=lemma.params,
        bools=(),
        assume=lambda ar, v: ar.true(),
        claim=claim,
        target=Target(lemma.name, lemma.body),
        no_refuter_reason="a lemma over all integers; its premises are checked satisfiable",
    )


def _regression_block_hints(ar: Arith, v: Vars) -> list:
    # With q = floor(fin/S), #50062's EAGLE bound is a = q*S + B = (q*k + 1)*B,
    # a block boundary; the spec's is c = min(fin, hashed).  The block counts
    # differ exactly when c reaches past a by a whole block.
    p = inputs(v)
    fin = finalized_tokens(ar, p)
    q = ar.div(fin, v.S)
    a = q * v.S + v.B
    c = ar.min(fin, hashed_tokens(ar, v.t, v.H))
    return [
        lemma("div_bounds").instance(ar, fin, v.S),
        lemma("multiple_exact").instance(ar, q * v.k + 1, v.B),
        lemma("div_bounds").instance(ar, c, v.B),
        lemma("div_monotone").instance(ar, a, c, v.B),
        lemma("div_monotone").instance(ar, c, a, v.B),
        lemma("step_past").instance(ar, a, c, v.B),
    ]


def _monotone_hints(ar: Arith, v: Vars) -> list:
    # Rounding is monotone in what it rounds, at every call of the pair.
    p1, p2 = inputs(v), inputs(v, n=v.n2)
    fin1, fin2 = finalized_tokens(ar, p1), finalized_tokens(ar, p2)
    hashed = hashed_tokens(ar, v.t, v.H)
    return [
        lemma("div_monotone").instance(ar, v.n, v.n2, v.S),
        lemma("div_monotone").instance(ar, fin1, fin2, v.S),
        lemma("div_non_negative").instance(ar, v.n, v.S),
        lemma("div_non_negative").instance(ar, fin1, v.S),
        lemma("div_monotone").instance(
            ar, ar.min(registration_bound(ar, p1), hashed),
            ar.min(registration_bound(ar, p2), hashed), v.B),
    ]


def _hash_rounding_hints(ar: Arith, v: Vars) -> list:
    # Rounding to H under a hashed prefix that is itself H-aligned: blocks of
    # B = m*H cannot tell the difference.
    p = inputs(v)
    fin = finalized_tokens(ar, p)
    return [
        lemma("div_bounds").instance(ar, fin, v.H),
        lemma("div_bounds").instance(ar, v.n, v.H),
        lemma("div_monotone").instance(ar, v.n, v.t, v.H),
        lemma("div_monotone").instance(ar, v.t, v.n, v.H),
        lemma("coarser_round_down").instance(ar, ar.min(v.n, v.t), v.H, v.m),
        lemma("coarser_round_down").instance(ar, v.t, v.H, v.m),
        lemma("coarser_round_down").instance(ar, v.n, v.H, v.m),
    ]


def _build() -> tuple[Theorem, ...]:
    theorems: list[Theorem] = [_lemma_theorem(lemma) for lemma in LEMMAS]
    for v in VARIANTS:
        if v.conformance is Conformance.HISTORICAL:
            theorems.append(_geometry(
                f"conformance.{v.name}.in_era", "conformance",
                f"{v.name} ({v.summary}) equals the spec when {v.restriction_text}",
                _restricted_equivalent(v.restriction), Target(v.name, v.rule),
                refuters=(_rule("lookahead_dropped"),),
                extra_text=v.restriction_text,
                explain=_explain(v.name),
            ))
            theorems.append(_geometry(
                f"conformance.{v.name}", "conformance",
                f"{v.name} ({v.summary}) equals the spec everywhere (it must not)",
                _equivalent, Target(v.name, v.rule), expected=Status.REFUTED,
                explain=_explain(v.name),
            ))
            continue
        theorems.append(_geometry(
            f"conformance.{v.name}", "conformance",
            f"{v.name} ({v.summary}) equals the spec for every well-formed geometry"
            + ("" if v.conformance is Conformance.CORRECT else " (it must not)"),
            _equivalent, Target(v.name, v.rule),
            expected=Status.PROVED if v.conformance is Conformance.CORRECT else Status.REFUTED,
            refuters=(_rule("regression_50062"),) if v.conformance is Conformance.CORRECT else (),
            no_refuter_reason="" if v.conformance is Conformance.CORRECT else "expected to be refuted",
            explain=_explain(v.name),
        ))

    theorems += [
        _geometry("safety.at_most_computed", "safety",
                  "a group never registers more than the n computed tokens",
                  _at_most_n, SPEC,
                  refuters=(_rule("lookahead_unclamped"), _rule("reprefillable_added")),
                  explain=_explain()),
        _geometry("safety.eagle_within_finalized", "safety",
                  "an EAGLE group never registers past the finalized tokens",
                  _eagle_within_finalized, SPEC,
                  refuters=(_rule("finalized_ignored"), _rule("lookahead_unclamped")),
                  explain=_explain()),
        _geometry("safety.non_negative", "safety",
                  "the registration bound is never negative",
                  _non_negative, SPEC, refuters=(_rule("missing_clamp_at_zero"),),
                  explain=_explain()),
        _geometry("no_loss.partial_hash_hits", "no-loss",
                  "under partial hash hits a non-EAGLE group registers exactly n and an "
                  "EAGLE group exactly the finalized tokens",
                  _no_loss_under_partial, SPEC,
                  refuters=(_rule("regression_50062"), _rule("round_to_hash_block"),
                            _rule("floor_non_eagle_under_partial")),
                  explain=_explain()),
        _geometry("monotone.tokens_in_n", "monotonicity",
                  "more computed tokens never register fewer tokens",
                  _monotone_tokens, SPEC, refuters=(_rule("lookahead_as_condition"),),
                  extra_ints=("n2",), extra_assume=_later_call, extra_text="n <= n2 <= t",
                  hints=_monotone_hints, explain=_explain(n_names=("n", "n2"))),
        _geometry("monotone.blocks_in_n", "monotonicity",
                  "more computed tokens never register fewer full blocks",
                  _monotone_blocks, SPEC, refuters=(_rule("lookahead_as_condition"),),
                  extra_ints=("n2",), extra_assume=_later_call, extra_text="n <= n2 <= t",
                  hints=_monotone_hints, explain=_explain(n_names=("n", "n2"))),
        _geometry("monotone.reprefillable", "monotonicity",
                  "more reprefillable tokens (a larger lookahead) never register more",
                  _antimonotone_reprefill, SPEC, refuters=(_rule("reprefillable_added"),),
                  extra_ints=("L2",), extra_assume=_more_lookahead,
                  extra_text="L <= L2, EAGLE => L2 <= S", explain=_explain()),
        _geometry("reachability.regression_tokens", "reachability",
                  "#50062 changes the token bound iff partial hits and EAGLE and n > R and "
                  "(n - R) mod S > B   (R = max(0, L - 1))",
                  _iff(_regression_tokens_differ), Target("(n-R) mod S > B", _reach_tokens(">")),
                  refuters=(Target("(n-R) mod S >= B", _reach_tokens(">=")),
                            Target("(n-R) mod S != 0", _reach_tokens("!=0"))),
                  explain=_explain("regression_50062")),
        _geometry("reachability.regression_blocks", "reachability",
                  "#50062 changes the registered full blocks iff partial hits and EAGLE and "
                  "n > R and floor((n-R)/S)*S + 2B <= min(n-R, hashed tokens)",
                  _iff(_regression_blocks_differ), Target("floor + 2B <= reach", _reach_blocks(2)),
                  refuters=(Target("floor + B < reach (the token condition)", _reach_blocks(1)),),
                  hints=_regression_block_hints, explain=_explain("regression_50062")),
        _geometry("loss.regression_closed_form", "loss",
                  "#50062 loses exactly (n - R) mod S - B tokens per call where reachable, "
                  "0 elsewhere",
                  _loss_claim, Target("(n-R) mod S - B", _closed_form_loss(True)),
                  refuters=(Target("(n-R) mod S", _closed_form_loss(False)),)),
        _geometry("loss.regression_worst_case", "loss",
                  f"over S <= {WORST_CASE_S_MAX}, #50062 loses at most S_max - 2 = "
                  f"{WORST_CASE_S_MAX - 2} tokens per call",
                  _worst_case_claim, Target("S_max - 2", _worst_case_value),
                  refuters=(Target("S_max - 3 (so S_max - 2 is attained)",
                                    _just_below_worst_case),),
                  extra_assume=_declared_bounds, extra_text=f"S <= {WORST_CASE_S_MAX}"),
        _geometry("observability.hash_rounding_blocks", "observability",
                  "rounding to the hash block under partial hits never changes the "
                  "registered full blocks",
                  _same_blocks, Target("round_to_hash_block", ROUND_TO_H),
                  refuters=(_rule("floor_non_eagle_under_partial"),),
                  hints=_hash_rounding_hints),
        _geometry("observability.hash_rounding_hash_blocks", "observability",
                  "rounding to the hash block never changes floor(tokens / H)",
                  _same_hash_blocks, Target("round_to_hash_block", ROUND_TO_H),
                  refuters=(_rule("floor_non_eagle_under_partial"),)),
        _geometry("observability.hash_rounding_tokens", "observability",
                  "rounding to the hash block never changes the token bound (it does: "
                  "only an exact-token check sees it)",
                  _equivalent, Target("round_to_hash_block", ROUND_TO_H),
                  expected=Status.REFUTED, explain=_explain("round_to_hash_block")),
    ]
    return tuple(theorems)


CATALOG: tuple[Theorem, ...] = _build() + LOOKUP_THEOREMS
_BY_NAME = {t.name: t for t in CATALOG}


def names() -> tuple[str, ...]:
    return tuple(_BY_NAME)


def theorem(name: str) -> Theorem:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnknownName(f"unknown theorem {name!r}") from None
