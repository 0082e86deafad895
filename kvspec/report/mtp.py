"""The MTP verdict and its reports: terminal text and a Markdown finding to
post upstream."""

from __future__ import annotations

from typing import Any

from kvspec.model.outcome import Outcome

__all__ = ["verdict", "render_text", "render_markdown"]


def verdict(theorems: list[dict[str, Any]], subjects: list[dict[str, Any]]) -> tuple[str, Outcome]:
    """The verdict the evidence supports, and its outcome: a theorem not as
    expected, the model disagreeing with vLLM, or stale reuse under lookahead
    hashes is a finding; stale reuse exactly where the model says (legacy
    hashes, L > drop tail) is hardening -- draft KV only feeds proposals the
    target verifies, so the effect is on acceptance, and no deployment profile
    reaches it unless one is named; none at all is OK."""
    unexpected = [t["name"] for t in theorems if not t["as_expected"] and t["status"] != "UNKNOWN"]
    unknown = [t["name"] for t in theorems if t["status"] == "UNKNOWN"]
    stale = [(s["subject"], scheme, r) for s in subjects for scheme, r in s.get("schemes", {}).items()
             if r["witnesses"]]
    if unexpected:
        return f"THEOREMS NOT AS EXPECTED: {', '.join(unexpected)}", Outcome.FINDING
    disagree = [f"{s['subject']} with {scheme}" for s in subjects for scheme, r in s.get("schemes", {}).items()
                if not r.get("model_necessary", True)
                or (HASH_LEGACY in scheme and not r.get("model_condition_matches", True))]
    if disagree:
        return (f"MODEL DISAGREES WITH vLLM on {'; '.join(disagree)}: stale reuse where the model says there is "
                "none, or none where it says there is (a model bug until shown otherwise)"), Outcome.FINDING
    if any(HASH_LEGACY not in scheme for _, scheme, _ in stale):
        where = "; ".join(f"{label} with {scheme}" for label, scheme, _ in stale if HASH_LEGACY not in scheme)
        return f"COUNTEREXAMPLE: stale draft KV under lookahead block hashes ({where})", Outcome.FINDING
    if stale:
        where = "; ".join(f"{label} ({r['witnesses']} of {r['cases']} lookups)" for label, _, r in stale)
        reached = sorted({p["profile"] for s in subjects for p in (s.get("reach") or {}).get("profiles", [])})
        who = (f"deployment profiles that reach it: {', '.join(reached)}" if reached else
               "no deployment profile of the catalog reaches it (their drop tails, the hash block or the EAGLE "
               "group's block, are 16 tokens or more; the prefill lookahead is num_speculative_tokens)")
        results = [r for _, _, r in stale]
        refused_safe = sorted({c for r in results for c in r.get("fix_refuses_safe", ())})
        refused_profiles = sorted({p for s in subjects for p in (s.get("reach") or {}).get("fix_refuses_profiles", [])})
        fix = ("the suggested guard (L <= the drop tail, under legacy hashes) refuses "
               + ("every stale configuration found" if all(r.get("fix_refuses_every_stale") for r in results)
                  else "NOT every stale configuration found")
               + (f", but also {len(refused_safe)} that vLLM handled safely" if refused_safe
                  else ", none that vLLM handled safely")
               + (f" and these deployment profiles: {', '.join(refused_profiles)}" if refused_profiles
                  else ", and no deployment profile"))
        return (f"HARDENING: with legacy hashes and the EAGLE drop a prefix-cache hit keeps stale draft KV exactly "
                f"where the model's condition holds (EAGLE and L > drop tail), as vLLM's own scheduler chunks the "
                f"writer ({where}); {who}; the effect is on speculative acceptance only (draft KV feeds "
                f"proposals the target verifies; outputs change only under lossy rejection sampling); {fix}"
                ), Outcome.HARDENING
    if unknown:
        return f"UNKNOWN: the solver timed out on {', '.join(unknown)} (never counted as proved)", Outcome.UNKNOWN
    return "NO STALE REUSE on the subjects tested; the model's counterexample stands", Outcome.OK


HASH_LEGACY = "legacy hashes"


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
