"""``kvspec mtp``: the question #52419 left open, answered with proofs and real vLLM.

vLLM refuses ``scheduler_block_size < num_prefill_lookahead`` with EAGLE
groups and prefix caching, because "hits land on scheduler-block boundaries,
so the excluded tail is scheduler_block_size".  Under partial hash hits hits
land on hash-block boundaries and the EAGLE drop is one hash unit.  This
command runs the ``mtp.*`` theorems, then looks for stale draft-KV reuse on
each subject under each hash scheme it has (``oracles.mtp``), and prints one
verdict; ``--markdown`` writes it as a finding a reviewer can post upstream.

Exit codes: 0 no stale reuse anywhere, 1 stale reuse found on a subject (or a
theorem not as expected), 2 usage or setup error, 3 a theorem timed out.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvspec import exitcodes

MTP_SCHEMA = "kvspec.mtp/1"
THEOREMS = ("mtp.no_stale_draft_reuse.partial_hits", "mtp.no_stale_draft_reuse",
            "mtp.stale_reuse_reachability", "mtp.no_stale_draft_reuse.scheduler_block_tail",
            "mtp.lookahead_hashes_prevent_stale_reuse")


def _model_side() -> list[dict[str, Any]]:
    from proofs.catalog import theorem
    from proofs.runner import run_theorem

    out = []
    for name in THEOREMS:
        result = run_theorem(theorem(name))
        out.append(result.as_dict())
    return out


def _subject_side(spec) -> dict[str, Any]:
    from oracles.mtp import HASH_SCHEMES, search_stale_reuse
    from oracles.subject import SubjectProcess

    with SubjectProcess(spec) as subject:
        caps = subject.capabilities
        if not caps.get("reprefillable_tokens"):
            return {"subject": spec.label, "vllm_version": caps.get("vllm_version"),
                    "unsupported": "no num_prefill_lookahead (multi-module MTP's prefill lookahead "
                                   "reaches the KV cache manager from 0.28)"}
        schemes = tuple(name for name in HASH_SCHEMES
                        if HASH_SCHEMES[name](1) == 0 or caps.get("lookahead_block_hashes"))
        found = search_stale_reuse(subject, schemes)
    results = {}
    for scheme, result in found.items():
        smallest = result.pop("smallest")
        rows = result["per_config"]
        result["smallest"] = None if smallest is None else {**smallest.as_dict(),
                                                            "text": smallest.describe()}
        # The model's condition is necessary: vLLM never shows stale reuse where
        # the model says it cannot happen.  (Not asked of lookahead hashes,
        # where the model's answer is no stale reuse at all.)
        result["model_necessary"] = all(r["model_predicts_stale"] for r in rows if r["vllm_stale"])
        result["model_condition_matches"] = all(
            bool(r["vllm_stale"]) == r["model_predicts_stale"] for r in rows)
        result["whole_block_condition_matches"] = all(
            bool(r["vllm_stale"]) == r["model_predicts_stale_whole_blocks"] for r in rows)
        results[scheme] = result
    return {"subject": spec.label, "vllm_version": caps.get("vllm_version"), "schemes": results}


def _verdict(theorems: list[dict[str, Any]], subjects: list[dict[str, Any]]) -> tuple[str, int]:
    unexpected = [t["name"] for t in theorems if not t["as_expected"] and t["status"] != "UNKNOWN"]
    unknown = [t["name"] for t in theorems if t["status"] == "UNKNOWN"]
    stale = [(s["subject"], scheme) for s in subjects for scheme, r in s.get("schemes", {}).items()
             if r["witnesses"]]
    if unexpected:
        return f"THEOREMS NOT AS EXPECTED: {', '.join(unexpected)}", exitcodes.FINDING
    if stale:
        where = "; ".join(f"{label} with {scheme}" for label, scheme in stale)
        return (f"COUNTEREXAMPLE: the guard S >= num_prefill_lookahead does not keep stale draft KV "
                f"out of prefix-cache hits (found on {where})"), exitcodes.FINDING
    if unknown:
        return f"UNKNOWN: the solver timed out on {', '.join(unknown)} (never counted as proved)", exitcodes.UNKNOWN
    return "NO STALE REUSE on the subjects tested; the model's counterexample stands", exitcodes.OK


def _theorem_line(t: dict[str, Any]) -> str:
    line = f"  {t['status']:<8} {t['name']}: {t['statement']}"
    cx = t.get("counterexample")
    if cx:
        v = cx["values"]
        line += (f"\n           minimal: S={v['S']} H={v['H']} B={v['B']} L={v['L']} n={v['n']} "
                 f"EAGLE={v['E']} partial hits={v['P']}")
    return line


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _label(s: dict[str, Any]) -> str:
    version = s.get("vllm_version")
    return s["subject"] if not version or version in s["subject"] else f"{s['subject']} (vLLM {version})"


def render_text(doc: dict[str, Any]) -> str:
    out = ["kvspec mtp: can a prefix-cache hit keep draft KV computed from tokens the later request "
           "does not share? (multi-module MTP; the question #52419 left open)", "", "model (Z3, unbounded integers):"]
    out += [_theorem_line(t) for t in doc["theorems"]]
    out += ["", "real vLLM (a writer request, then a later request sharing each proper prefix):"]
    for s in doc["subjects"]:
        if "unsupported" in s:
            out.append(f"  {s['subject']}: unsupported: {s['unsupported']}")
            continue
        for scheme, r in s["schemes"].items():
            out.append(f"  {_label(s)}, {scheme}: {r['witnesses']} of "
                       f"{r['cases']} lookups keep stale draft KV"
                       + (f"; {r['error_count']} errors, first: {r['errors'][0]}" if r["error_count"] else ""))
            if r["smallest"]:
                out.append(f"    smallest: {r['smallest']['text']}")
            if r["witnesses"]:
                yes = _yes
                out.append(f"    per configuration: stale only where the model allows it: "
                           f"{yes(r['model_necessary'])}; exactly where the model's L > drop tail holds: "
                           f"{yes(r['model_condition_matches'])}; exactly where L > the EAGLE group's "
                           f"block: {yes(r['whole_block_condition_matches'])}")
    out += ["", f"VERDICT: {doc['verdict']}"]
    return "\n".join(out)


def render_markdown(doc: dict[str, Any]) -> str:
    lines = [f"## kvspec mtp: {doc['verdict']}", "",
             "**Question (#52419).** The coordinator's guard `scheduler_block_size >= num_prefill_lookahead` "
             "is justified by \"hits land on scheduler-block boundaries, so the excluded tail is "
             "scheduler_block_size\". Under partial hash hits, hits land on hash-block boundaries and the "
             "EAGLE drop is one hash unit (`FullAttentionManager.find_longest_cache_hit`). The draft KV at a "
             "kept position p was computed from the writer's tokens up to p + num_prefill_lookahead "
             "(`VllmConfig.num_hash_lookahead_tokens`' own account), so a hit whose drop tail is shorter "
             "than the lookahead keeps draft KV that read tokens the later request does not share.", "",
             "**Model (Z3 over unbounded integers).**", "",
             "| theorem | verdict | minimal counterexample |", "|---|---|---|"]
    for t in doc["theorems"]:
        cx = t.get("counterexample")
        shown = ""
        if cx:
            v = cx["values"]
            shown = f"S={v['S']} H={v['H']} B={v['B']} L={v['L']} n={v['n']} partial={v['P']}"
        lines.append(f"| `{t['name']}`: {t['statement']} | {t['status']} | {shown} |")
    lines += ["", "**Real vLLM** (a writer request, then a later request sharing each proper prefix of the "
              "writer's tokens; `get_computed_blocks`):", "",
              "| subject | hash scheme | lookups | stale | smallest witness |", "|---|---|---|---|---|"]
    for s in doc["subjects"]:
        if "unsupported" in s:
            lines.append(f"| {s['subject']} | - | - | - | unsupported: {s['unsupported']} |")
            continue
        for scheme, r in s["schemes"].items():
            witness = r["smallest"]["text"] if r["smallest"] else "none"
            lines.append(f"| {_label(s)} | {scheme} | {r['cases']} | "
                         f"{r['witnesses']} | {witness} |")
    lines += ["", "**Per configuration.** The proved condition (stale iff EAGLE and L > drop tail; the tail "
              "is H under partial hits for a group that can hit inside its block, its block B otherwise) "
              "against what each subject did:", ""]
    for s in doc["subjects"]:
        for scheme, r in s.get("schemes", {}).items():
            if r["witnesses"]:
                lines.append(f"- {_label(s)}, {scheme}: stale only where the model allows it: "
                             f"{_yes(r['model_necessary'])}; exactly where L > drop tail: "
                             f"{_yes(r['model_condition_matches'])}; exactly where L > the EAGLE group's block: "
                             f"{_yes(r['whole_block_condition_matches'])}")
    lines += ["", "**Where it bites.** Stale reuse needs num_speculative_tokens (the prefill lookahead) larger "
              "than the drop tail: with partial hash hits the hash block, else the EAGLE group's block. "
              "The guard only checks the scheduler block, which is larger (vLLM sizes it to the Mamba page), "
              "so it admits every L in (tail, S]. With lookahead block hashes (0.33's default) no drop "
              "is needed and no hit keeps stale draft KV.", "",
              "**Suggested fix.** Check the lookahead against the tail the lookup actually drops: under "
              "partial hash hits `hash_block_size >= num_prefill_lookahead` (else each EAGLE group's "
              "`block_size >= num_prefill_lookahead`), or require lookahead block hashes whenever "
              "`num_prefill_lookahead > 1` (0.33's default; the legacy hashes come back with a KV connector "
              "or `disable_lookahead_block_hashes`), and correct the comment.", "",
              f"_Reproduce: `{doc['command']}`_"]
    return "\n".join(lines)


def cmd_mtp(args: argparse.Namespace) -> int:
    from kvspec.cli import UsageError, _write
    from kvspec.subject_commands import _subject_specs
    from oracles.provision import ProvisionError
    from oracles.subject import SubjectError

    specs = _subject_specs(args)
    if not specs:
        raise UsageError("name a subject: --vllm 0.33.0 (a release) or --vllm-src PATH (a tree)")
    theorems = _model_side()
    subjects = []
    try:
        for spec in specs:
            subjects.append(_subject_side(spec))
    except (SubjectError, ProvisionError) as exc:
        message = f"{exc}; results so far are written"
        error = UsageError(message)
    else:
        error = None
    verdict, code = _verdict(theorems, subjects)
    command = "kvspec mtp " + " ".join([f"--vllm {v}" for v in args.vllm or []]
                                       + [f"--vllm-src {p}" for p in args.vllm_src or []])
    doc = {"schema": MTP_SCHEMA, "verdict": verdict, "command": command.strip(),
           "theorems": theorems, "subjects": subjects}
    print(render_text(doc))
    if args.json:
        _write(args.json, json.dumps(doc, indent=2, sort_keys=True))
    if args.markdown:
        _write(args.markdown, render_markdown(doc))
    if error is not None:
        raise error
    return code


def register(sub: "argparse._SubParsersAction") -> None:
    from kvspec.subject_commands import add_subject_arguments

    mtp = sub.add_parser("mtp", help="multi-module MTP: can a hit keep stale draft KV? (proofs and real vLLM)")
    add_subject_arguments(mtp)
    mtp.add_argument("--json", metavar="FILE", help="write the versioned result")
    mtp.add_argument("--markdown", metavar="FILE", help="write the verdict as a finding to post upstream")
    mtp.set_defaults(func=cmd_mtp)
