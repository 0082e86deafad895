"""``kvspec hitrate``: the prefix-cache hit rate of real vLLM on a synthetic
workload, next to the spec's ideal (``oracles.hitrate``).

Each subject (a release, and that release with each ``--mutant`` applied)
replays the same multi-turn, concurrent workload through its own
``KVCacheManager``; the spec's ideal replays it with ``model.spec``'s
registration and ``model.lookup``'s hits; for a mutant, the model of its rule
(the wrong variant it implements) replays it too, so the report can say
whether the loss is exactly what the rule predicts and where it lands.

Exit codes: 0 every subject's hits equal the ideal's request by request,
1 some subject loses (or gains) hits against the ideal, 2 usage or setup error.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvspec import exitcodes

HITRATE_SCHEMA = "kvspec.hitrate/1"


LAYOUTS = ("mamba-hybrid", "full-attention")


def layout(name: str, scheduler_block_size: int):
    """The replayed model's KV-cache groups, the drafter's (EAGLE) with the
    hash block of 16.

    ``mamba-hybrid``: a Mamba "align" group whose block is the scheduler block
    (as vLLM sizes it) and a full-attention EAGLE group: partial hash hits,
    the path #50062 broke.  ``full-attention``: two full-attention groups, the
    layout whose lookup the model predicts exactly (``oracles.lookup``), so
    the spec's ideal is the reference there.
    """
    from model.domain import CoordinatorConfig, GroupKind, KVCacheGroup

    S = scheduler_block_size
    if name == "mamba-hybrid":
        groups = (KVCacheGroup(GroupKind.MAMBA_ALIGN, S), KVCacheGroup(GroupKind.FULL_ATTENTION, 16, eagle=True))
    else:
        groups = (KVCacheGroup(GroupKind.FULL_ATTENTION, 16, eagle=True), KVCacheGroup(GroupKind.FULL_ATTENTION, S))
    return CoordinatorConfig(groups=groups, scheduler_block_size=S, hash_block_size=16)


def replay_row(spec, label: str, config, workload, variant_name: str | None = None) -> dict[str, Any]:
    """One subject's replay, its ideal and (for a mutant) its rule's model.

    The ideal is exact only where the model's lookup is (full-attention
    layouts); with a Mamba group it leaves out how vLLM's scheduler places
    Mamba state checkpoints, so there it is shown, never used as a verdict."""
    from model.variants import variant
    from oracles.case import Case, prefill
    from oracles.hitrate import SpecCache, SubjectCache, replay
    from oracles.lookup import exact_lookup_applies
    from oracles.subject import SubjectProcess

    with SubjectProcess(spec) as proc:
        cache = SubjectCache(proc, config, workload)
        observed = replay(workload, cache)
        version = proc.capabilities.get("vllm_version")
    ideal = replay(workload, SpecCache(config, cache.regime))
    model = None
    if variant_name is not None:
        model = replay(workload, SpecCache(config, cache.regime, variant(variant_name).rule,
                                           f"model of {variant_name}"))

    return {
        "label": label, "vllm_version": version, "subject": spec.as_dict(),
        "mutant": variant_name is not None,
        "scheduler_block_size": config.scheduler_block_size,
        "ideal_exact": exact_lookup_applies(Case(config, 1, (prefill(1),))),
        **{k: v for k, v in observed.as_dict().items() if k != "backend"},
        "per_turn": [round(r, 6) for r in observed.per_turn()],
        "ideal_hit_rate": round(ideal.hit_rate, 6), "ideal_hits": [o.hit for o in ideal.outcomes],
        "ideal_per_turn": [round(r, 6) for r in ideal.per_turn()],
        "model_rule": variant_name or "spec",
        "model_hit_rate": round((model or ideal).hit_rate, 6),
        "model_matches_per_request": observed.as_dict()["hits"] == [o.hit for o in (model or ideal).outcomes],
        "prompt_lengths": [o.prompt_tokens for o in observed.outcomes],
        "turns": [o.turn for o in observed.outcomes],
    }


def compare_with_reference(rows: list[dict[str, Any]]) -> None:
    """Give every row its reference and what it loses against it: the spec's
    ideal where that is exact, else (a Mamba layout) the unmodified release
    the mutant was made from, replayed at the same scheduler block."""
    releases = {(r["vllm_version"], r["scheduler_block_size"]): r for r in rows if not r["mutant"]}
    for row in rows:
        if row["ideal_exact"]:
            ref_label, ref_hits, ref_rate, ref_turns = ("spec ideal", row["ideal_hits"], row["ideal_hit_rate"],
                                                        row["ideal_per_turn"])
        elif row["mutant"] and (row["vllm_version"], row["scheduler_block_size"]) in releases:
            base = releases[(row["vllm_version"], row["scheduler_block_size"])]
            ref_label, ref_hits, ref_rate, ref_turns = (base["label"], base["hits"], base["hit_rate"],
                                                        base["per_turn"])
        else:
            row["reference"] = None  # a release on a Mamba layout: nothing exact to hold it to
            continue
        differing = [(i, h, r) for i, (h, r) in enumerate(zip(row["hits"], ref_hits)) if h != r]
        first = None
        if differing:
            i, h, r = differing[0]
            first = {"request": i, "turn": row["turns"][i], "prompt_tokens": row["prompt_lengths"][i],
                     "reference_hit": r, "observed_hit": h}
        row["reference"] = {"label": ref_label, "hit_rate": ref_rate, "per_turn": ref_turns,
                            "points": round(100 * (row["hit_rate"] - ref_rate), 3),
                            "requests_differing": len(differing),
                            "hit_tokens_lost": sum(r - h for _, h, r in differing),
                            "first_difference": first}


def render_text(doc: dict[str, Any]) -> str:
    out = ["kvspec hitrate: prefix-cache hit rate of real vLLM on a synthetic workload",
           f"workload: {doc['workload']['text']}", f"layout:   {doc['layout']}", "",
           f"{'subject':<34} {'S':>4} {'hit rate':>8}  {'reference':<28} {'ref rate':>8} {'diff':>8}  model of its rule",
           "-" * 118]
    for r in doc["subjects"]:
        ref = r["reference"]
        model = (f"{r['model_rule']}: {100 * r['model_hit_rate']:.2f}% "
                 f"({'equal per request' if r['model_matches_per_request'] else 'differs'})"
                 if r["ideal_exact"] else "not exact with a Mamba group")
        refs = (f"{ref['label']:<28} {100 * ref['hit_rate']:7.2f}% {ref['points']:+7.2f}p" if ref
                else f"{'(none exact: Mamba layout)':<28} {'':>8} {'':>8}")
        out.append(f"{r['label']:<34} {r['scheduler_block_size']:>4} {100 * r['hit_rate']:7.2f}%  {refs}  {model}")
    for r in doc["subjects"]:
        ref = r["reference"]
        if not ref or not ref["requests_differing"]:
            continue
        f = ref["first_difference"]
        turns = ", ".join(f"turn {t}: {100 * a:.1f}% vs {100 * b:.1f}%"
                          for t, (a, b) in enumerate(zip(r["per_turn"], ref["per_turn"])))
        out += ["", f"{r['label']} (S={r['scheduler_block_size']}): {ref['requests_differing']} of {r['requests']} "
                    f"requests differ from {ref['label']}, {ref['hit_tokens_lost']} hit tokens lost "
                    f"({ref['hit_tokens_lost'] / ref['requests_differing']:.1f} per affected request)",
                f"  first: request {f['request']} (turn {f['turn']}, {f['prompt_tokens']} prompt tokens) "
                f"hit {f['observed_hit']}, reference {f['reference_hit']}",
                f"  per turn: {turns}"]
    for e in doc["errors"]:
        out.append(f"ERROR {e['label']}: {e['error']}")
    out += ["", f"VERDICT: {doc['verdict']}"]
    return "\n".join(out)


def _verdict(rows: list[dict[str, Any]], errors: list[dict[str, Any]]) -> tuple[str, int]:
    off = [f"{r['label']} (S={r['scheduler_block_size']}, {r['reference']['points']:+.2f} pts)"
           for r in rows if r["reference"] and r["reference"]["requests_differing"]]
    if off:
        return f"HIT-RATE DIFFERENCE against the reference on {', '.join(off)}", exitcodes.FINDING
    if errors:
        return "ERROR: some subjects could not be replayed (see above)", exitcodes.USAGE
    return "every subject's hits equal its reference's, request by request", exitcodes.OK


def cmd_hitrate(args: argparse.Namespace) -> int:
    from kvspec.cli import UsageError, _write
    from kvspec.hitrate_plot import render_svg
    from kvspec.mutants_command import mutant_tree
    from kvspec.subject_commands import _subject_specs, mutant_operators
    from model.workload import Workload
    from oracles.hitrate import ReplayError
    from oracles.provision import ProvisionError
    from oracles.subject import SubjectError, source_tree

    specs = _subject_specs(args)
    if not specs:
        raise UsageError("name a subject: --vllm 0.33.0 (a release) or --vllm-src PATH (a tree)")
    operators = mutant_operators(args)
    try:
        workload = Workload(seed=args.seed, conversations=args.conversations, turns=args.turns,
                            concurrency=args.concurrency)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        block_sizes = [int(x) for x in args.scheduler_block_size.split(",")]
        configs = [layout(args.layout, S) for S in block_sizes]
    except ValueError as exc:
        raise UsageError(f"--scheduler-block-size {args.scheduler_block_size}: {exc}") from None
    plan = [(spec, spec.label, None) for spec in specs]
    for version in args.vllm or []:
        for op in operators:
            plan.append((version, f"{version} + {op.name}", op))
    rows, errors = [], []
    for config in configs:
        for subject, label, op in plan:
            print(f"{label} (S={config.scheduler_block_size}): replaying {len(workload.requests())} requests",
                  flush=True)
            try:
                if op is not None:
                    subject = source_tree(str(mutant_tree(subject, op)))
                rows.append(replay_row(subject, label, config, workload,
                                       op.models_variant if op is not None else None))
            except (SubjectError, ProvisionError, ReplayError) as exc:
                errors.append({"label": label, "error": str(exc).splitlines()[0]})
    compare_with_reference(rows)
    verdict, code = _verdict(rows, errors)
    first = block_sizes[0]
    described = (configs[0].describe().replace(f"block {first})", "block S)")
                 .replace(f"S={first} ", "S=" + ",".join(map(str, block_sizes)) + " ", 1))
    doc = {"schema": HITRATE_SCHEMA, "verdict": verdict, "layout": described,
           "workload": {"text": workload.describe(), "seed": workload.seed,
                        "conversations": workload.conversations, "turns": workload.turns,
                        "concurrency": workload.concurrency},
           "subjects": rows, "errors": errors}
    print(render_text(doc))
    if args.json:
        _write(args.json, json.dumps(doc, indent=2, sort_keys=True))
    if args.svg and rows:
        _write(args.svg, render_svg(doc))
    return code


def register(sub: "argparse._SubParsersAction") -> None:
    from kvspec.subject_commands import add_subject_arguments

    hitrate = sub.add_parser("hitrate", help="prefix-cache hit rate of real vLLM on a workload vs the spec's ideal")
    add_subject_arguments(hitrate)
    hitrate.add_argument("--mutant", action="append", metavar="NAME",
                         help="also replay each --vllm release with this mutation applied (repeatable)")
    hitrate.add_argument("--layout", choices=LAYOUTS, default="mamba-hybrid",
                         help="mamba-hybrid (partial hash hits; mutants are held to their release) or "
                              "full-attention (held to the spec's exact ideal)")
    hitrate.add_argument("--scheduler-block-size", default="256", metavar="S[,S...]",
                         help="the scheduler block (the Mamba page); several values sweep it (default 256)")
    hitrate.add_argument("--seed", type=int, default=0, metavar="S", help="workload seed (default 0)")
    hitrate.add_argument("--conversations", type=int, default=24, metavar="N")
    hitrate.add_argument("--turns", type=int, default=4, metavar="N")
    hitrate.add_argument("--concurrency", type=int, default=16, metavar="N")
    hitrate.add_argument("--json", metavar="FILE", help="write the versioned result")
    hitrate.add_argument("--svg", metavar="FILE", help="write the plot")
    hitrate.set_defaults(func=cmd_hitrate)
