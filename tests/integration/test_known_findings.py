"""Each known finding kept out of the default draw (diff_tests/known.py) still
reproduces on the releases it was found on -- so a fix shows, and the
exclusion can go -- and its configuration, under legacy hashes (what the
draw uses instead), does not crash."""

from __future__ import annotations

import attrs
import pytest

from kvspec.diff_tests.known import KNOWN
from kvspec.model.case import Case, prefill
from kvspec.model.domain import CoordinatorConfig, GroupKind, HashScheme, KVCacheGroup
from kvspec.oracles.lookup import check_case
from kvspec.subjects.protocol import case_message

CRASH = CoordinatorConfig(
    groups=(KVCacheGroup(GroupKind.SLIDING_WINDOW, 2, eagle=True, sliding_window=1),
            KVCacheGroup(GroupKind.MAMBA_ALIGN, 2)),
    scheduler_block_size=4, hash_block_size=1, num_prefill_lookahead=2, hash_scheme="lookahead")


@pytest.mark.parametrize("version", KNOWN[0].found_on)
def test_the_sliding_window_lookahead_crash_still_reproduces(kvspec_release, version):
    proc = kvspec_release(version)
    assert KNOWN[0].applies(CRASH, proc.capabilities)
    case = Case(CRASH, 9, (prefill(9),))
    reply = proc.run(case_message(case))
    assert not reply["ok"] and "IndexError" in reply["error"]
    assert "find_longest_cache_hit" in reply["traceback"]
    legacy = attrs.evolve(case, config=attrs.evolve(CRASH, hash_scheme=HashScheme.LEGACY))
    assert check_case(legacy, proc.capabilities, proc.run(case_message(legacy))) == []
