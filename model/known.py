"""vLLM bugs kvspec has found in published releases, written once.

Each was found by a differential, shrunk, replayed on every release to find
the first without it, and judged a vLLM bug (not a gap in the model): the
README's tables, the shipped tests' expected failures and every differential
read this list.  None is kept out of the draw: a differential that meets one
(kvspec's commands and the shipped pytest tests alike) recognises it by its
mechanism, counts it, says it and searches on (``--include-known`` reports it
as a finding).  A subject's known bugs are those of the release its vLLM says
it is (a tree or a mutant: its ``_version.py``).
tests/integration/test_known_findings.py shows each still reproduces, so a
fix shows.
"""

from __future__ import annotations

import re

import attrs

from .about import release_key
from .domain import GroupKind
from .finding import Category
from .retention import BLOCK_ALIGNED_REPLAY
from .state import named_group_kinds

__all__ = ["KnownBug", "KNOWN_BUGS", "known_bugs", "recognise", "recognise_all", "count_met"]


@attrs.frozen
class KnownBug:
    category: Category = attrs.field(converter=Category)
    first: str  # the first release kvspec checked that carries it
    fixed_in: str | None  # the first release without it (None: the newest still has it)
    summary: str
    signature: str  # text every discrepancy of this bug shows in its summary
    needs: str = ""  # a non-default setting it needs, if any
    name: str = ""
    reach: str = ""  # who is affected, where no deployment profile is (said when it is met)
    # Other ways the same mechanism shows: (category, words) pairs, e.g. the
    # crash a broken estimate causes when the pool is tight.
    also_shows: tuple[tuple[Category, str], ...] = ()
    # A standalone reproduction through vLLM's public classes (tests/fixtures).
    reproduction: str = ""
    # The fix upstream has for it, if one is named (an upstream report says it).
    fix: str = ""
    # An upstream bug report's title (empty: the category's meaning).
    title: str = ""
    # The mechanism beyond the words: recognised only when every group the
    # broken rule names (model.state.Violation) is of these kinds (None: any).
    group_kinds: frozenset[GroupKind] | None = None
    # The per-release targeted search that dates it (``diff_tests/ranges.py``:
    # its record, with the command that made it and its level, through the
    # engine or at the manager level on a hand-built KVCacheConfig; empty:
    # none yet, the range stands on the reproduction and replays).
    range_search: str = ""

    def matches(self, summary: str, category: Category | None = None,
                group_kinds: tuple[GroupKind, ...] | None = None) -> bool:
        """Whether a discrepancy (its summary, ``category`` and the kinds of
        the groups its rule names, if given) is this bug showing.  Without
        the kinds (a summary recorded before findings carried them) they are
        read from the summary's words."""
        if self.group_kinds is not None:
            named = named_group_kinds(summary) if group_kinds is None else group_kinds
            if not set(named) <= self.group_kinds:
                return False
        shows = ((self.category, self.signature),) + self.also_shows
        return any(sig in summary and category in (None, cat) for cat, sig in shows)

    def shows_as(self, category: Category) -> bool:
        return category is self.category or any(cat is category for cat, _ in self.also_shows)

    def carried_by(self, version: str) -> bool:
        key = release_key(version)
        return key >= release_key(self.first) and (self.fixed_in is None or key < release_key(self.fixed_in))


KNOWN_BUGS: tuple[KnownBug, ...] = (
    # The targeted search through the engine per release shows it on
    # 0.26.0-0.28.0 on the toy Qwen3-Next with its EAGLE3 drafter (a second
    # full-attention group of half the target's block; before 0.28 run aligned
    # with prefix caching on), not on 0.29.0-0.34.0; 0.23.0-0.25.1 refuse that
    # toy, so 0.23.0 stands on the hand-built stateful program's replays and on
    # the same mechanism's manager-level search per release (the per-request
    # entry below: shown on 0.23.0-0.28.0, not on 0.29.0-0.34.0).
    KnownBug(Category.STATE_HIT_GROUPS, "0.23.0", "0.29.0",
             "the hybrid lookup trims only the first full-attention group to the reconciled hit; a second one "
             "(another block size, or a draft model's) returns blocks past the hit",
             "blocks for a hit of", name="second_full_attention_group_untrimmed",
             group_kinds=frozenset({GroupKind.FULL_ATTENTION}),
             range_search="docs/results/known-ranges/second_full_attention_group_untrimmed.json"),
    # Found through the engine on 0.24.0 once the scheduler's per-group lookup
    # was observed; dated by its mechanism with a standalone probe (both modes
    # of tests/fixtures/repro_full_attention_short_of_mamba_hit.py): the
    # fixed-point lookup's order on 0.23.0-0.25.1 (0.26.0 gives Mamba no EAGLE
    # margin), the connector's per-group lookup on 0.24.0-0.26.0 (0.27.0 reports
    # full attention's hit and reconciles a deeper group).
    KnownBug(Category.STATE_HIT_GROUPS, "0.23.0", "0.26.0",
             "on a Mamba 'align' hybrid with speculative decoding (MTP or EAGLE), the hybrid lookup answers the "
             "Mamba groups' hit while full attention, which drops its last matched block for the drafter, holds one "
             "block less: the request is scheduled with prompt tokens counted computed whose attention KV no block "
             "holds, and no step computes them (wrong outputs, no error)",
             "short of the hit of", name="hybrid_lookup_full_attention_short_of_mamba_hit",
             group_kinds=frozenset({GroupKind.FULL_ATTENTION}),
             needs="a Mamba 'align' hybrid with prefix caching and a drafter (on the toy Qwen3-Next, its MTP module), "
                   "a prompt whose chunks end on block boundaries",
             reproduction="tests/fixtures/repro_full_attention_short_of_mamba_hit.py",
             title="Hybrid prefix-cache hit counts prompt tokens whose full-attention KV is not cached "
                   "(Mamba align + MTP)",
             range_search="docs/results/known-ranges/hybrid_lookup_full_attention_short_of_mamba_hit.json"),
    KnownBug(Category.STATE_HIT_GROUPS, "0.24.0", "0.27.0",
             "with a KV connector on a Mamba hybrid, the scheduler looks the request up group by group "
             "(find_longest_cache_hit_per_group) and takes the deepest group's hit as the local hit; where full "
             "attention's is shorter (its drafter's dropped block, or an evicted tail), prompt tokens are counted "
             "computed whose attention KV no block holds; under partial hash hits the copy-on-write of the partial "
             "block asserts and schedule() raises (0.27.0 reports full attention's hit and reconciles a deeper "
             "group)",
             "short of the connector lookup's hit", name="connector_lookup_takes_deepest_group_hit",
             group_kinds=frozenset({GroupKind.FULL_ATTENTION}),
             needs="a KV connector and a Mamba 'align' hybrid with prefix caching",
             # Under partial hash hits (0.26.0) a full-attention group whose own
             # hit is shorter records a partial hit past its blocks, and the
             # copy-on-write asserts (tests/fixtures/repro_per_group_lookup_cow.py).
             also_shows=((Category.SUBJECT_CRASH, "raised in _apply_cow"),),
             reproduction="tests/fixtures/repro_full_attention_short_of_mamba_hit.py",
             title="With a KV connector, hybrid models take the deepest group's prefix hit: full-attention KV "
                   "missing for counted tokens",
             range_search="docs/results/known-ranges/connector_lookup_takes_deepest_group_hit.json"),
    # The same vLLM bug (#52828's shape), seen by the hit-length differential on one request.
    # The targeted search per release at the manager level (hand-built
    # KVCacheConfig: three full-attention groups, one EAGLE) shows it on
    # 0.23.0-0.28.0 (its case as it is) and not on 0.29.0-0.34.0 (the case,
    # its prompt lengths around it and 400 requests with lookups on its layout).
    KnownBug(Category.LOOKUP_CONTRACT, "0.23.0", "0.29.0",
             "the hybrid lookup trims only the first full-attention group to the reconciled hit; a second one "
             "(another block size, or a draft model's) returns blocks past the hit",
             "blocks for a hit of", name="second_full_attention_group_untrimmed_per_request",
             range_search="docs/results/known-ranges/second_full_attention_group_untrimmed_per_request.json"),
    # The targeted search per release at the manager level (kvspec's hand-built
    # KVCacheConfig, no engine toy builds the layout) shows it on 0.23.0 (its
    # stateful program as it is) and not on 0.24.0-0.34.0 (the program, 20
    # around it and 40 searched on those geometries, nothing else broken).
    # A weak "not shown": on 0.23.0 only the program itself shows it (none of
    # the 19 around it, nor the 40 searched), so the later releases' answer
    # rests mostly on that one program; #33775's two-phase allocation dates it.
    KnownBug(Category.STATE_ONE_GROUP, "0.23.0", "0.24.0",
             "with KV-connector tokens, the coordinator gives each group its cache hit and its blocks for the "
             "external tokens in one pass, so an earlier group's new blocks can evict a later group's hit block "
             "before that group takes it: the block ends in two groups' tables (0.24.0's two-phase allocation, "
             "vLLM issue #33775, takes every group's hit first)",
             "one_group:", name="external_blocks_evict_a_later_groups_hit",
             range_search="docs/results/known-ranges/external_blocks_evict_a_later_groups_hit.json"),
    # The targeted search per release at the manager level (hand-built
    # KVCacheConfig) shows it on 0.23.0-0.27.1 (its stateful program as it is)
    # and not on 0.28.0-0.34.0.
    KnownBug(Category.STATE_ZEROING_MISSED, "0.23.0", "0.28.0",
             "on a layout with Mamba layers (where vLLM zeroes new attention blocks), blocks newly allocated to a "
             "sliding-window group are never handed out by take_new_block_ids: the managers recorded only an "
             "exact list of full-attention spec types (vLLM #51749 records every AttentionSpec)",
             "zeroing_missed:", name="sliding_window_blocks_not_zeroed",
             group_kinds=frozenset({GroupKind.SLIDING_WINDOW}),
             range_search="docs/results/known-ranges/sliding_window_blocks_not_zeroed.json"),
    # The targeted search per release at the manager level (hand-built
    # KVCacheConfig) shows it on 0.26.0-0.27.1 (its case as it is) and not on
    # 0.23.0-0.25.1 (no partial hash hits there) or 0.28.0-0.34.0.
    KnownBug(Category.SUBJECT_CRASH, "0.26.0", "0.28.0",
             "find_longest_cache_hit asserts 'SlidingWindowManager does not support fine-grained (partial) cache "
             "hits' with partial hash hits and a sliding-window group whose block differs from the hash block",
             "does not support fine-grained (partial) cache hits",
             name="sliding_window_partial_hit_assertion",
             range_search="docs/results/known-ranges/sliding_window_partial_hit_assertion.json"),
    # Found through the engine on 0.27.1 once hybrids ran with --mamba-cache-mode
    # align there; dated by its mechanism: the scheduler's truncation of a local
    # hit a connector supersedes, and its every-group assertion, exist in 0.27.0
    # and 0.27.1 only (0.26.0 has neither; 0.28.0 clamps a Mamba group).
    KnownBug(Category.SUBJECT_CRASH, "0.27.0", "0.28.0",
             "with a KV connector whose hit exceeds the local hit's sub-block tail (partial hash hits, "
             "--prefix-match-unit below the block), the scheduler truncates the local hit to the block-aligned "
             "point with truncate_computed_blocks, which asserts every group holds that many blocks; a Mamba "
             "'align' group whose states end before it fails the assertion and schedule() raises AssertionError "
             "(0.28.0 lets a Mamba group end before the point: the connector supplies the final state)",
             "raised in truncate_computed_blocks", name="truncate_asserts_mamba_group_covers_connector_hit",
             needs="a KV connector, a Mamba 'align' hybrid with prefix caching and --prefix-match-unit below its "
                   "block (on the toy Qwen3-Next, with its MTP module)",
             reproduction="tests/fixtures/repro_truncate_mamba_behind_connector_hit.py",
             range_search="docs/results/known-ranges/truncate_asserts_mamba_group_covers_connector_hit.json"),
    # The targeted search per release at the manager level (hand-built
    # KVCacheConfig: full attention and two Mamba 'align' groups, a connector's
    # tokens) shows it on 0.26.0-0.27.1 (its stateful program as it is) and not
    # on 0.23.0-0.25.1 or 0.28.0-0.34.0.
    KnownBug(Category.STATE_TABLE_APPEND_ONLY, "0.26.0", "0.28.0",
             "after an admission with KV-connector tokens the Mamba manager copies-on-write into the running "
             "request's table, which must stay append-only", "append_only:",
             name="mamba_copy_into_running_table",
             range_search="docs/results/known-ranges/mamba_copy_into_running_table.json"),
    # One mechanism, dated by it: the standalone reproduction shows the estimate
    # below the allocation on every supported release (0.23.0-0.34.0), and the
    # crash with the pool tight.  Stateful and engine runs met it as three
    # crashes of different programs (0.27.1-0.31.0, 0.30.0-, 0.31.0-) whose
    # ranges came from replaying one program each: pool sizes, not code.  The
    # targeted search through the engine per release shows it on every release
    # from 0.23.0 to 0.34.0 (before 0.28.0 the toy runs aligned with prefix
    # caching on, the flags a user sets there; 0.32.0 and 0.33.0 refuse the
    # example's 22-block pool: a larger one shows it).
    KnownBug(Category.STATE_BLOCK_ESTIMATE, "0.23.0", None,
             "after a synchronous KV-connector load on a Mamba 'align' hybrid, a Mamba group's block estimate "
             "(get_num_blocks_to_allocate) is one block while allocate_slots takes two, so the scheduler's check "
             "against the free pool passes and, with the pool tight, schedule() raises 'Cannot get N free blocks "
             "from the pool' instead of leaving the request waiting (open upstream: vLLM PR #46892)",
             "block_estimate:", name="mamba_estimate_below_allocation_after_connector_load",
             group_kinds=frozenset({GroupKind.MAMBA_ALIGN}),
             also_shows=((Category.SUBJECT_CRASH, "free blocks from the pool"),),
             needs="a KV connector that loads synchronously (e.g. DecodeBenchConnector) on a Mamba hybrid",
             reproduction="tests/fixtures/repro_mamba_estimate_after_connector_load.py",
             title="Mamba group's block estimate is below what allocate_slots takes after a synchronous KV "
                   "connector load (schedule() can raise 'Cannot get N free blocks from the pool')",
             fix="vLLM PR #46892 (open upstream) addresses this mechanism: the Mamba group's estimate after a "
                 "synchronous connector load must count every block allocate_slots then takes",
             range_search="docs/results/known-ranges/mamba_estimate_below_allocation_after_connector_load.json"),
    # Found by retention_hit through the engine on 0.30.0/0.31.0 (toy-nemotron-h,
    # --max-num-batched-tokens 64); the probe through vLLM's Scheduler, built the
    # engine's way, shows it under dense (0.23.0-0.28.0) and sparse (0.29.0-0.31.0)
    # retention alike and not from 0.32.0: the chunk stop, not the retention mask.
    # Before 0.28.0 the toy's engine defaults build no align group (the flags in
    # ``needs``); 0.23.0 is the oldest release the engine builder runs on.  The
    # targeted search through the engine per release shows it on 0.23.0-0.31.0
    # (its example engine program as it is; before 0.28.0 aligned with prefix
    # caching on) and not on 0.32.0-0.34.0 (the example, 20 programs around it
    # and 40 searched, nothing else broken).
    KnownBug(Category.STATE_RETENTION_HIT, "0.23.0", "0.32.0",
             "prefill of a prompt whose length is a multiple of the Mamba block runs in one chunk to the prompt's "
             "end on a Mamba 'align' hybrid (_mamba_block_aligned_split stops at num_tokens - num_tokens % block), "
             "so no Mamba state is made at the replay boundary (num_tokens - 1 floored to the block), the highest "
             "position a resend's lookup can land on: a resend or a sibling sharing that prefix hits 0 although "
             "full attention holds it (upstream issue #50235; 0.32.0 stops at the replay boundary)",
             BLOCK_ALIGNED_REPLAY, name="mamba_align_block_aligned_prompt_replay_state_missing",
             needs="a Mamba 'align' hybrid with prefix caching and a prompt of a whole number of Mamba blocks "
                   "(before 0.28.0: --mamba-cache-mode align --enable-prefix-caching)",
             reproduction="tests/fixtures/repro_mamba_align_block_aligned_prompt.py",
             range_search="docs/results/known-ranges/mamba_align_block_aligned_prompt_replay_state_missing.json"),
    # The targeted search per release at the manager level (hand-built
    # KVCacheConfig) shows it on 0.33.0-0.34.0 (its case as it is); 0.23.0-0.32.0
    # cannot express it (the worker: no lookahead block hashes before 0.33).
    KnownBug(Category.SUBJECT_CRASH, "0.33.0", None,
             "SlidingWindowManager.find_longest_cache_hit raises IndexError (block_hashes[i]) on a request's "
             "first lookup when a sliding-window group is an EAGLE group, no group is full attention (the "
             "others are Mamba 'align' or sliding window) and lookahead block hashes cover 2 or more tokens "
             "(multi-module MTP): it scans max_length // block_size blocks, but lookahead hashes stop "
             "num_hash_lookahead_tokens short of the request (a full-attention group, looked up first, keeps "
             "the candidate within the hashes)", "IndexError",
             needs="lookahead block hashes of 2+ tokens, an EAGLE sliding-window group, no full-attention group",
             name="sliding_window_eagle_multi_module_lookahead_crash",
             range_search="docs/results/known-ranges/sliding_window_eagle_multi_module_lookahead_crash.json",
             reach="no known deployment: it needs a drafter layer with sliding-window attention, multi-module MTP "
                   "and no full-attention group; no profile of the catalog has one (hardening)"),
)


def known_bugs(version: str | None, category: Category | None = None, summary: str | None = None,
               group_kinds: tuple[GroupKind, ...] | None = None) -> list[KnownBug]:
    """The known bugs release ``version`` carries (of ``category`` and
    matching a discrepancy's ``summary``, if given); none for anything that
    is not a release number."""
    if not isinstance(version, str) or not re.fullmatch(r"\d+\.\d+\.\d+", version):
        return []  # a checkout's own version says nothing of which fixes it has
    return [b for b in KNOWN_BUGS if b.carried_by(version) and (category is None or b.shows_as(category))
            and (summary is None or b.matches(summary, category, group_kinds))]


def recognise(known: tuple[KnownBug, ...] | list[KnownBug], found) -> KnownBug | None:
    """The one known bug every discrepancy in ``found`` is (by its category,
    its words and, where the invariant names it, its mechanism: which group
    kinds broke the rule), or None: a failure that is partly something else
    is new."""
    for bug in known:
        if found and all(bug.matches(d.summary(), d.category, d.group_kinds) for d in found):
            return bug
    return None


def recognise_all(known: tuple[KnownBug, ...] | list[KnownBug], found) -> tuple[KnownBug, ...]:
    """The known bugs ``found`` is: the one bug every discrepancy is
    (``recognise``), else the bugs each discrepancy is one of, when every one
    is (two known bugs can break one step); () when any discrepancy is none
    of them: a failure that is partly something else is new."""
    one = recognise(known, found)
    if one is not None:
        return (one,)
    bugs: list[KnownBug] = []
    for d in found:
        bug = next((b for b in known if b.matches(d.summary(), d.category, d.group_kinds)), None)
        if bug is None:
            return ()
        if bug not in bugs:
            bugs.append(bug)
    return tuple(bugs)


def count_met(met: dict[str, int], first: dict[str, str], bugs, where: str) -> None:
    """Count one more meeting of each of ``bugs`` in ``met`` (by name);
    ``first`` keeps where each was met first (a case or program, described)."""
    for bug in bugs:
        met[bug.name] = met.get(bug.name, 0) + 1
        first.setdefault(bug.name, where)
