"""``kvspec mtp``'s use case: the multi-module MTP question, the model's side and each subject's."""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["MTP_THEOREMS", "MtpSubject", "mtp_model_side", "mtp_subject_side"]

MTP_THEOREMS = ("mtp.no_stale_draft_reuse.partial_hits", "mtp.no_stale_draft_reuse",
                "mtp.stale_reuse_reachability", "mtp.no_stale_draft_reuse.scheduler_block_tail",
                "mtp.lookahead_hashes_prevent_stale_reuse")


def mtp_model_side() -> tuple:
    """The ``mtp.*`` theorems' results (``proofs.verdict.TheoremResult``), in order."""
    from kvspec.proofs.catalog import theorem
    from kvspec.proofs.runner import run_theorem

    return tuple(run_theorem(theorem(name)) for name in MTP_THEOREMS)


@attrs.frozen
class MtpSubject:
    """One subject's side: per hash scheme, the stale-reuse search's summary
    (``subjects.drivers.mtp``'s, with the model's condition and the fix
    checked against it), and who reaches it; or why the subject cannot be
    asked (``unsupported``).  ``as_dict`` is a subject of ``kvspec.mtp``'s result."""

    subject: str
    vllm_version: str | None
    unsupported: str | None = None
    schemes: dict[str, dict[str, Any]] = attrs.Factory(dict)
    reach: dict[str, Any] = attrs.Factory(dict)
    not_covered: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        head = {"subject": self.subject, "vllm_version": self.vllm_version}
        if self.unsupported is not None:
            return {**head, "unsupported": self.unsupported}
        return {**head, "schemes": self.schemes, "reach": self.reach, "not_covered": list(self.not_covered)}


def mtp_subject_side(subject) -> MtpSubject:
    """The stale-reuse search on one subject (the writer chunked by its own
    scheduler), the model's condition checked per configuration, the
    suggested fix checked against what vLLM did, and which deployment
    profiles (as the release's own configuration code derives them) reach it."""
    from kvspec.oracles.mtp import HASH_SCHEMES, fix_rejects, profiles_reaching
    from kvspec.subjects.drivers.deployments import derivations
    from kvspec.subjects.drivers.mtp import search_stale_reuse
    from kvspec.subjects.process import SubjectProcess

    with SubjectProcess(subject) as proc:
        caps, version = proc.capabilities, proc.identity.get("vllm_version")
        if not caps.reprefillable_tokens:
            return MtpSubject(subject.label, version,
                              unsupported="no num_prefill_lookahead (multi-module MTP's prefill lookahead "
                                          "reaches the KV cache manager from 0.28)")
        schemes = tuple(name for name in HASH_SCHEMES
                        if HASH_SCHEMES[name](1) == 0 or caps.lookahead_block_hashes)
        found = search_stale_reuse(proc, schemes)
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
        # The condition a single-chunk writer showed (kept to show it does not match).
        result["whole_block_condition_matches"] = all(
            bool(r["vllm_stale"]) == r["model_predicts_stale_whole_blocks"] for r in rows)
        # The suggested guard against what vLLM did: it must refuse every
        # configuration with stale reuse and nothing vLLM handles safely.
        result["fix_refuses_every_stale"] = all(r["fix_rejects"] for r in rows if r["vllm_stale"])
        result["fix_refuses_safe"] = [r["config"] for r in rows if r["fix_rejects"] and not r["vllm_stale"]]
        results[scheme] = result
    try:
        derived = derivations(subject, version)
        reach = {"profiles": profiles_reaching(derived), "derivations": len(derived),
                 "fix_refuses_profiles": [d.profile for d in derived
                                          if d.coordinator_config() is not None and d.eagle_branch_live
                                          and fix_rejects(d.coordinator_config())],
                 "called": sum(bool(d.called) for d in derived)}
    except Exception as exc:  # the deployment derivation is extra evidence; say why it is missing
        reach = {"error": f"{type(exc).__name__}: {exc}"}
    return MtpSubject(subject.label, version, schemes=results, reach=reach, not_covered=tuple(caps.not_covered()))

