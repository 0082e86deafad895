"""The multi-module MTP question: does a hit keep stale draft KV?

``proofs.lookup_catalog`` settles it in the model: a reachable hit keeps a
position whose draft-layer KV was computed from a writer token the later
request does not share iff the group is EAGLE and ``L > drop tail``, and under
partial hash hits the tail is the hash block, not the scheduler block the
guard ``S >= L`` assumes.  ``subjects/drivers/mtp.py`` looks for the same
thing in real vLLM: small writer/later-request pairs, each run through the
subject with the legacy hashes plus the EAGLE drop (every release from 0.28; 0.33 with a KV
connector or ``disable_lookahead_block_hashes``) and, where the subject has
them, with lookahead block hashes (0.33's default: no drop, each block's hash
covers the ``L`` tokens its last position's draft KV read).

A witness is judged from the subject's own answer only: the hit vLLM returned,
the tokens the two requests share and ``model.lookup.draft_dependency_end``.
The writer is prefilled as vLLM's scheduler chunks it (``subjects/drivers/mtp.py``):
that is where Mamba states exist, and so where a hit can land.

Impact: draft-layer KV only feeds the drafter's proposals, which the target
verifies; under the default rejection sampling the outputs are unchanged and
stale draft KV lowers the acceptance rate for the rest of the later request
(vLLM's lossy "fly" sampling is the exception).
"""

from __future__ import annotations

from typing import Any

import attrs

from kvspec.model.arith import INT
from kvspec.model.case import Case
from kvspec.model.domain import CoordinatorConfig
from kvspec.model.lookup import draft_dependency_end, eagle_drop_tail
from kvspec.model.replies import Reply
from kvspec.model.spec import inputs_for_group

__all__ = ["HASH_SCHEMES", "StaleReuse", "stale_reuse", "model_predicts_stale", "fix_rejects",
           "profiles_reaching"]

# (name, tokens past each block its hash covers, as a function of L)
HASH_SCHEMES = {
    "legacy hashes + EAGLE drop": lambda L: 0,
    "lookahead block hashes": lambda L: L,
}


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


def stale_reuse(case: Case, scheme: str, reply: Reply) -> StaleReuse | None:
    """The subject's answer for ``case``, judged: stale when the last kept
    position's draft KV read a writer token at or past the shared prefix
    (and that token existed: the writer had computed or sampled it)."""
    probe = reply.get("probe")
    if not reply.ok or probe is None or probe["hit"] < 1:
        return None
    kept = probe["hit"] - 1
    read_up_to = draft_dependency_end(INT, kept, case.config.num_prefill_lookahead)
    if case.probe.shared <= read_up_to < probe["writer_tokens"]:
        return StaleReuse(case, scheme, probe["hit"], kept, read_up_to)
    return None


def model_predicts_stale(config: CoordinatorConfig, whole_blocks: bool = False) -> bool:
    """``proofs``' reachability condition (mtp.stale_reuse_reachability) at
    this configuration: some EAGLE group has L > its drop tail.

    ``whole_blocks`` takes every group to match whole blocks only (its tail
    is its block B).  That is what a writer prefilled in one chunk shows on
    0.31+ (no Mamba state at the prompt checkpoint the drop lands on): an
    artifact of that harness, not vLLM's behaviour, kept to say so; with the
    scheduler's own chunking (``subjects/drivers/mtp.py``) vLLM matches the
    unrestricted condition."""
    for index, group in enumerate(config.groups):
        p = inputs_for_group(config, index, 0)
        fine_grained = group.kind.fine_grained_lookup and not whole_blocks
        if p.eagle and p.L > eagle_drop_tail(INT, p, fine_grained):
            return True
    return False


def fix_rejects(config: CoordinatorConfig) -> bool:
    """The suggested guard: with legacy hashes and an EAGLE group, refuse a
    prefill lookahead longer than the tail the lookup drops (the hash block
    under partial hits, else each EAGLE group's block) -- instead of vLLM's
    ``scheduler_block_size >= num_prefill_lookahead``.  (Lookahead block
    hashes, 0.33's default, need no guard.)"""
    return model_predicts_stale(config)


def profiles_reaching(derivations) -> list[dict[str, Any]]:
    """Deployment derivations (``model.deployments.Derivation``) under which
    a hit can keep stale draft KV: the model's condition on each one's
    coordinator configuration (legacy hashes: lookahead hashes prevent it)."""
    out = []
    for d in derivations:
        config = d.coordinator_config()
        if config is None or not d.eagle_branch_live:
            continue
        if model_predicts_stale(config):
            out.append({"profile": d.profile, "release": d.release, "hash_scheme": d.hash_scheme,
                        "configuration": config.describe(), "called": list(d.called)})
    return out
