"""Assembling ``model.finding.Finding`` from what a run produced.

Two producers, one model: a fuzz failure (an oracle discrepancy against a
real vLLM) and a refuted theorem (the spec against a model variant).  Both
get per-group rows with derivations, the three-way ledger and, where the
catalog knows the subject's shape, the proofs' explanation.
"""

from __future__ import annotations

from typing import Any

from kvspec.model.domain import CoordinatorConfig, GroupRegistration
from kvspec.model.finding import (
    Category,
    Derivation,
    Finding,
    GroupRow,
    Ledger,
    Blame,
    blame_of,
)

__all__ = ["diagnose", "fuzz_finding", "theorem_finding", "mutant_description", "subject_compared"]

SPEC_RULE = "spec (model.spec.registration_bound)"
LOOKUP_RULE = "spec (model.spec.registration_bound, then model.lookup.dense_lookup_hit)"
_LOOKUP_CATEGORIES = (Category.LOOKUP_CONTRACT, Category.HIT_MISMATCH)


def _derivation(rule: str, reg: GroupRegistration | None) -> Derivation | None:
    if reg is None:
        return None
    return Derivation(rule, reg.cached, reg.finalized, reg.aligned_finalized, reg.eagle_bound,
                      reg.eagle_branch, reg.tokens_to_cache)


def _rows(config: CoordinatorConfig, expected, observed_tokens, observed_blocks,
          spec_regs, subject_regs, subject_rule: str | None) -> tuple[GroupRow, ...]:
    rows = []
    for i, group in enumerate(config.groups):
        rows.append(GroupRow(
            group=i, kind=group.kind.value, block_size=group.block_size,
            eagle=bool(spec_regs[i].eagle) if spec_regs else group.eagle,
            expected_tokens=expected[0][i], observed_tokens=observed_tokens[i],
            expected_blocks=expected[1][i], observed_blocks=observed_blocks[i],
            spec=_derivation("spec", spec_regs[i] if spec_regs else None),
            subject=_derivation(subject_rule, subject_regs[i]) if subject_regs and subject_rule else None,
        ))
    return tuple(rows)


def mutant_description(subject: dict[str, Any]) -> dict[str, Any] | None:
    """What the mutation of a mutant subject is (None for any other subject),
    from kvspec's own catalog of operators."""
    if subject.get("kind") != "mutant":
        return None
    from kvspec.subjects.mutation import mutant

    operator = mutant(subject["mutant"])
    return {"operator": operator.name, "models_variant": operator.models_variant, "side": operator.side,
            "summary": operator.summary, "target_file": operator.target_file,
            "release": subject.get("version")}


def subject_compared(subject: dict[str, Any], versions: dict[str, str]) -> dict[str, Any]:
    from kvspec.model.engine import HAND_BUILT

    return {"spec_rule": SPEC_RULE, "subject": subject, "versions": versions,
            "mutant": mutant_description(subject), "configuration": HAND_BUILT}


def diagnose(case, capabilities, reply: dict[str, Any]) -> tuple[str, ...]:
    """Model variants (not the correct ones) that reproduce every observation
    (``reply``: the record a failure keeps)."""
    from kvspec.model.replies import Reply
    from kvspec.model.variants import VARIANTS, Conformance
    from kvspec.oracles.registration import compare

    parsed = Reply.parse(reply)
    return tuple(v.name for v in VARIANTS if v.conformance is not Conformance.CORRECT
                 and not compare(case, capabilities, parsed, rule=v.rule))


_NO_CALL_LEDGER = {
    Category.SUBJECT_CRASH: (Blame.UNDETERMINED,
                             "vLLM raised on a configuration the model accepts: an implementation "
                             "bug, or a precondition the model does not state"),
    Category.PRECONDITION: (Blame.SPEC_BUG,
                            "vLLM rejects a configuration the model's validators accept: the "
                            "model's preconditions are too weak (unless vLLM's check is wrong)"),
    Category.REGIME_MISMATCH: (Blame.UNDETERMINED,
                               "the model's regime rule and vLLM's differ: compare "
                               "model.domain.derive_partial_hash_hits with this release"),
    Category.CALL_MISMATCH: (Blame.UNDETERMINED,
                             "the driver saw an unexpected number of cache_blocks calls"),
    Category.LOOKUP_CONTRACT: (Blame.UNDETERMINED,
                               "registration agreed with the spec; the later request's hit breaks a rule "
                               "every lookup must keep (see the detail): look at find_longest_cache_hit"),
    Category.HIT_MISMATCH: (Blame.UNDETERMINED,
                            "registration agreed with the spec; the later request's hit differs from "
                            "model.lookup.dense_lookup_hit: find_longest_cache_hit or the lookup model"),
}


def _verdict_line(category: Category, label: str, rows: tuple[GroupRow, ...], n: int | None) -> str:
    differing = [r for r in rows if r.differs]
    if not differing:
        return f"DISCREPANCY: {category.title} ({category.meaning}) in {label}"
    r = differing[0]
    return (f"DISCREPANCY: {category.title} ({category.meaning}) in {label}: at n = {n}, group "
            f"{r.group} registers {_tokens(r.observed_tokens)} where the spec registers "
            f"{r.expected_tokens}")


def _tokens(count: Any) -> str:
    return f"{count} token" + ("" if count == 1 else "s")


def fuzz_finding(result, versions: dict[str, str], *, explain: bool = True) -> Finding:
    """The finding of one fuzz result that failed."""
    from kvspec.model.capabilities import expected_regime
    from kvspec.oracles.registration import expected_calls
    from kvspec.proofs.concrete import z3_bounds
    from kvspec.proofs.explain import explain as explain_finding

    from kvspec.model.variants import variant

    failure = result.failure
    case, reply, caps = failure.case, failure.reply, result.capabilities
    first = failure.discrepancies[0]
    category = first.category
    compared = subject_compared(result.subject, versions)
    compared["capabilities"] = caps.as_dict()
    if category in _LOOKUP_CATEGORIES:
        compared["spec_rule"] = LOOKUP_RULE
    label = result.subject.get("label", "the subject")
    inputs = {**case.as_dict(), "describe": case.describe()}
    run = {"seed": result.seed, "examples": result.examples, "cases": result.cases,
           "seconds": round(result.seconds, 3),
           "cases_to_first_failure": result.cases_to_first_failure,
           "seconds_to_first_failure": None if result.seconds_to_first_failure is None
           else round(result.seconds_to_first_failure, 3),
           "flaky": failure.flaky, **({"shrink_budget": result.shrink_budget} if result.shrink_budget else {})}
    common = dict(source="fuzz", compared=compared, inputs=inputs, run=run, observations=reply,
                  detail="; ".join(d.summary() for d in failure.discrepancies),
                  traceback=reply.get("traceback"))
    if category in _LOOKUP_CATEGORIES and case.probe is not None and reply.get("ok"):
        # What the emitted regression test pins: the hits the contract admits
        # and, where the model is exact, the spec's hit.  (A lookup finding
        # means registration agreed, so what the writer handed is the spec's.)
        from kvspec.oracles.lookup import admissible_hits, exact_lookup_applies, expected_hit, handed_tokens

        inputs["admissible_hits"] = admissible_hits(case, caps, handed_tokens(case, reply))
        if exact_lookup_applies(case):
            inputs["expected_hit"] = expected_hit(case, caps, reply.get("calls", []))
    if first.call is None:
        verdict, note = _NO_CALL_LEDGER[category]
        return Finding(verdict=f"DISCREPANCY: {category.title} ({category.meaning}) in {label}",
                       category=category, ledger=Ledger(None, None, None, label, verdict, note),
                       **common)

    regime = expected_regime(case.config, caps)
    calls = reply["calls"][: first.call + 1]
    n, hashed = first.n, first.hashed_tokens
    spec_tokens, spec_blocks, spec_regs = first.expected_tokens, first.expected_blocks, first.registrations
    inputs["expected_calls"] = [list(tokens) for tokens in first.expected_calls]
    matches = diagnose(case, caps, reply)
    subject_regs = None
    if matches and variant(matches[0]).steps is not None:  # the diagnosed shape's derivation
        shape = variant(matches[0])
        subject_regs = expected_calls(case, regime, calls, steps=shape.steps)[-1][2]
    rows = _rows(case.config, (spec_tokens, spec_blocks), first.observed_tokens,
                 first.observed_blocks, spec_regs, subject_regs, matches[0] if matches else None)
    z3_leg = z3_bounds(case.config, n, max(n, hashed), partial=regime.partial_hash_hits,
                       eagle=regime.eagle, lookahead=regime.num_prefill_lookahead)
    oracle_leg, subject_leg = tuple(first.expected_tokens), tuple(first.observed_tokens)
    ledger = Ledger(z3_leg, oracle_leg, subject_leg, label,
                    blame_of(z3_leg, oracle_leg, subject_leg),
                    "tokens per group at the differing cache_blocks call")
    explanation = None
    if explain:
        explanation = explain_finding(
            case.config, n, max(n, hashed), rows, category, matches[0] if matches else None,
            partial=regime.partial_hash_hits, lookahead=regime.num_prefill_lookahead)
        if len(matches) > 1:
            explanation = _also(explanation, matches[1:])
    return Finding(verdict=_verdict_line(category, label, rows, n), category=category,
                   call=first.call, n=n, hashed_tokens=hashed, groups=rows,
                   explanation=explanation, ledger=ledger, **common)


def _also(explanation, others: tuple[str, ...]):
    import attrs

    return attrs.evolve(explanation, diagnosis_summary=(
        f"{explanation.diagnosis_summary} (also consistent here: {', '.join(others)})"))


def theorem_finding(result, versions: dict[str, str], known: dict[str, Any] | None = None) -> Finding | None:
    """A refuted theorem whose counterexample compares the spec with a variant, as a finding."""
    from kvspec.model.spec import evaluate_config
    from kvspec.model.variants import variant
    from kvspec.proofs.concrete import z3_bounds
    from kvspec.proofs.encoding import decode_geometry
    from kvspec.proofs.explain import explain as explain_finding
    from kvspec.proofs.verdict import Status

    cx = result.counterexample
    if result.status is not Status.REFUTED or cx is None or not cx.domain.get("calls"):
        return None
    call = cx.domain["calls"][0]
    others = [k for k in call if isinstance(call[k], dict) and k != "spec"]
    if not others:
        return _spec_property_finding(result, versions)
    name = others[0]
    shape = variant(name)
    config = decode_geometry(cx.values)
    n, total = call["num_computed_tokens"], call["total_tokens"]
    spec_regs = evaluate_config(config, n, total)
    subject_regs = evaluate_config(config, n, total, shape.rule, steps=shape.steps)
    rows = _rows(config, (call["spec"]["tokens"], call["spec"]["blocks"]), call[name]["tokens"],
                 call[name]["blocks"], spec_regs, subject_regs if shape.steps else None, name)
    diff = [r for r in rows if r.differs]
    if diff and diff[0].token_gap:
        category = Category.UNDER_REGISTRATION if diff[0].token_gap > 0 else Category.OVER_REGISTRATION
    else:
        category = Category.BLOCK_MISMATCH
    label = f"model variant {name}"
    z3_spec = z3_bounds(config, n, total, partial=config.partial_hash_hits,
                        eagle=config.effective_eagle, lookahead=config.num_prefill_lookahead)
    oracle = tuple(r.tokens_to_cache for r in spec_regs)
    subject = tuple(call[name]["tokens"])
    expected = "as expected" if result.as_expected else "NOT as expected"
    explanation = explain_finding(config, n, total, rows, category, name,
                                  partial=config.partial_hash_hits,
                                  lookahead=config.num_prefill_lookahead, known=known)
    return Finding(
        source="prove",
        verdict=f"REFUTED ({expected}): {result.name}: {result.statement}",
        category=category,
        compared={"spec_rule": SPEC_RULE, "subject": {"kind": "model variant", "label": label,
                                                     "variant": name, "summary": shape.summary},
                  "versions": versions, "mutant": None},
        inputs={"config": cx.domain["config"], "values": cx.values, "minimal": cx.minimal,
                "describe": cx.domain["config"]},
        n=n, hashed_tokens=(total // config.hash_block_size) * config.hash_block_size,
        groups=rows, explanation=explanation,
        ledger=Ledger(z3_spec, oracle, subject, label, blame_of(z3_spec, oracle, subject),
                      "the variant plays the implementation; its values are the solver's model, "
                      "replayed on integers"),
        detail=result.detail, run={"seconds": round(result.seconds, 3)},
    )


_PROPERTY_CATEGORY = {"safety": Category.OVER_REGISTRATION, "no-loss": Category.UNDER_REGISTRATION}


def _spec_property_finding(result, versions: dict[str, str]) -> Finding | None:
    """A theorem about the spec itself, refuted: the spec is at fault (or, when
    the refutation is expected, there is nothing to report)."""
    from kvspec.model.spec import evaluate_config
    from kvspec.proofs.concrete import z3_bounds
    from kvspec.proofs.encoding import decode_geometry

    if result.as_expected:
        return None
    cx = result.counterexample
    config = decode_geometry(cx.values)
    rows, legs = [], None
    for call in cx.domain["calls"]:
        n, total = call["num_computed_tokens"], call["total_tokens"]
        regs = evaluate_config(config, n, total)
        z3_spec = z3_bounds(config, n, total, partial=config.partial_hash_hits,
                            eagle=config.effective_eagle, lookahead=config.num_prefill_lookahead)
        legs = legs or (z3_spec, tuple(r.tokens_to_cache for r in regs))
        if not rows:
            rows = _rows(config, (call["spec"]["tokens"], call["spec"]["blocks"]),
                         [None] * len(regs), [None] * len(regs), regs, None, None)
    first = cx.domain["calls"][0]
    z3_spec, oracle = legs
    note = (f"the spec violates its own theorem {result.name}: {result.statement}"
            + ("" if z3_spec == oracle else "; and Z3 and the oracle disagree on its values"))
    return Finding(
        source="prove",
        verdict=f"REFUTED (NOT as expected): {result.name}: {result.statement}",
        category=_PROPERTY_CATEGORY.get(result.category, Category.PROPERTY_VIOLATION),
        compared={"spec_rule": SPEC_RULE, "subject": {"kind": "theorem", "label": result.name},
                  "versions": versions, "mutant": None},
        inputs={"config": cx.domain["config"], "values": cx.values, "minimal": cx.minimal,
                "describe": cx.domain["config"],
                "calls": [c["num_computed_tokens"] for c in cx.domain["calls"]]},
        n=first["num_computed_tokens"],
        hashed_tokens=(first["total_tokens"] // config.hash_block_size) * config.hash_block_size,
        groups=rows,
        ledger=Ledger(z3_spec, oracle, None, "the spec's own theorem", Blame.SPEC_BUG, note),
        detail=result.detail, run={"seconds": round(result.seconds, 3)},
    )
