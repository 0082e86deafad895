"""``kvspec hitrate``'s use case: one subject's replay of a workload, and each row's reference."""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["HitRateRow", "hitrate_row", "compare_with_reference"]


@attrs.frozen
class HitRateRow:
    """One subject's replay of a workload (``subjects.drivers.hitrate``'s
    result), the spec's ideal replay and, for a mutant, the replay of the
    model of its rule.  ``as_dict`` is a subject of ``kvspec.hitrate``'s
    result, before ``compare_with_reference`` gives it its reference."""

    label: str
    vllm_version: str | None
    subject: Any  # subjects.subject.Subject
    config: Any  # model.config.Config (the layout at one scheduler block)
    observed: Any  # the subject's replay
    ideal: Any  # the spec's ideal replay
    model: Any = None  # the mutant's rule's model replay (None: the spec's, the ideal)
    variant_name: str | None = None  # the variant a mutant models (None: not a mutant)
    ideal_exact: bool = False  # the ideal is exact (full-attention layouts), a verdict, not only shown

    @property
    def mutant(self) -> bool:
        return self.variant_name is not None

    def as_dict(self) -> dict[str, Any]:
        observed, ideal, model = self.observed, self.ideal, self.model or self.ideal
        replayed = observed.as_dict()
        return {
            "label": self.label, "vllm_version": self.vllm_version, "subject": self.subject.as_dict(),
            "mutant": self.mutant,
            "scheduler_block_size": self.config.scheduler_block_size,
            "ideal_exact": self.ideal_exact,
            **{k: v for k, v in replayed.items() if k != "backend"},
            "per_turn": [round(r, 6) for r in observed.per_turn()],
            "ideal_hit_rate": round(ideal.hit_rate, 6), "ideal_hits": [o.hit for o in ideal.outcomes],
            "ideal_per_turn": [round(r, 6) for r in ideal.per_turn()],
            "model_rule": self.variant_name or "spec",
            "model_hit_rate": round(model.hit_rate, 6),
            "model_matches_per_request": replayed["hits"] == [o.hit for o in model.outcomes],
            "prompt_lengths": [o.prompt_tokens for o in observed.outcomes],
            "turns": [o.turn for o in observed.outcomes],
        }


def hitrate_row(subject, label: str, config, workload, variant_name: str | None = None) -> HitRateRow:
    """One subject's replay, its ideal and (for a mutant) its rule's model.

    The ideal is exact only where the model's lookup is (full-attention
    layouts); with a Mamba group it leaves out how vLLM's scheduler places
    Mamba state checkpoints, so there it is shown, never used as a verdict."""
    from kvspec.model.case import Case, prefill
    from kvspec.model.variants import variant
    from kvspec.oracles.ideal_cache import SpecCache
    from kvspec.oracles.lookup import exact_lookup_applies
    from kvspec.subjects.drivers.hitrate import SubjectCache, replay
    from kvspec.subjects.process import SubjectProcess

    with SubjectProcess(subject) as proc:
        cache = SubjectCache(proc, config, workload)
        observed = replay(workload, cache)
        version = proc.identity.get("vllm_version")
    ideal = replay(workload, SpecCache(config, cache.regime))
    model = None
    if variant_name is not None:
        model = replay(workload, SpecCache(config, cache.regime, variant(variant_name).rule,
                                           f"model of {variant_name}"))
    return HitRateRow(label, version, subject, config, observed, ideal, model, variant_name,
                      exact_lookup_applies(Case(config, 1, (prefill(1),))))


def compare_with_reference(rows: list[dict[str, Any]]) -> None:
    """Give every row (``HitRateRow.as_dict``, as the result file holds it)
    its reference and what it loses against it: the spec's
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

