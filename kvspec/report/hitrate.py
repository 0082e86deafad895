"""The hit-rate replay's report: a table per subject against its reference,
and the verdict.

The renderers (and ``hitrate_plot``'s) take the replay typed
(``HitrateFile``, a ``SubjectHits`` per subject and scheduler block, its
``Reference``), parsed once from the result file's JSON (``kvspec.hitrate/1``,
what ``kvspec hitrate --json`` writes) or from the rows the command holds in
that form."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from kvspec.model.outcome import Outcome

__all__ = ["FirstDifference", "HitrateFile", "Reference", "ReplayFailed", "SubjectHits", "render_text", "verdict"]


@attrs.frozen
class FirstDifference:
    """The first request whose hit differs from its reference's."""

    request: int
    turn: int
    prompt_tokens: int
    observed_hit: int
    reference_hit: int

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> "FirstDifference":
        return cls(data["request"], data["turn"], data["prompt_tokens"], data["observed_hit"], data["reference_hit"])


@attrs.frozen
class Reference:
    """What a subject is held to (the spec's ideal where exact, else the
    release a mutant came from) and what it loses against it."""

    label: str
    hit_rate: float
    per_turn: tuple[float, ...]
    points: float  # the subject's hit rate minus the reference's, in percentage points
    requests_differing: int
    hit_tokens_lost: int
    first_difference: FirstDifference | None

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> "Reference":
        first = data["first_difference"]
        return cls(data["label"], data["hit_rate"], tuple(data["per_turn"]), data["points"],
                   data["requests_differing"], data["hit_tokens_lost"],
                   None if first is None else FirstDifference.parse(first))


@attrs.frozen
class SubjectHits:
    """One subject's replay at one scheduler block size."""

    label: str
    scheduler_block_size: int
    hit_rate: float
    requests: int
    per_turn: tuple[float, ...]
    ideal_exact: bool  # the spec's ideal is exact for this layout (no Mamba group)
    ideal_per_turn: tuple[float, ...]
    model_rule: str
    model_hit_rate: float
    model_matches_per_request: bool
    reference: Reference | None  # None: nothing exact to hold it to

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> "SubjectHits":
        reference = data.get("reference")
        return cls(data["label"], data["scheduler_block_size"], data["hit_rate"], data["requests"],
                   tuple(data["per_turn"]), data["ideal_exact"], tuple(data.get("ideal_per_turn") or ()),
                   data["model_rule"], data["model_hit_rate"], data["model_matches_per_request"],
                   None if not reference else Reference.parse(reference))


@attrs.frozen
class ReplayFailed:
    """A subject that could not be replayed, and why."""

    label: str
    error: str


@attrs.frozen
class HitrateFile:
    """A ``kvspec hitrate`` result."""

    verdict: str
    layout: str
    workload: str  # the workload in words
    subjects: tuple[SubjectHits, ...]
    errors: tuple[ReplayFailed, ...] = ()

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> "HitrateFile":
        return cls(data["verdict"], data["layout"], data["workload"]["text"],
                   tuple(SubjectHits.parse(r) for r in data["subjects"]),
                   tuple(ReplayFailed(e["label"], e["error"]) for e in data["errors"]))


def render_text(doc: HitrateFile) -> str:
    out = ["kvspec hitrate: prefix-cache hit rate of real vLLM on a synthetic workload",
           f"workload: {doc.workload}", f"layout:   {doc.layout}", "",
           f"{'subject':<34} {'S':>4} {'hit rate':>8}  {'reference':<28} {'ref rate':>8} {'diff':>8}  model of its rule",
           "-" * 118]
    for r in doc.subjects:
        ref = r.reference
        model = (f"{r.model_rule}: {100 * r.model_hit_rate:.2f}% "
                 f"({'equal per request' if r.model_matches_per_request else 'differs'})"
                 if r.ideal_exact else "not exact with a Mamba group")
        refs = (f"{ref.label:<28} {100 * ref.hit_rate:7.2f}% {ref.points:+7.2f}p" if ref
                else f"{'(none exact: Mamba layout)':<28} {'':>8} {'':>8}")
        out.append(f"{r.label:<34} {r.scheduler_block_size:>4} {100 * r.hit_rate:7.2f}%  {refs}  {model}")
    for r in doc.subjects:
        ref = r.reference
        if not ref or not ref.requests_differing:
            continue
        f = ref.first_difference
        turns = ", ".join(f"turn {t}: {100 * a:.1f}% vs {100 * b:.1f}%"
                          for t, (a, b) in enumerate(zip(r.per_turn, ref.per_turn)))
        out += ["", f"{r.label} (S={r.scheduler_block_size}): {ref.requests_differing} of {r.requests} "
                    f"requests differ from {ref.label}, {ref.hit_tokens_lost} hit tokens lost "
                    f"({ref.hit_tokens_lost / ref.requests_differing:.1f} per affected request)",
                f"  first: request {f.request} (turn {f.turn}, {f.prompt_tokens} prompt tokens) "
                f"hit {f.observed_hit}, reference {f.reference_hit}",
                f"  per turn: {turns}"]
    for e in doc.errors:
        out.append(f"ERROR {e.label}: {e.error}")
    out += ["", f"VERDICT: {doc.verdict}"]
    return "\n".join(out)


def verdict(rows: Sequence[SubjectHits], errors: Sequence[ReplayFailed]) -> tuple[str, Outcome]:
    off = [f"{r.label} (S={r.scheduler_block_size}, {r.reference.points:+.2f} pts)"
           for r in rows if r.reference and r.reference.requests_differing]
    if off:
        return f"HIT-RATE DIFFERENCE against the reference on {', '.join(off)}", Outcome.FINDING
    if errors:
        return "ERROR: some subjects could not be replayed (see above)", Outcome.USAGE
    return "every subject's hits equal its reference's, request by request", Outcome.OK
