"""The exhaustive scope itself: valid, complete in the dimensions it declares, no repeats."""

from __future__ import annotations

import itertools

from kvspec.diff_tests.exhaustive import Scope, enumerate_cases
from kvspec.model.domain import GroupKind


def test_scope_is_valid_distinct_and_covers_every_declared_dimension():
    cases = list(enumerate_cases(Scope(max_groups=2)))
    configs = [c.config for c in cases]
    assert len(set(configs)) == len(configs)
    seen = {(c.hash_block_size, c.scheduler_block_size // c.hash_block_size) for c in configs}
    assert seen == set(itertools.product((1, 2, 4), (1, 2, 3, 4)))
    assert {c.num_prefill_lookahead for c in configs} == {0, 1, 2, 3}
    # Every EAGLE pattern of a pair of attention groups appears.
    patterns = {tuple(g.eagle for g in c.groups) for c in configs
                if all(g.kind is not GroupKind.MAMBA_ALIGN for g in c.groups)}
    assert patterns == set(itertools.product((False, True), repeat=2))
    for case in cases:  # cache_blocks at every n = 1 .. prompt
        assert [s.tokens for s in case.steps] == [1] * case.prompt_len
        assert case.prompt_len == min(4 * case.config.scheduler_block_size, 48)


def test_without_lookahead_support_no_lookahead_is_generated():
    configs = [c.config for c in enumerate_cases(Scope(max_groups=2), lookahead_supported=False)]
    assert {c.num_prefill_lookahead for c in configs} == {0}
