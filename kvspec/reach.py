"""Which real deployments reach a finding, and how badly (``model.finding.Reach``).

A finding is held against every deployment profile of the catalog
(``model/deployments.py``) as the finding's release builds it: the
derivation calls the release's own configuration code
(``subjects/drivers/deployments.py``; modelled, and said so, where it cannot
run), under each hash scheme the release offers the profile.  On each
profile's coordinator configuration the finding's rule is run -- the model
variant the subject was diagnosed as (``model.variants``), over every
request length up to two scheduler blocks past the reprefillable tokens --
or, for a finding no variant explains, the live subject itself on a few
requests of that configuration.  A profile is affected where the rule and
the spec differ.

Impact in the worst affected profile: tokens lost (or registered beyond the
spec) at a request's end, the largest and the mean over request lengths, and
the hit-rate points of the hit-rate replay on that profile
(``subjects/drivers/hitrate.py``, what ``kvspec hitrate`` runs) where affordable.  The explanation's knob
lines are generated here from the derivations (what the reached profiles
share and the others lack, and the release's own speculative-method table),
never written per rule.  A finding no profile reaches, or whose effect is
only on speculative acceptance, is hardening (``Outcome.HARDENING``).
"""

from __future__ import annotations

import os
from typing import Any, Callable

import attrs

from kvspec.model.arith import INT
from kvspec.model.capabilities import Capabilities, expected_regime
from kvspec.model.deployments import CATALOG, Derivation, profile as profile_named
from kvspec.model.finding import Category, Finding, Reach
from kvspec.model.replies import ErrorKind
from kvspec.model.spec import inputs_for_group, registration_bound

__all__ = ["assess", "attach", "rule_impact", "knob_lines", "ACCEPTANCE_ONLY"]

Say = Callable[[str], None]
# Categories whose effect is on speculative acceptance only (the drafter's
# proposals), never on the target's outputs.
ACCEPTANCE_ONLY: tuple[str, ...] = ()
_REGISTRATION = (Category.UNDER_REGISTRATION, Category.OVER_REGISTRATION, Category.BLOCK_MISMATCH)
# The lookup differential's categories (oracles/lookup.py): looked for
# through vLLM's engine as registration findings are.
_LOOKUP = (Category.LOOKUP_CONTRACT, Category.HIT_MISMATCH)


def _quiet(message: str) -> None:
    return None


# -- the rule on one configuration -------------------------------------------------

def rule_impact(config, caps: Capabilities, rule) -> dict[str, Any]:
    """Spec minus ``rule`` for every group at every request length n from 1 to
    ``2 S + R`` (every residue of n modulo S, past the reprefillable tokens):
    where they differ and by how much, as at a request's last ``cache_blocks``."""
    regime = expected_regime(config, caps)
    S = config.scheduler_block_size
    top = 2 * S + max(0, regime.num_prefill_lookahead - 1)
    groups = []
    for g, group in enumerate(config.groups):
        lost, over, differing = 0, 0, 0
        total_lost = 0
        first = None
        for n in range(1, top + 1):
            p = inputs_for_group(config, g, n, partial=regime.partial_hash_hits, eagle=regime.eagle[g],
                                 lookahead=regime.num_prefill_lookahead)
            gap = registration_bound(INT, p) - rule(INT, p)
            if gap:
                differing += 1
                first = n if first is None else first
                lost, over = max(lost, gap), max(over, -gap)
                total_lost += max(gap, 0)
        groups.append({"group": g, "kind": group.kind.value, "block_size": group.block_size,
                       "eagle": bool(regime.eagle[g]), "lengths_differing": differing, "of_lengths": top,
                       "max_tokens_lost": lost, "max_tokens_over": over,
                       "mean_tokens_lost": round(total_lost / top, 1), "first_n": first})
    worst = max(groups, key=lambda r: (r["max_tokens_lost"], r["max_tokens_over"], r["lengths_differing"]))
    return {"affected": any(r["lengths_differing"] for r in groups), "groups": groups,
            "max_tokens_lost": worst["max_tokens_lost"], "max_tokens_over": worst["max_tokens_over"],
            "mean_tokens_lost": worst["mean_tokens_lost"],
            "fraction_of_lengths": round(worst["lengths_differing"] / worst["of_lengths"], 3),
            "eagle_branch_live": regime.eagle_branch_live, "hash_scheme": regime.hash_scheme}


def _subject_impact(proc, config, category: Category) -> dict[str, Any]:
    """The live subject on a few requests of ``config`` (lengths around the
    scheduler and group blocks, a prefill then decodes), judged by the oracle:
    for a finding no model variant explains."""
    from kvspec.model.case import Case, decode, prefill
    from kvspec.oracles.lookup import check_case
    from kvspec.model.requests import Stream

    S = config.scheduler_block_size
    lengths = sorted({n for b in {g.block_size for g in config.groups} | {S, config.hash_block_size}
                      for n in (b - 1, b, b + 1, S + b + 1, 2 * S - 1) if 1 <= n <= 8192})
    cases = [Case(config, n, (prefill(n), decode(), decode(2, 1))) for n in lengths]
    found = 0
    for case, reply in zip(cases, proc.run_many(Stream.of(cases))):
        discrepancies = check_case(case, proc.capabilities, reply)
        found += bool(discrepancies) and discrepancies[0].category is category
    return {"affected": found > 0, "requests": len(cases), "requests_differing": found,
            "how": "the subject itself (no model variant explains the finding)"}


# -- the catalog's derivations for the finding's release -------------------------------

def _release_of(finding: Finding) -> str | None:
    subject = finding.compared.get("subject") or {}
    return subject.get("version") or subject.get("vllm_version")


def _derivations(finding: Finding, say: Say) -> tuple[list[Derivation], str]:
    """Each profile under each scheme, from the release's code where it runs."""
    from kvspec.model.deployments import derive, schemes_for
    from kvspec.subjects.drivers.deployments import derivations
    from kvspec.subjects.subject import release, source_tree

    subject = finding.compared.get("subject") or {}
    version = _release_of(finding)
    if version is None:
        from kvspec.model.about import NEWEST_VALIDATED

        version = NEWEST_VALIDATED
    try:
        if subject.get("kind") in ("release", "mutant") and subject.get("version"):
            probed_on = release(subject["version"])
        elif subject.get("path"):
            probed_on = source_tree(subject["path"])
        else:
            raise LookupError("no release or tree to call")
        say(f"  reach: deriving the catalog's {len(CATALOG)} deployment profiles with {probed_on.label}'s "
            "own configuration code")
        return derivations(probed_on, version), version
    except Exception as exc:  # the probe could not run: every step modelled, and said so
        why = f"{type(exc).__name__}: {exc}"
        return [derive(p, version, legacy_hashes=legacy).because_not_called(why)
                for p in CATALOG for legacy in schemes_for(p, version)], version


# -- knob lines, generated from the derivations --------------------------------------

def knob_lines(reached: list[Derivation], derived: list[Derivation], facts: dict[str, Any] | None,
               release: str) -> tuple[str, ...]:
    """What the profiles that reach a finding have and the others lack, from
    the derivations (called or modelled, as each says), plus the release's
    table of speculative methods: the deployment knobs of this finding."""
    lines = []
    in_scope = [d for d in derived if d.coordinator_config() is not None]
    if not reached:
        lines.append(f"on vLLM {release}, {len(in_scope)} of {len(derived)} profile derivations run the hybrid "
                     "coordinator's registration; none reaches this finding")
    schemes = sorted({d.hash_scheme for d in reached})
    if reached and schemes == ["legacy"] and any(d.hash_scheme == "lookahead" for d in derived):
        lines.append("hash scheme: reached only with legacy block hashes; by default this release gives "
                     "EAGLE-family drafters lookahead hashes (VllmConfig.num_hash_lookahead_tokens) and the "
                     "scheduler builds KVCacheManager(use_eagle=False): legacy hashes come with "
                     "disable_lookahead_block_hashes or a KV connector without lookahead-hash support")
    if reached:
        partial = {d.partial_hash_hits for d in reached}
        if partial == {True}:
            why = []
            for d in reached:
                p = profile_named(d.profile)
                knob = (f"prefix_match_unit={p.prefix_match_unit}" if p.prefix_match_unit
                        else f"DCP {p.dcp}" if p.dcp > 1 else "the geometry")
                why.append(f"{d.profile}: {knob} -> H={d.hash_block_size}, Mamba block "
                           f"{[g.block_size for g in d.groups if g.kind == 'mamba_align']}")
            lines.append("partial hash hits on in every profile that reaches it (the coordinator's "
                         f"enable_partial_hash_hits): {'; '.join(sorted(set(why)))}")
        eagle = {d.eagle_branch_live for d in reached}
        if eagle == {True}:
            parts = sorted({f"{d.profile}: EAGLE group block(s) "
                            f"{sorted({g.block_size for g in d.groups if g.eagle})} vs S={d.scheduler_block_size}"
                            for d in reached})
            lines.append("EAGLE branch live (use_eagle=True and an EAGLE group) in every profile that reaches it: "
                         + "; ".join(parts))
        lookaheads = sorted({d.num_prefill_lookahead for d in reached})
        lines.append(f"num_prefill_lookahead in the profiles that reach it: {lookaheads} "
                     f"(reprefillable tokens {[max(0, x - 1) for x in lookaheads]})")
        hypothetical = sorted({d.profile for d in reached if profile_named(d.profile).hypothetical})
        if hypothetical:
            lines.append("hypothetical drafter geometry (no published drafter config was read): "
                         + ", ".join(hypothetical))
    if facts:
        methods = facts.get("speculative_methods") or {}
        key = "use_eagle_block_drop" if any("use_eagle_block_drop" in m for m in methods.values()) else "use_eagle"
        drop = sorted(m for m, f in methods.items() if f.get(key) is True)
        other = sorted(m for m, f in methods.items() if f.get(key) is False)
        lines.append(f"speculative methods with the EAGLE block drop on vLLM {release} (SpeculativeConfig.{key}, "
                     f"called): {', '.join(drop)}; without: {', '.join(other)}")
    return tuple(lines)


# -- the assessment ---------------------------------------------------------------------

def _entry(d: Derivation, impact: dict[str, Any]) -> dict[str, Any]:
    p = profile_named(d.profile)
    config = d.coordinator_config()
    return {"profile": d.profile, "family": p.family, "model": p.model.name, "knobs": p.knobs(),
            "provenance": p.provenance, "hypothetical": p.hypothetical, "release": d.release,
            "hash_scheme": d.hash_scheme, "configuration": config.describe() if config else None,
            "derivation": {"summary": d.summary(), "called": list(d.called), "modelled": list(d.modelled),
                           "steps": [s.text() for s in d.steps]},
            "impact": impact}


def _replayed_rate(subject, live, config, workload) -> float:
    """The workload's hit rate on ``subject``: on the live worker when it is
    that subject's, else in a worker of its own."""
    from kvspec.subjects.drivers.hitrate import SubjectCache, replay
    from kvspec.subjects.process import SubjectProcess

    if live is not None and getattr(live, "subject", None) == subject:
        return replay(workload, SubjectCache(live, config, workload)).hit_rate
    with SubjectProcess(subject) as proc:
        return replay(workload, SubjectCache(proc, config, workload)).hit_rate


def _hitrate(finding: Finding, worst: Derivation, say: Say, proc=None) -> dict[str, Any]:
    """Hit-rate points lost on the worst profile: the subject replayed against
    the release it was made from (a mutant), or, for a release, against the
    model of the diagnosed rule beside the spec's ideal (both modelled).  The
    release's replay depends only on its tree, the configuration, the
    workload and kvspec's code: recorded once and reused (said so)."""
    from concurrent.futures import ThreadPoolExecutor

    from kvspec.controls import recorded_value
    from kvspec.model.workload import Workload
    from kvspec.subjects.subject import mutant_subject, release

    subject = finding.compared.get("subject") or {}
    config = worst.coordinator_config()
    workload = Workload()
    if subject.get("kind") == "mutant":
        say(f"  reach: hit-rate replay of {subject['label']} and vLLM {subject['version']} on {worst.profile}")
        base = release(subject["version"])
        with ThreadPoolExecutor(max_workers=1) as pool:  # the release's replay beside the mutant's
            reference = pool.submit(recorded_value, "hitrate", base,
                                    {"config": config.describe(), "workload": repr(workload)},
                                    lambda: _replayed_rate(base, proc, config, workload))
            rate = _replayed_rate(mutant_subject(subject["version"], subject["mutant"]), proc, config, workload)
            reference_rate, recorded = reference.result()
        how = "measured: both replayed on real vLLM (kvspec hitrate's default workload)"
        if recorded:
            how += f"; the release's replay recorded {recorded} and reused (same tree, configuration, workload)"
        return {"profile": worst.profile, "subject_hit_rate": round(rate, 6),
                "reference": f"vllm {subject['version']}", "reference_hit_rate": round(reference_rate, 6),
                "points": round(100 * (rate - reference_rate), 2), "how": how}
    diagnosis = finding.explanation.diagnosis if finding.explanation else None
    if diagnosis is None or subject.get("kind") != "release":
        return {"profile": worst.profile, "points": None,
                "how": "not measured: no unmodified release to replay against and no model variant"}
    from kvspec.model.variants import variant
    from kvspec.oracles.ideal_cache import SpecCache
    from kvspec.subjects.drivers.hitrate import replay

    regime = expected_regime(config, finding.subject_capabilities())
    ideal = replay(workload, SpecCache(config, regime))
    model = replay(workload, SpecCache(config, regime, variant(diagnosis).rule, diagnosis))
    return {"profile": worst.profile, "subject_hit_rate": model.hit_rate, "reference": "spec ideal",
            "reference_hit_rate": ideal.hit_rate, "points": round(100 * (model.hit_rate - ideal.hit_rate), 2),
            "how": "modelled: the diagnosed rule's model against the spec's ideal cache (not exact with Mamba "
                   "groups, whose checkpoints follow the scheduler's chunking)"}


def assess(finding: Finding, *, proc=None, hitrate: bool = True, say: Say = _quiet) -> Reach:
    """Run the finding's rule against every profile of the catalog on its release."""
    return _assess(finding, proc=proc, hitrate=hitrate, say=say)[0]


def _assess(finding: Finding, *, proc=None, hitrate: bool = True,
            say: Say = _quiet) -> tuple[Reach, tuple[str, ...]]:
    """The Reach and the knob lines generated from the same derivations."""
    from kvspec.model.variants import variant

    if "engine_reproduction" in (finding.inputs or {}) and "program" in (finding.inputs or {}):
        # A stateful finding looked for through vLLM's engine
        # (diff_tests/reproduce.py): reachable with its engine settings, or
        # hand-built only after the stated search (hardening).
        from kvspec.model.nearest_engine import reproduction_reach

        return reproduction_reach(finding.inputs["engine_reproduction"]), ()
    if "program" in (finding.inputs or {}):
        # A stateful finding is an operation sequence on one geometry; the
        # profiles are not driven through programs, so who it reaches is not
        # measured (and so never called hardening for want of a measurement).
        return Reach("Not assessed: a stateful finding is a program on the finding's own geometry; kvspec does "
                     "not replay programs on the deployment profiles", (), None, hardening=False), ()
    caps = finding.subject_capabilities()
    diagnosis = finding.explanation.diagnosis if finding.explanation else None
    rule = variant(diagnosis).rule if diagnosis else None
    # The live subject is driven only for registration-side findings, and not
    # when the worker itself died on the case (every request would kill it again).
    observations = finding.observations or {}
    # (``crashed``: how a finding stored before the error kinds says it.)
    died = observations.get("error_kind") == ErrorKind.CRASHED.value or bool(observations.get("crashed"))
    registration = (finding.category in _REGISTRATION or finding.category is Category.SUBJECT_CRASH) and not died
    if rule is None and not (proc is not None and registration):
        why = ("the worker process died on the case" if died else
               "no live subject was at hand to drive the profiles" if registration else
               "the profiles are not driven for this category")
        return Reach(f"Not assessed: no model variant explains this {finding.category.title} finding and {why}",
                     (), None, hardening=False), ()
    from kvspec.model.deployments import FIRST_DERIVED, config_era

    version = _release_of(finding)
    if version is not None and config_era(version) is None:
        return Reach(f"Not assessed: kvspec derives deployment profiles from vLLM {FIRST_DERIVED} on, and this "
                     f"finding is on {version}", (), None, hardening=False), ()
    derived, release = _derivations(finding, say)
    entries, reached = [], []
    assessed = 0
    for d in derived:
        config = d.coordinator_config()
        if config is None or config.dcp_world_size > 1 and rule is None:
            continue
        assessed += 1
        if rule is not None:
            impact = {**rule_impact(config, caps, rule), "how": f"the diagnosed rule {diagnosis} (model.variants)"}
        elif proc is not None and registration:
            impact = _subject_impact(proc, config, finding.category)
        else:
            continue
        if impact["affected"]:
            entries.append(_entry(d, impact))
            reached.append(d)
    facts = _release_facts(finding)
    knobs = knob_lines(reached, derived, facts, release)
    out_of_scope = sorted({f"{d.profile}: {d.in_scope}" for d in derived if d.in_scope})
    acceptance_only = finding.category.value in ACCEPTANCE_ONLY
    worst = None
    if entries:
        best = max(range(len(entries)), key=lambda i: (entries[i]["impact"].get("max_tokens_lost", 0),
                                                         entries[i]["impact"].get("max_tokens_over", 0),
                                                         entries[i]["impact"].get("requests_differing", 0)))
        w = entries[best]
        worst = {"profile": w["profile"], "hash_scheme": w["hash_scheme"], "release": release,
                 "max_tokens_lost": w["impact"].get("max_tokens_lost"),
                 "max_tokens_over": w["impact"].get("max_tokens_over"),
                 "mean_tokens_lost": w["impact"].get("mean_tokens_lost"),
                 "fraction_of_lengths": w["impact"].get("fraction_of_lengths")}
        if hitrate and os.environ.get("KVSPEC_REACH_HITRATE", "1") != "0" and rule is not None:
            try:
                worst["hitrate"] = _hitrate(finding, reached[best], say, proc)
            except Exception as exc:  # the replay is extra evidence; its failure is said, not fatal
                worst["hitrate"] = {"profile": w["profile"], "points": None,
                                    "how": f"not measured: {type(exc).__name__}: {exc}"}
        else:
            worst["hitrate"] = {"profile": w["profile"], "points": None,
                                "how": "not measured (KVSPEC_REACH_HITRATE=0, or no model variant)"}
    # An engine finding (a registration one: every cache_blocks call vLLM's
    # Scheduler makes is held to the bound) is reached by its engine flags,
    # whatever the catalog says: the profiles' verdict stands beside it.
    engine = (finding.inputs or {}).get("how_a_user_reaches_it") if "engine_program" in (finding.inputs or {}) \
        else None
    summary = _summary(finding, entries, reached, derived, assessed, release, worst, acceptance_only,
                       engine=isinstance(engine, str))
    if out_of_scope:
        summary += f"; not assessed, outside the hybrid coordinator: {'; '.join(out_of_scope)}"
    hardening = not entries or acceptance_only
    if isinstance(engine, str):
        summary, hardening = f"{engine}. Deployment profiles: {summary}", acceptance_only
    return Reach(summary, tuple(entries), worst, hardening=hardening), knobs


def _release_facts(finding: Finding) -> dict[str, Any] | None:
    from kvspec.subjects.drivers.deployments import probe_release
    from kvspec.subjects.subject import release

    version = (finding.compared.get("subject") or {}).get("version")
    if not version:
        return None
    try:
        return probe_release(release(version)).get("release_facts")
    except Exception:
        return None


def _summary(finding: Finding, entries: list[dict[str, Any]], reached: list[Derivation],
             derived: list[Derivation], assessed: int, release: str, worst: dict[str, Any] | None,
             acceptance_only: bool, engine: bool = False) -> str:
    what = finding.explanation.diagnosis if finding.explanation and finding.explanation.diagnosis \
        else finding.category.title
    profiles = len({d.profile for d in derived})
    if not entries:
        checked = sorted({d.profile for d in derived if d.coordinator_config() is not None})
        return (f"No known deployment: on vLLM {release}, {what} changes nothing in any of the {assessed} "
                f"profile x hash-scheme configurations the hybrid coordinator runs ({profiles} profiles in "
                f"the catalog; checked: {', '.join(checked) or 'none'})" + (
                    "" if engine else "; no engine configuration was driven for it; it shows on hand-built "
                                      "geometry only (hardening)"))
    names = sorted({e["profile"] for e in entries})
    published = sorted({e["profile"] for e in entries if not e["hypothetical"]})
    schemes = sorted({e["hash_scheme"] for e in entries})
    text = (f"On vLLM {release}, {what} reaches {len(names)} of {profiles} deployment profiles "
            f"({', '.join(names)}), under {' and '.join(schemes)} hashes")
    if not published:
        text += "; only with hypothetical drafter geometry (no published drafter config was read)"
    if worst is not None:
        lost = worst.get("max_tokens_lost") or 0
        over = worst.get("max_tokens_over") or 0
        if lost or over:
            text += (f"; worst: {worst['profile']}, up to {lost or over} tokens "
                     f"{'lost' if lost else 'registered beyond the spec'} at a request's end "
                     f"(mean {worst.get('mean_tokens_lost')} over request lengths, "
                     f"{round(100 * (worst.get('fraction_of_lengths') or 0))}% of lengths)")
        points = (worst.get("hitrate") or {}).get("points")
        if points is not None:
            text += f", {points:+.2f} hit-rate points on the replayed workload"
    if acceptance_only:
        text += "; its effect is on speculative acceptance only (hardening)"
    return text


def attach(finding: Finding, *, proc=None, hitrate: bool = True, say: Say = _quiet) -> Finding:
    """``finding`` with its Reach and generated knob lines (the hook
    ``kvspec.usecases.fuzz.fuzz`` calls right after a finding is completed)."""
    try:
        reach, knobs = _assess(finding, proc=proc, hitrate=hitrate, say=say)
    except Exception as exc:  # never lose a finding to its assessment
        return attrs.evolve(finding, reach=Reach(f"Not assessed: {type(exc).__name__}: {exc}"))
    inputs, configuration, impact = finding.inputs, {}, finding.impact
    reproduction = _engine_reproduction(finding, proc, say)
    if reproduction is not None:
        # Recorded and said in the configuration as a stateful finding's is
        # (one writer); the reach keeps the profiles' verdict beside it.
        from kvspec.findings.stateful import with_engine_impact, with_engine_reproduction

        shown = with_engine_reproduction(finding, reproduction)
        inputs, configuration = shown.inputs, {"configuration": shown.compared["configuration"]}
        reach = with_engine_reach(reach, inputs["engine_reproduction"])
        if reproduction.status == "reproduced":
            # What a user loses, measured on the engine program that reproduced it.
            say("measuring its impact on the engine program that reproduced it")
            impact = with_engine_impact(proc, shown).impact or impact
    explanation = finding.explanation
    if explanation is not None:
        explanation = attrs.evolve(explanation, knobs=knobs)
    # What the release can do that the differential does not drive, and the
    # hash scheme the finding holds under, with the finding.
    scheme = ((finding.inputs or {}).get("config") or {}).get("hash_scheme", "legacy")
    compared = {**finding.compared, "not_covered": list(finding.subject_capabilities().not_covered()),
                "hash_scheme": scheme, **configuration}
    compared["configuration"] = configuration_line(compared.get("configuration"), reach)
    return attrs.evolve(finding, reach=reach, explanation=explanation, compared=compared, inputs=inputs,
                        impact=impact)


def configuration_line(line: str | None, reach: Reach) -> str | None:
    """A hand-built finding's configuration line, true to its reach: "hardening
    until reproduced" only while nothing reaches it; one a deployment profile
    reaches says so instead (what the engine search showed stays said)."""
    from kvspec.model.engine import HAND_BUILT, HAND_BUILT_PROFILE_REACHED

    if line and not reach.hardening and line.startswith(HAND_BUILT):
        return HAND_BUILT_PROFILE_REACHED + line[len(HAND_BUILT):]
    return line


def _engine_reproduction(finding: Finding, proc, say: Say):
    """A registration or lookup finding looked for through vLLM's engine
    (``diff_tests.reproduce.reproduce_case_through_engine``: the same path
    as a stateful finding's), on the live subject; None when there is none
    (another category, a stored finding, a stateful one)."""
    inputs = finding.inputs or {}
    observations = finding.observations or {}
    # A crash is looked for too, by its exception's type, unless the worker
    # itself died on the case (every engine driving it would die again).
    died = observations.get("error_kind") == ErrorKind.CRASHED.value or bool(observations.get("crashed"))
    crash = finding.category is Category.SUBJECT_CRASH and not died
    if (proc is None or finding.category not in _REGISTRATION + _LOOKUP and not crash or "program" in inputs
            or "prompt_len" not in inputs):
        return None
    from kvspec.diff_tests.reproduce import reproduce_case_through_engine
    from kvspec.diff_tests.stateful import _exception
    from kvspec.model.case import Case
    from kvspec.oracles.registration import Discrepancy

    rows = finding.groups
    found = Discrepancy(finding.category, finding.call, finding.n,
                        tuple(r.expected_tokens for r in rows), tuple(r.observed_tokens for r in rows),
                        tuple(r.expected_blocks for r in rows), tuple(r.observed_blocks for r in rows),
                        detail=finding.detail)
    held = ("the lookup rules on every lookup" if finding.category in _LOOKUP
            else "its exception" if crash else "the registration bound on every cache_blocks call")
    say(f"looking for it through vLLM's engine (the real Scheduler, {held})")
    return reproduce_case_through_engine(proc, Case.from_dict(inputs), found,
                                         exception=_exception(observations) if crash else None)


def with_engine_reach(reach: Reach, record: dict[str, Any]) -> Reach:
    """A registration or lookup finding's reach with what the engine showed:
    reproduced through the real Scheduler, it is reachable with those
    settings (not hardening, whatever the profiles said); not reproduced, the
    profiles' verdict stands (a profile is a configuration vLLM's own code
    derives) and the search is said with it; hardening where no profile
    reaches it either, or none was assessed (a lookup finding's profiles are
    not driven): then it is hand-built only."""
    if record.get("status") == "reproduced":
        return attrs.evolve(reach, summary=f"{record['summary']}. Deployment profiles: {reach.summary}",
                            hardening=False)
    if record.get("status") == "not reproduced" and not reach.profiles and not reach.hardening:
        # Neither the engine nor a profile reaches it (none was assessed).
        return attrs.evolve(reach, summary=f"{record['summary']}; deployment profiles: {reach.summary}",
                            hardening=True)
    if record.get("status") == "not reproduced":
        engine = record["summary"].replace("hand-built only: not reproduced", "not reproduced", 1)
        lead = "hand-built only: " if reach.hardening else ""
        return attrs.evolve(reach, summary=f"{lead}{reach.summary}; through vLLM's engine: {engine}")
    return attrs.evolve(reach, summary=f"{reach.summary}; through vLLM's engine: {record['summary']}")

