"""Named geometries with expected per-group results, run by every backend.

Each expectation is stated with its source: vLLM's own regression test for
#52419, the release table measured on real wheels, or a derivation by hand
written out beside it.  None is computed by kvspec's own code.
"""

from __future__ import annotations

import attrs

from .domain import CoordinatorConfig, GroupKind, KVCacheGroup

__all__ = ["CorpusCase", "CORPUS", "case"]

FA, SWA, MAMBA = GroupKind.FULL_ATTENTION, GroupKind.SLIDING_WINDOW, GroupKind.MAMBA_ALIGN


@attrs.frozen
class CorpusCase:
    name: str
    config: CoordinatorConfig
    n: int
    expected: dict[str, tuple[int, ...]]  # variant name -> per-group tokens_to_cache
    source: str
    total_tokens: int | None = None


def _seed_config(**changes) -> CoordinatorConfig:
    base = dict(
        groups=(KVCacheGroup(FA, 2, eagle=True), KVCacheGroup(MAMBA, 8)),
        scheduler_block_size=8,
        hash_block_size=2,
    )
    base.update(changes)
    return CoordinatorConfig(**base)


CORPUS: tuple[CorpusCase, ...] = (
    CorpusCase(
        "seed_52419", _seed_config(), 22,
        {"spec": (22, 22), "fix_52419": (22, 22), "regression_50062": (18, 22),
         "pre_partial_hits_023": (18, 16)},
        "vLLM's test_eagle_group_registers_unaligned_tail_under_partial_hash_hits: parent "
        "[18, 22], fix [22, 22]; 0.23-0.25 measured [18, 16]",
    ),
    CorpusCase(
        "seed_shape_smallest_miss", _seed_config(), 4,
        {"spec": (4, 4), "regression_50062": (2, 4)},
        "hand: P and EAGLE, 4 mod 8 = 4 > B = 2, so #50062 registers floor(4/8)*8 + 2 = 2",
    ),
    CorpusCase(
        "seed_shape_tail_within_block", _seed_config(), 18,
        {"spec": (18, 18), "regression_50062": (18, 18)},
        "hand: 18 mod 8 = 2 = B, not > B: the regression is not reachable",
    ),
    CorpusCase(
        "smallest_regression",
        CoordinatorConfig(groups=(KVCacheGroup(FA, 1, eagle=True), KVCacheGroup(MAMBA, 3)),
                          scheduler_block_size=3, hash_block_size=1),
        2,
        {"spec": (2, 2), "regression_50062": (1, 2)},
        "hand: the minimal counterexample (n=2, S=3, H=B=1): floor(2/3)*3 + 1 = 1",
    ),
    CorpusCase(
        "multi_module_mtp_lookahead", _seed_config(num_prefill_lookahead=3), 22,
        {"spec": (20, 22), "regression_50062": (18, 22), "finalized_ignored": (22, 22)},
        "hand: R = 3 - 1 = 2, finalized 20; EAGLE min(20, 20 + 2) = 20; "
        "#50062 min(20, 16 + 2) = 18; the Mamba group keeps n = 22",
    ),
    CorpusCase(
        "no_mamba_scheduler_aligned",
        CoordinatorConfig(
            groups=(KVCacheGroup(FA, 4, eagle=True), KVCacheGroup(SWA, 4, sliding_window=8)),
            scheduler_block_size=4, hash_block_size=4),
        22,
        {"spec": (22, 20), "regression_50062": (22, 20), "lookahead_dropped": (20, 20)},
        "hand: no Mamba group, so no partial hits: floor(22/4)*4 = 20; EAGLE min(22, 20 + 4) = 22",
    ),
    CorpusCase(
        "sliding_window_switches_partial_off",
        CoordinatorConfig(
            groups=(KVCacheGroup(FA, 2, eagle=True), KVCacheGroup(MAMBA, 8),
                    KVCacheGroup(SWA, 4, sliding_window=4)),
            scheduler_block_size=8, hash_block_size=2),
        22,
        {"spec": (18, 16, 16)},
        "hand (0.28+ rule): the SWA manager cannot look up inside its block and 4 != H, so "
        "partial hits are off: floor(22/8)*8 = 16; EAGLE min(22, 16 + 2) = 18",
    ),
    CorpusCase(
        "below_first_scheduler_block",
        CoordinatorConfig(groups=(KVCacheGroup(FA, 2, eagle=True), KVCacheGroup(FA, 8)),
                          scheduler_block_size=8, hash_block_size=2),
        5,
        {"spec": (0, 0), "eagle_guard_always": (2, 0)},
        "hand: no partial hits, floor(5/8)*8 = 0, so the EAGLE guard (cached > 0) fails",
    ),
    CorpusCase(
        "unflagged_twin_of_eagle_group",
        CoordinatorConfig(
            groups=(KVCacheGroup(FA, 2, eagle=True), KVCacheGroup(FA, 2), KVCacheGroup(MAMBA, 8)),
            scheduler_block_size=8, hash_block_size=2),
        22,
        {"spec": (22, 22, 22), "regression_50062": (18, 18, 22)},
        "hand: vLLM merges identical specs and gives the merged group the EAGLE bit, so the "
        "unflagged twin is EAGLE too; #50062 hits both",
    ),
)

_BY_NAME = {c.name: c for c in CORPUS}


def case(name: str) -> CorpusCase:
    return _BY_NAME[name]
