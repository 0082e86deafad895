"""Each known vLLM bug kept out of the default draw (model/known.py) still
reproduces on the releases it was found on -- so a fix shows, and the
exclusion can go -- and its configuration, under legacy hashes (what the
draw uses instead), does not crash."""

from __future__ import annotations

import attrs
import pytest

from kvspec.model.known import excluded_from_draw
from kvspec.model.case import Case, prefill
from kvspec.model.domain import CoordinatorConfig, GroupKind, HashScheme, KVCacheGroup
from kvspec.oracles.lookup import check_case
from kvspec.subjects.protocol import case_message

CRASH = CoordinatorConfig(
    groups=(KVCacheGroup(GroupKind.SLIDING_WINDOW, 2, eagle=True, sliding_window=1),
            KVCacheGroup(GroupKind.MAMBA_ALIGN, 2)),
    scheduler_block_size=4, hash_block_size=1, num_prefill_lookahead=2, hash_scheme="lookahead")


(BUG,) = excluded_from_draw()


@pytest.mark.parametrize("version", ["0.33.0", "0.34.0"])
def test_the_sliding_window_lookahead_crash_still_reproduces(kvspec_release, version):
    assert BUG.carried_by(version)
    proc = kvspec_release(version)
    assert BUG.draw_exclusion(CRASH, proc.capabilities)
    case = Case(CRASH, 9, (prefill(9),))
    reply = proc.run(case_message(case))
    assert not reply["ok"] and BUG.signature in reply["error"]
    assert "find_longest_cache_hit" in reply["traceback"]
    legacy = attrs.evolve(case, config=attrs.evolve(CRASH, hash_scheme=HashScheme.LEGACY))
    assert check_case(legacy, proc.capabilities, proc.run(case_message(legacy))) == []
