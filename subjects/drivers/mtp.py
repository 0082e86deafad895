"""The multi-module MTP search on real vLLM: small writer / later-request
pairs run through a subject under each hash scheme, each judged by
``oracles.mtp.stale_reuse`` from the subject's own answer."""

from __future__ import annotations

from typing import Any, Iterator

from kvspec.model.case import Case, LookupProbe, decode, prefill
from kvspec.model.domain import CoordinatorConfig, GroupKind, InvalidGeometry, KVCacheGroup
from kvspec.oracles.mtp import HASH_SCHEMES, model_predicts_stale, stale_reuse

from ..protocol import case_message

__all__ = ["GEOMETRIES", "mtp_cases", "search_stale_reuse"]

# (S, H, B, L): every one passes vLLM's guard S >= L.
GEOMETRIES = ((2, 1, 1, 2), (4, 1, 1, 2), (4, 1, 1, 4), (4, 2, 2, 3), (4, 1, 2, 3), (4, 2, 4, 3),
              (4, 4, 4, 4))


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


def search_stale_reuse(subject, schemes: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Every case under every scheme the subject supports; per scheme the
    smallest witness (fewest writer tokens, then shortest hit), or none, and
    how many cases ran."""
    cases = list(mtp_cases())
    out: dict[str, dict[str, Any]] = {}
    for scheme in schemes:
        messages = []
        for case in cases:
            message = case_message(case)
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
