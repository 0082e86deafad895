"""The multi-module MTP question on real vLLM: does a hit keep stale draft KV?

``proofs.lookup_catalog`` settles it in the model: a reachable hit keeps a
position whose draft-layer KV was computed from a writer token the later
request does not share iff the group is EAGLE and ``L > drop tail``, and under
partial hash hits the tail is the hash block, not the scheduler block the
guard ``S >= L`` assumes.  This module looks for the same thing in real vLLM:
small writer/later-request pairs, each run through the subject with the
legacy hashes plus the EAGLE drop (every release from 0.28; 0.33 with a KV
connector or ``disable_lookahead_block_hashes``) and, where the subject has
them, with lookahead block hashes (0.33's default: no drop, each block's hash
covers the ``L`` tokens its last position's draft KV read).

A witness is judged from the subject's own answer only: the hit vLLM returned,
the tokens the two requests share and ``model.lookup.draft_dependency_end``.
"""

from __future__ import annotations

from typing import Any, Iterator

import attrs

from model.arith import INT
from model.domain import CoordinatorConfig, GroupKind, InvalidGeometry, KVCacheGroup
from model.lookup import draft_dependency_end, eagle_drop_tail
from model.spec import inputs_for_group

from .case import Case, LookupProbe, decode, prefill

__all__ = ["HASH_SCHEMES", "StaleReuse", "stale_reuse", "mtp_cases", "search_stale_reuse", "model_predicts_stale"]

# (name, tokens past each block its hash covers, as a function of L)
HASH_SCHEMES = {
    "legacy hashes + EAGLE drop": lambda L: 0,
    "lookahead block hashes": lambda L: L,
}

# (S, H, B, L): every one passes vLLM's guard S >= L.
GEOMETRIES = ((2, 1, 1, 2), (4, 1, 1, 2), (4, 1, 1, 4), (4, 2, 2, 3), (4, 1, 2, 3), (4, 2, 4, 3),
              (4, 4, 4, 4))


@attrs.frozen
class StaleReuse:
    """A later request whose hit keeps draft KV computed from a token it
    does not share."""

    case: Case
    scheme: str
    hit: int
    kept_position: int
    read_up_to: int  # the last writer token that position's draft KV read

    def describe(self) -> str:
        shared = self.case.probe.shared
        return (f"{self.case.describe()} [{self.scheme}]: vLLM returns a hit of {self.hit} "
                f"token{'s' if self.hit != 1 else ''}; "
                f"kept position {self.kept_position}'s draft KV read the writer's tokens up to "
                f"{self.read_up_to}, the later request shares only tokens 0..{shared - 1}")

    def as_dict(self) -> dict[str, Any]:
        return {"case": self.case.describe(), "scheme": self.scheme, "hit": self.hit,
                "kept_position": self.kept_position, "read_up_to": self.read_up_to,
                "shared": self.case.probe.shared, "writer_tokens": self.case.writer_tokens}


def stale_reuse(case: Case, scheme: str, reply: dict[str, Any]) -> StaleReuse | None:
    """The subject's answer for ``case``, judged: stale when the last kept
    position's draft KV read a writer token at or past the shared prefix
    (and that token existed: the writer had computed or sampled it)."""
    probe = reply.get("probe")
    if not reply.get("ok") or probe is None or probe["hit"] < 1:
        return None
    kept = probe["hit"] - 1
    read_up_to = draft_dependency_end(INT, kept, case.config.num_prefill_lookahead)
    if case.probe.shared <= read_up_to < probe["writer_tokens"]:
        return StaleReuse(case, scheme, probe["hit"], kept, read_up_to)
    return None


def _layouts(S: int, B: int) -> Iterator[tuple[KVCacheGroup, ...]]:
    eagle = KVCacheGroup(GroupKind.FULL_ATTENTION, B, eagle=True)
    yield (KVCacheGroup(GroupKind.MAMBA_ALIGN, S), eagle)  # partial hash hits (H < S)
    if B < S:
        yield (eagle, KVCacheGroup(GroupKind.FULL_ATTENTION, S))  # hits on S, tail B


def mtp_cases() -> Iterator[Case]:
    """Writers of up to three scheduler blocks of prompt and up to two
    scheduler blocks of decodes (a Mamba group keeps states where a step
    ends on its block, and an EAGLE group's last L - 1 tokens are not final,
    so a hit past the prompt needs the writer to run on), each probed by a
    later request sharing every proper prefix of the writer's tokens."""
    for S, H, B, L in GEOMETRIES:
        for groups in _layouts(S, B):
            try:
                config = CoordinatorConfig(groups=groups, scheduler_block_size=S, hash_block_size=H,
                                           num_prefill_lookahead=L)
            except InvalidGeometry:
                continue
            for prompt in range(1, 3 * S + 1):
                for decodes in (0, 2, 2 * S):
                    steps = (prefill(prompt),) + (decode(),) * decodes
                    writer = Case(config, prompt, steps)
                    for shared in range(1, writer.writer_tokens):
                        yield Case(config, prompt, steps, LookupProbe(shared, 1))


def model_predicts_stale(config: CoordinatorConfig, whole_blocks: bool = False) -> bool:
    """``proofs``' reachability condition (mtp.stale_reuse_reachability) at
    this configuration: some EAGLE group has L > its drop tail.  With
    ``whole_blocks`` the group is taken to match whole blocks only (its tail
    is its block B): what a full-attention group with B > H does when no
    Mamba state sits inside its block, the only case seen on real vLLM."""
    for index, group in enumerate(config.groups):
        p = inputs_for_group(config, index, 0)
        fine_grained = group.kind.fine_grained_lookup and not whole_blocks
        if p.eagle and p.L > eagle_drop_tail(INT, p, fine_grained):
            return True
    return False


def search_stale_reuse(subject, schemes: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Every case under every scheme the subject supports; per scheme the
    smallest witness (fewest writer tokens, then shortest hit), or none, and
    how many cases ran."""
    cases = list(mtp_cases())
    out: dict[str, dict[str, Any]] = {}
    for scheme in schemes:
        messages = []
        for case in cases:
            message = case.to_worker()
            message["num_hash_lookahead_tokens"] = HASH_SCHEMES[scheme](case.config.num_prefill_lookahead)
            messages.append(message)
        witnesses, errors = [], []
        per_config: dict[str, dict[str, Any]] = {}
        for case, reply in zip(cases, subject.run_many(messages)):
            row = per_config.setdefault(case.config.describe(), {
                "config": case.config.describe(), "partial_hash_hits": case.config.partial_hash_hits,
                "model_predicts_stale": model_predicts_stale(case.config),
                "model_predicts_stale_whole_blocks": model_predicts_stale(case.config, whole_blocks=True),
                "vllm_stale": 0, "cases": 0})
            row["cases"] += 1
            if not reply.get("ok"):
                errors.append(reply.get("error", "unknown error"))
                continue
            found = stale_reuse(case, scheme, reply)
            if found is not None:
                witnesses.append(found)
                row["vllm_stale"] += 1
        witnesses.sort(key=lambda w: (w.case.writer_tokens, w.hit, w.case.config.scheduler_block_size))
        out[scheme] = {"cases": len(cases), "errors": errors[:3], "error_count": len(errors),
                       "witnesses": len(witnesses), "per_config": list(per_config.values()),
                       "smallest": witnesses[0] if witnesses else None}
    return out
