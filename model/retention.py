"""Prefix-cache retention: which boundaries a sliding-window or Mamba group
registers, and the hit a resend or a sibling request is owed.

vLLM 0.30+ (``prefix_cache_retention_interval``: ``None`` dense, ``0`` sparse
-- the ``CacheConfig`` default from 0.30.0 --, positive: every interval-th
boundary) registers every full block of a full-attention group, but only some
of a sliding-window or Mamba group's: a block serves a hit only as part of the
run a lookup at some boundary needs (the window's blocks before it; the one
state block ending on it), so a group keeps the runs of the boundaries it
promises to serve.  Those are

* the *replay boundaries* of the request (a resend of the same prompt is
  capped at ``prompt - 1`` tokens; under EAGLE also the block below the
  extension point), floored to the group's hit alignment;
* the *shared-prefix junction* the lookup reported for the request (where a
  longer full-attention hit than the reconciled one showed a prefix another
  request shares; from 0.30), floored likewise;
* under a positive interval, every interval-th boundary; dense: every
  alignment boundary (sliding window) or every block (Mamba).

``registered_blocks`` is that rule per group (0.30.0-0.34.0 compute the same
mask); ``servable`` turns usable blocks into the boundaries a group can serve,
and ``owed_hit`` into the hit a later lookup is owed: a block is keyed by the
tokens up to its end, so any earlier request's block within the prefix it
shares with the new prompt serves, and blocks of several requests combine.
What the model does not decide, said in ``RETENTION_SCOPE``: a Mamba state
exists only where a chunk ended (the scheduler ends chunks at the replay
boundary and the junction -- from 0.32.0 also for a prompt of whole blocks,
known.mamba_align_block_aligned_prompt_replay_state_missing before --, not at
every interval boundary), and Mamba's partial-block checkpoints (finer than a
block) are not modelled; so the owed hit is a *lower bound*, and a request's
blocks count only while every hash-map entry present at any point since it was
first scheduled is still present (nothing evicted, no reset since): a group
registers a block when the chunk computing it is allocated, not when the
prompt completes, and a sliding-window group frees the blocks that leave the
window while the prompt is still being computed (``remove_skipped_blocks`` on
the next chunk or the last prompt token), where the next allocation under pool
pressure may evict them (LRU, ``BlockPool.get_new_blocks``) before the prompt
is computed.  A request preempted before its prompt was computed does not
count: the schedule that preempted it may have registered and evicted its
blocks unseen.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import attrs

from .domain import GroupKind, KVCacheGroup

__all__ = ["replay_boundaries", "reachable_boundaries", "registered_blocks", "kept_boundaries",
           "RetentionLayout", "RETENTION_SCOPE", "BLOCK_ALIGNED_REPLAY", "owed_hit", "common_prefix", "describe_interval"]

RETENTION_SCOPE = (
    "a resend or sibling's hit is checked as a lower bound: at least the highest position every group can serve "
    "from blocks earlier requests whose prompts were computed kept (each request's blocks within the prefix it "
    "shares with the new prompt, several requests' combined; what each keeps: its replay boundary, its "
    "shared-prefix junction, under dense retention or a positive interval also the sliding window's kept runs), "
    "counting only requests none of whose hash-map entries present at any point since they were first scheduled has "
    "left the map (vLLM registers a block when its chunk is allocated; a sliding window frees blocks leaving the "
    "window while the prompt is still computed, and pool pressure may evict them before it completes) and none "
    "preempted before their prompts were computed; not predicted: Mamba states at interval boundaries (they exist only where a chunk ended), "
    "Mamba's partial-block checkpoints, speculative decoding (EAGLE drops, lookahead hashes), programs with a KV connector (a loaded prompt's states "
    "are the connector's), lookups of preempted requests"
)


# Words a retention_hit finding carries when the owed boundary is this one.
BLOCK_ALIGNED_REPLAY = "a prompt whose length is a multiple of the Mamba block"


def describe_interval(interval: int | None) -> str:
    if interval is None:
        return "dense (every boundary)"
    if interval == 0:
        return "sparse 0 (replay boundaries and shared-prefix junctions only)"
    return f"every {interval} tokens, plus replay boundaries and junctions"


def replay_boundaries(num_prompt_tokens: int, scheduler_block: int, eagle: bool) -> tuple[int, ...]:
    """Where a later request replaying the prompt resumes: a resend stops one
    token short of the prompt (its last token is recomputed for logits).
    Under EAGLE a group matches one block past its hit and drops it, so the
    positions are one scheduler block below the resend's and the extension's."""
    if not eagle:
        return (num_prompt_tokens - 1,)
    resend = (num_prompt_tokens - 1) // scheduler_block * scheduler_block
    extension = num_prompt_tokens // scheduler_block * scheduler_block
    return tuple(sorted({max(0, resend - scheduler_block), max(0, extension - scheduler_block)}))


def reachable_boundaries(num_prompt_tokens: int, scheduler_block: int, eagle: bool, junction: int,
                         group: KVCacheGroup) -> tuple[int, ...]:
    """The boundaries a group keeps whatever the interval: the replay ones and
    the junction (under EAGLE a sliding window also the block below it, since
    a sibling diverging just past the junction cannot peek past it)."""
    out = list(replay_boundaries(num_prompt_tokens, scheduler_block, eagle))
    if junction:
        out.append(junction)
        if group.eagle and group.kind is GroupKind.SLIDING_WINDOW:
            out.append(junction - group.block_size)
    return tuple(out)


def _window_run(group: KVCacheGroup) -> int:
    # A window hit needs the blocks holding the window's last W - 1 tokens;
    # EAGLE one more (matched, then dropped).
    return -(-(group.sliding_window - 1) // group.block_size) + (1 if group.eagle else 0)


def registered_blocks(group: KVCacheGroup, num_blocks: int, alignment: int, interval: int | None,
                      boundaries: Sequence[int]) -> tuple[bool, ...]:
    """Which of the first ``num_blocks`` full blocks the group registers (a
    key in the hash map) when the request computes them.  Full attention
    registers every block."""
    if group.kind is GroupKind.FULL_ATTENTION:
        return (True,) * num_blocks
    block = group.block_size
    if group.kind is GroupKind.SLIDING_WINDOW:
        if alignment % block:
            return (True,) * num_blocks  # a sub-block alignment cannot be masked: vLLM keeps everything
        run, shift = _window_run(group), 1 if group.eagle else 0
        keep = [False] * num_blocks
        segment = alignment if interval is None else interval
        if segment:
            per = segment // block
            if run >= per:
                return (True,) * num_blocks
            # The run ending on each segment's end (shifted one block up under EAGLE).
            for i in range(shift, num_blocks):
                keep[i] = (i - shift) % per >= per - run
        if interval is not None:
            for b in boundaries:
                end = b // alignment * alignment // block + shift
                for j in range(max(0, end - run), min(num_blocks, end)):
                    keep[j] = True
        return tuple(keep)
    # Mamba: one state block ending on each kept boundary.
    if interval is None:
        return (True,) * num_blocks
    keep = [False] * num_blocks
    if interval:
        per = interval // block
        if per <= 1:
            return (True,) * num_blocks
        for i in range(per - 1, num_blocks, per):
            keep[i] = True
    for b in boundaries:
        j = b // alignment * alignment // block - 1
        if 0 <= j < num_blocks:
            keep[j] = True
    return tuple(keep)


def kept_boundaries(group: KVCacheGroup, num_blocks: int, alignment: int, interval: int | None,
                    boundaries: Sequence[int], trusted: Iterable[int] | None = None) -> frozenset[int]:
    """The positions (multiples of ``alignment``, above 0) at which the group
    can serve a hit from what it registered over ``num_blocks`` full blocks.
    ``trusted``: for Mamba, only these positions count (a state block exists
    only where a chunk ended); None: every position the mask keeps."""
    out = servable(group, registered_blocks(group, num_blocks, alignment, interval, boundaries), alignment)
    if trusted is not None and group.kind is GroupKind.MAMBA_ALIGN:
        out &= {b // alignment * alignment for b in trusted}
    return out


def _needed(group: KVCacheGroup, p: int) -> range:
    """The blocks a hit of ``p`` tokens reads in the group (keys it needs)."""
    end = p // group.block_size
    if group.kind is GroupKind.FULL_ATTENTION:
        return range(end)
    if group.kind is GroupKind.SLIDING_WINDOW:
        shift = 1 if group.eagle else 0
        return range(max(0, end + shift - _window_run(group)), end + shift)
    return range(end - 1, end)


def servable(group: KVCacheGroup, keep: Sequence[bool], alignment: int) -> frozenset[int]:
    """The positions (multiples of ``alignment`` and of the block, above 0)
    at which the group can serve a hit when block ``i`` holds a usable key
    exactly where ``keep[i]``."""
    block = group.block_size
    out = set()
    for p in range(alignment, len(keep) * block + 1, alignment):
        if p % block:
            continue
        needed = _needed(group, p)
        if needed.stop <= len(keep) and all(keep[i] for i in needed):
            out.add(p)
    return frozenset(out)


@attrs.frozen
class RetentionLayout:
    """What the engine built, as far as retention goes."""

    groups: tuple[KVCacheGroup, ...]
    alignments: tuple[int, ...]  # per group, the granularity its boundaries are floored to
    scheduler_block: int
    interval: int | None
    enable_caching: bool = True
    # A KV connector loads prompts: a loaded prefix's Mamba and window states
    # are the connector's, not the ones a local prefill computes and keeps.
    connector: bool = False
    # Speculative decoding: EAGLE's dropped blocks and lookahead hashes (a
    # block is keyed only once the tokens past it are known) move what a
    # computed prompt has registered.
    speculative: bool = False

    @property
    def predicts(self) -> bool:
        """Whether ``owed_hit`` says anything: caching on, no speculative
        decoding (its shifted runs, drops and lookahead hashes are not
        modelled here), no KV connector."""
        return (self.enable_caching and not self.connector and not self.speculative
                and not any(g.eagle for g in self.groups))

    def usable_blocks(self, num_prompt_tokens: int, junction: int) -> tuple[tuple[bool, ...], ...]:
        """Per group, which of the prompt's full blocks hold a key a later
        lookup can use once the prompt is computed: the registered ones; for
        Mamba only the state blocks ending on a trusted kept boundary."""
        out = []
        for group, alignment in zip(self.groups, self.alignments):
            num_blocks = num_prompt_tokens // group.block_size
            boundaries = reachable_boundaries(num_prompt_tokens, self.scheduler_block, group.eagle, junction, group)
            if group.kind is GroupKind.MAMBA_ALIGN:
                # A Mamba state at a boundary the scheduler does not end a chunk at
                # may not exist: only the replay boundary and junction are trusted.
                ends = {p // group.block_size for p in kept_boundaries(group, num_blocks, alignment, self.interval,
                                                                       boundaries, boundaries)}
                out.append(tuple(i + 1 in ends for i in range(num_blocks)))
            else:
                out.append(registered_blocks(group, num_blocks, alignment, self.interval, boundaries))
        return tuple(out)

    def kept_everywhere(self, num_prompt_tokens: int, junction: int) -> frozenset[int]:
        """The boundaries every group can serve from this prompt's blocks alone."""
        kept: frozenset[int] | None = None
        for group, alignment, keep in zip(self.groups, self.alignments,
                                          self.usable_blocks(num_prompt_tokens, junction)):
            mine = servable(group, keep, alignment)
            kept = mine if kept is None else kept & mine
        return kept or frozenset()


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def owed_hit(layout: RetentionLayout, prompt: Sequence[int], earlier: Sequence[tuple[Sequence[int], int]]
             ) -> tuple[int, tuple[tuple[int, ...], ...]]:
    """The least hit a first lookup of ``prompt`` is owed, and per group the
    earlier requests (indices in ``earlier``) whose blocks serve it: the
    highest position below the new prompt's last token at which every group
    can serve a hit from blocks earlier requests (prompt computed, nothing
    evicted since) kept.  A block is keyed by the tokens up to its end, so an
    earlier request's block serves only within the prefix the two share;
    within it, blocks of several requests combine (a window's run, one
    request's full-attention blocks with another's Mamba state)."""
    cap = len(prompt) - 1
    keep = [[False] * (max(cap, 0) // g.block_size) for g in layout.groups]
    owners: list[list[list[int]]] = [[[] for _ in k] for k in keep]
    for index, (other, junction) in enumerate(earlier):
        shared = min(common_prefix(prompt, other), cap)
        if shared <= 0:
            continue
        for g, (group, mask) in enumerate(zip(layout.groups, layout.usable_blocks(len(other), junction))):
            for i in range(min(len(mask), shared // group.block_size)):
                if mask[i]:
                    keep[g][i] = True
                    owners[g][i].append(index)
    positions: frozenset[int] | None = None
    for group, alignment, k in zip(layout.groups, layout.alignments, keep):
        mine = servable(group, k, alignment)
        positions = mine if positions is None else positions & mine
    best = max(positions or (0,))
    if not best:
        return 0, ()
    return best, tuple(tuple(sorted({i for b in _needed(group, best) for i in owners[g][b]}))
                       for g, group in enumerate(layout.groups))


@attrs.define
class RetentionLedger:
    """One engine program's history as retention sees it: each request's
    prompt, its junction, whether its prompt has been computed, and the
    hash-map entries present then (what must still be there for its kept
    boundaries to be owed).  Fed by the engine oracle, read by the
    ``retention_hit`` invariant through ``Lookup.owed``."""

    layout: RetentionLayout
    prompts: dict[str, tuple[int, ...]] = attrs.Factory(dict)
    junctions: dict[str, int] = attrs.Factory(dict)
    admitted: set[str] = attrs.Factory(set)  # requests seen running
    # request -> every map entry present at some point from its first schedule until its prompt was computed
    computed: dict[str, frozenset] = attrs.Factory(dict)
    # requests being computed -> every map entry present since they were first scheduled
    computing: dict[str, frozenset] = attrs.Factory(dict)
    # preempted before their prompts were computed: never owed from
    interrupted: set[str] = attrs.Factory(set)

    def arrive(self, request: str, tokens: Sequence[int]) -> None:
        self.prompts[request] = tuple(tokens)
        self.junctions.pop(request, None)
        self.computed.pop(request, None)
        self.computing.pop(request, None)
        self.interrupted.discard(request)
        self.admitted.discard(request)

    def owed(self, request: str, num_tokens: int, intact: frozenset) -> tuple[int, str]:
        """The hit owed to a lookup of ``request`` made while the map held at
        least ``intact``; (0, "") when nothing is owed or predicted."""
        prompt = self.prompts.get(request)
        # A preempted request looks up again with its outputs appended: not predicted.
        if not self.layout.predicts or prompt is None or num_tokens != len(prompt):
            return 0, ""
        names = [name for name, entries in self.computed.items()
                 if name != request and name not in self.interrupted and entries <= intact]
        hit, sources = owed_hit(self.layout, prompt, [(self.prompts[n], self.junctions.get(n, 0)) for n in names])
        if not hit:
            return 0, ""
        used = sorted({i for per_group in sources for i in per_group})
        parts = []
        for i in used:
            name = names[i]
            other = self.prompts[name]
            how = "a resend of" if other == prompt else f"sharing {common_prefix(prompt, other)} tokens with"
            groups = [g for g, per_group in enumerate(sources) if i in per_group]
            which = "" if len(groups) == len(sources) else f" (groups {', '.join(map(str, groups))})"
            parts.append(f"{how} {name}{which} ({len(other)}-token prompt computed, junction "
                         f"{self.junctions.get(name, 0)})")
        aligned = self._block_aligned_replay([[len(self.prompts[names[i]]) for i in per_group] for per_group in sources],
                                             hit)
        return hit, (f"{'; '.join(parts)}, retention {describe_interval(self.layout.interval)}: their kept blocks "
                     f"serve boundary {hit} in every group{aligned} and no hash-map entry has left the map since "
                     "they were first scheduled")

    def _block_aligned_replay(self, lengths: Sequence[Sequence[int]], hit: int) -> str:
        # Named so a finding says its mechanism: on such a prompt a Mamba state
        # at the replay boundary exists only if the scheduler ended a chunk
        # there (known.mamba_align_block_aligned_prompt_replay_state_missing).
        # Every request a Mamba group's state was owed from must be one.
        mamba = [(g, a, n) for g, a, n in zip(self.layout.groups, self.layout.alignments, lengths)
                 if g.kind is GroupKind.MAMBA_ALIGN]
        if mamba and all(n and all(m % g.block_size == 0 and hit == (m - 1) // a * a for m in n) for g, a, n in mamba):
            return f" (the replay boundary of {BLOCK_ALIGNED_REPLAY})"
        return ""

    def lookup_made(self, request: str, junction: int | None) -> None:
        """The junction a lookup pinned on the request (None: not reported).
        The one in force when the request registers is its last lookup's
        before it first ran; after it ran (preempted, admitted again) blocks
        were registered under two junctions, so only the replay boundary is
        taken as certain."""
        if request in self.admitted:
            self.junctions[request] = 0
        elif junction is not None:
            self.junctions[request] = junction

    def progress(self, running: dict[str, int], entries: frozenset, settled: bool = True) -> None:
        """After a transition: the map ``entries`` every request still
        computing its prompt has seen (its blocks are registered chunk by
        chunk, and one registered early may leave the map before the prompt
        completes: a sliding window frees it once it leaves the window, and
        an allocation may evict it), and, once ``settled`` (not a step's
        ``schedule()``, whose outputs are still to come), the requests whose
        whole prompt is now computed."""
        self.admitted.update(running)
        for request, done in running.items():
            prompt = self.prompts.get(request)
            if prompt is None or request in self.computed:
                continue
            seen = self.computing.get(request)
            seen = entries if seen is None else seen | entries
            if settled and done >= len(prompt):
                self.computing.pop(request, None)
                self.computed[request] = seen
            else:
                self.computing[request] = seen

    def preempted(self, requests: Iterable[str]) -> None:
        """Requests a ``schedule()`` preempted: one whose prompt was not yet
        computed may have registered blocks in that same schedule that were
        freed and evicted before any state was seen, so it is never owed
        from (until it arrives again)."""
        for request in requests:
            if request not in self.computed:
                self.interrupted.add(request)
