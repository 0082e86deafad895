"""The multi-module MTP search on real vLLM: small writer / later-request
pairs run through a subject under each hash scheme, each judged by
``oracles.mtp.stale_reuse`` from the subject's own answer.

The writer's prompt is prefilled the way vLLM's scheduler does it on a Mamba
"align" layout: its own ``Scheduler._mamba_block_aligned_split`` and
``_reserve_prefill_lookahead``, called in ``schedule()``'s order (worker op
``prefill_chunks``), with the Mamba group declaring the prefill-checkpoint
blocks the release's Mamba2 layer declares (0.32+).  A Mamba state -- where a
later request's hit can land -- exists only where a chunk ended or the
backend saved a checkpoint, so a single-chunk writer (what kvspec ran before)
never made the prompt checkpoint the EAGLE drop lands on, and hid stale
reuse the model predicts (/tmp/kvspec-research/mtp.md, reconciled here).
"""

from __future__ import annotations

from typing import Any, Iterator

from kvspec.model.case import Case, LookupProbe, Step, decode
from kvspec.model.domain import CoordinatorConfig, GroupKind, InvalidGeometry, KVCacheGroup
from kvspec.model.replies import PrefillChunking
from kvspec.model.requests import MambaLayerCheckpointFields, PrefillChunks, Stream, case_message
from kvspec.oracles.mtp import HASH_SCHEMES, fix_rejects, model_predicts_stale, stale_reuse


__all__ = ["GEOMETRIES", "mtp_configs", "search_stale_reuse"]

# (S, H, B, L): every one passes vLLM's guard S >= L.
GEOMETRIES = ((2, 1, 1, 2), (4, 1, 1, 2), (4, 1, 1, 4), (4, 2, 2, 3), (4, 1, 2, 3), (4, 2, 4, 3),
              (4, 4, 4, 4))


def _layouts(S: int, B: int) -> Iterator[tuple[KVCacheGroup, ...]]:
    eagle = KVCacheGroup(GroupKind.FULL_ATTENTION, B, eagle=True)
    yield (KVCacheGroup(GroupKind.MAMBA_ALIGN, S), eagle)  # partial hash hits (H < S)
    if B < S:
        yield (eagle, KVCacheGroup(GroupKind.FULL_ATTENTION, S))  # hits on S, tail B


def mtp_configs() -> Iterator[CoordinatorConfig]:
    for S, H, B, L in GEOMETRIES:
        for groups in _layouts(S, B):
            try:
                yield CoordinatorConfig(groups=groups, scheduler_block_size=S, hash_block_size=H,
                                        num_prefill_lookahead=L)
            except InvalidGeometry:
                continue


def _message(case: Case, lookahead: int, mamba_fields: dict[str, Any]) -> dict[str, Any]:
    message = case_message(case)
    message["num_hash_lookahead_tokens"] = lookahead
    for group in message["groups"]:
        if group["kind"] == "mamba_align" and mamba_fields:
            group["mamba_spec"] = dict(mamba_fields)
    return message


def _chunks(subject, config: CoordinatorConfig, lookahead: int, mamba_fields: dict[str, Any],
            prompts: list[int]) -> dict[int, PrefillChunking]:
    """vLLM's chunking of each prompt (one chunk for layouts without a Mamba group)."""
    if not any(g.kind is GroupKind.MAMBA_ALIGN for g in config.groups):
        return {p: PrefillChunking(p, (p,)) for p in prompts}
    from kvspec.model.case import prefill

    reply = subject.session(PrefillChunks(_message(Case(config, 1, (prefill(1),)), lookahead, mamba_fields),
                                         prompts))
    if not reply.ok:
        raise RuntimeError(f"prefill_chunks: {reply.error.message}")
    return {chunking.prompt: chunking for chunking in reply.payload}


def search_stale_reuse(subject, schemes: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Every writer (prompts of up to three scheduler blocks, 0, 2 or 2 S
    decodes) and every proper shared prefix of its tokens, under every scheme
    the subject supports; per scheme the smallest witness (fewest writer
    tokens, then shortest hit), the per-configuration counts beside the
    model's prediction, and the writers vLLM's own scheduler stalls."""
    fields_reply = subject.session(MambaLayerCheckpointFields())
    mamba_fields = fields_reply.get("fields", {}) if fields_reply.ok else {}
    out: dict[str, dict[str, Any]] = {}
    for scheme in schemes:
        cases, messages, stalled = [], [], 0
        rows: dict[str, dict[str, Any]] = {}
        for config in mtp_configs():
            S, L = config.scheduler_block_size, config.num_prefill_lookahead
            lookahead = HASH_SCHEMES[scheme](L)
            prompts = list(range(1, 3 * S + 1))
            chunking = _chunks(subject, config, lookahead, mamba_fields, prompts)
            # The model's answer per scheme: L > drop tail with legacy hashes, never with
            # lookahead hashes (mtp.lookahead_hashes_prevent_stale_reuse), which need no guard.
            legacy = lookahead == 0
            row = rows.setdefault(config.describe(), {
                "config": config.describe(), "partial_hash_hits": config.partial_hash_hits,
                "model_predicts_stale": legacy and model_predicts_stale(config),
                "model_predicts_stale_whole_blocks": legacy and model_predicts_stale(config, whole_blocks=True),
                "fix_rejects": legacy and fix_rejects(config), "vllm_stale": 0, "cases": 0,
                "stalled_writers": 0})
            for prompt in prompts:
                chunked = chunking[prompt]
                if chunked.stalled_at is not None:
                    stalled += 1
                    row["stalled_writers"] += 1
                    continue
                for decodes in (0, 2, 2 * S):
                    steps = tuple(Step("prefill", tokens=c) for c in chunked.chunks) + (decode(),) * decodes
                    writer = Case(config, prompt, steps)
                    for shared in range(1, writer.writer_tokens):
                        case = Case(config, prompt, steps, LookupProbe(shared, 1))
                        cases.append(case)
                        messages.append(_message(case, lookahead, mamba_fields))
        witnesses, errors = [], []
        for case, reply in zip(cases, subject.run_many(Stream(messages))):
            row = rows[case.config.describe()]
            row["cases"] += 1
            if not reply.ok:
                errors.append(reply.error.message)
                continue
            found = stale_reuse(case, scheme, reply)
            if found is not None:
                witnesses.append(found)
                row["vllm_stale"] += 1
        witnesses.sort(key=lambda w: (w.case.writer_tokens, w.hit, w.case.config.scheduler_block_size))
        out[scheme] = {"cases": len(cases), "errors": errors[:3], "error_count": len(errors),
                       "witnesses": len(witnesses), "per_config": list(rows.values()),
                       "stalled_writers": stalled, "mamba_checkpoint_fields": mamba_fields,
                       "smallest": witnesses[0] if witnesses else None}
    return out
