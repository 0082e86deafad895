"""vLLM bugs kvspec has found in published releases, written once.

Each was found by a differential, shrunk, replayed on every release to find
the first without it, and judged a vLLM bug (not a gap in the model): the
README's tables and the shipped tests' expected failures read this list.
"""

from __future__ import annotations

import re

import attrs

from .about import release_key
from .finding import Category

__all__ = ["KnownBug", "KNOWN_BUGS", "known_bugs"]


@attrs.frozen
class KnownBug:
    category: Category = attrs.field(converter=Category)
    first: str  # the first release kvspec checked that carries it
    fixed_in: str | None  # the first release without it (None: the newest still has it)
    summary: str
    signature: str  # text every discrepancy of this bug shows in its summary
    needs: str = ""  # a non-default setting it needs, if any

    def matches(self, summary: str) -> bool:
        return self.signature in summary

    def carried_by(self, version: str) -> bool:
        key = release_key(version)
        return key >= release_key(self.first) and (self.fixed_in is None or key < release_key(self.fixed_in))


KNOWN_BUGS: tuple[KnownBug, ...] = (
    KnownBug(Category.STATE_HIT_GROUPS, "0.23.0", "0.29.0",
             "the hybrid lookup trims only the first full-attention group to the reconciled hit; a second one "
             "(another block size, or a draft model's) returns blocks past the hit",
             "hit_groups:"),
    KnownBug(Category.SUBJECT_CRASH, "0.26.0", "0.28.0",
             "find_longest_cache_hit asserts 'SlidingWindowManager does not support fine-grained (partial) cache "
             "hits' with partial hash hits and a sliding-window group whose block differs from the hash block",
             "does not support fine-grained (partial) cache hits"),
    KnownBug(Category.STATE_TABLE_APPEND_ONLY, "0.26.0", "0.28.0",
             "after an admission with KV-connector tokens the Mamba manager copies-on-write into the running "
             "request's table, which must stay append-only", "append_only:"),
    KnownBug(Category.SUBJECT_CRASH, "0.27.1", "0.32.0",
             "with KV-connector tokens on a full-attention + Mamba layout after a reset and a preemption, "
             "allocate_slots raises 'Cannot get 1 free blocks' instead of refusing (vLLM's default admission "
             "gate on)", "free blocks from the pool"),
    KnownBug(Category.SUBJECT_CRASH, "0.30.0", None,
             "the Mamba group's block estimate leaves out the block it takes for KV-connector tokens, so "
             "allocate_slots raises 'Cannot get N free blocks' instead of refusing", "free blocks from the pool",
             needs="--no-scheduler-reserve-full-isl"),
)


def known_bugs(version: str | None, category: Category | None = None, summary: str | None = None) -> list[KnownBug]:
    """The known bugs release ``version`` carries (of ``category`` and
    matching a discrepancy's ``summary``, if given); none for anything that
    is not a release number."""
    if not isinstance(version, str) or not re.fullmatch(r"\d+\.\d+\.\d+", version):
        return []  # a checkout's own version says nothing of which fixes it has
    return [b for b in KNOWN_BUGS if b.carried_by(version) and (category is None or b.category is category)
            and (summary is None or b.matches(summary))]
