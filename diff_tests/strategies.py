"""Hypothesis strategies: configurations vLLM accepts, and request step sequences.

Generated geometries satisfy vLLM's constructor preconditions (the same
validators ``model.domain`` enforces), so every example reaches the
registration code; what a release cannot express (a lookahead before 0.28)
is not generated for it.
"""

from __future__ import annotations

import functools
import random
import re

import attrs
from hypothesis import strategies as st

from kvspec.model.capabilities import Capabilities
from kvspec.model.case import Case, LookupProbe, Step
from kvspec.model.domain import CoordinatorConfig, GroupKind, HashScheme, KVCacheGroup


__all__ = ["configs", "full_attention_configs", "batches", "lookup_batches", "Batch", "MAX_BATCH",
           "hash_schemes_of", "deployment_configs", "deployment_requests", "MAX_DEPLOYMENT_BATCH"]

MAX_BATCH = 128

MAX_PROMPT = 64


# Strategies are built once and reused: a strategy made afresh inside every
# draw is validated afresh too, which cost more than the draw itself.
_HASH_BLOCK = st.sampled_from((1, 2, 4))
_SCHEDULER_MULTIPLE = st.sampled_from((1, 2, 3, 4, 6, 8))
_FULL_ATTENTION_MULTIPLE = st.sampled_from((2, 3, 4, 6, 8))
_GROUP_KIND = st.sampled_from(tuple(GroupKind))
_SEED = st.integers(0, 2**32 - 1)


@functools.lru_cache(maxsize=None)
def _block_sizes(S: int, H: int) -> st.SearchStrategy[int]:
    """A group's block size: a multiple of H that divides S."""
    return st.sampled_from(tuple(b for b in range(H, S + 1, H) if S % b == 0))


@functools.lru_cache(maxsize=None)
def _between(low: int, high: int) -> st.SearchStrategy[int]:
    return st.integers(low, high)


@st.composite
def configs(draw, capabilities: Capabilities, max_groups: int = 3) -> CoordinatorConfig:
    caps = capabilities
    H = draw(_HASH_BLOCK)
    S = H * draw(_SCHEDULER_MULTIPLE)
    blocks = _block_sizes(S, H)
    count = draw(_between(2, max_groups))
    groups = []
    for _ in range(count):
        kind = draw(_GROUP_KIND)
        block = draw(blocks)
        window = draw(_between(1, 2 * S)) if kind is GroupKind.SLIDING_WINDOW else 0
        eagle = kind is not GroupKind.MAMBA_ALIGN and draw(st.booleans())
        groups.append(KVCacheGroup(kind, block, eagle=eagle, sliding_window=window))
    # A hybrid model has at least two distinct KV-cache specs (0.23-0.31
    # assert it; identical twins are merged for lookup).
    specs = {(g.kind, g.block_size, g.sliding_window) for g in groups}
    if len(specs) < 2:
        first = groups[0]
        other = GroupKind.MAMBA_ALIGN if first.kind is not GroupKind.MAMBA_ALIGN else GroupKind.FULL_ATTENTION
        groups[-1] = KVCacheGroup(other, draw(blocks))
    any_eagle = any(g.eagle for g in groups)
    lookahead = 0
    if caps.reprefillable_tokens:
        lookahead = draw(_between(0, S if any_eagle else 2 * S))
    return CoordinatorConfig(
        groups=tuple(groups), scheduler_block_size=S, hash_block_size=H,
        num_prefill_lookahead=lookahead,
    )


class Batch(tuple):
    """The requests of one Hypothesis example, all on one configuration.

    Hypothesis prints the example it replays; a hundred full ``Case`` reprs
    would bury the point, so a batch shows its configuration and its first
    requests (the failing case itself is in the assertion message)."""

    SHOWN = 3
    scope = "small"  # or "deployment": drawn from what the catalog's deployment profiles run

    def __repr__(self) -> str:
        if not self:
            return "Batch()"
        requests = [f"prompt={case.describe().split(' prompt=', 1)[-1]}" for case in self[:self.SHOWN]]
        if len(self) > self.SHOWN:
            requests.append(f"... {len(self) - self.SHOWN} more")
        return f"Batch({self[0].config.describe()}: {len(self)} requests: {'; '.join(requests)})"


def random_request(rng: random.Random) -> tuple[int, tuple[Step, ...]]:
    """One request's prompt and steps from a seeded generator.

    Requests are derived from one drawn seed rather than drawn value by value:
    a Hypothesis draw costs far more than a vLLM run here, and a failing
    request is minimised afterwards by ``diff_tests.reduce``.
    """
    prompt_len = rng.randint(1, MAX_PROMPT)
    cuts = sorted({rng.randint(1, prompt_len) for _ in range(rng.randint(0, 2))} - {prompt_len})
    edges = [0, *cuts, prompt_len]
    steps = [Step("prefill", tokens=b - a) for a, b in zip(edges, edges[1:])]
    for _ in range(rng.randint(0, 4)):
        drafts = rng.randint(0, 3)
        steps.append(Step("decode", drafts=drafts, accepted=rng.randint(0, drafts)))
    return prompt_len, tuple(steps)


def hash_schemes_of(capabilities: Capabilities, narrowed: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The hash schemes fuzzed on a subject: both where it has lookahead block
    hashes (0.33+: lookahead is what its scheduler builds by default, legacy
    what a KV connector without lookahead support or
    ``disable_lookahead_block_hashes`` gets, and only there is the EAGLE
    branch of the bound live), legacy before; ``narrowed`` keeps those named."""
    available = ("legacy", "lookahead") if capabilities.lookahead_block_hashes else ("legacy",)
    if narrowed is None:
        return available
    return tuple(s for s in available if s in narrowed)


def _with_scheme(draw, config: CoordinatorConfig, schemes: tuple[str, ...]) -> CoordinatorConfig:
    if len(schemes) < 2:
        return attrs.evolve(config, hash_scheme=HashScheme(schemes[0])) if schemes else config
    return attrs.evolve(config, hash_scheme=HashScheme(draw(_schemes(schemes))))


@functools.lru_cache(maxsize=None)
def _schemes(schemes: tuple[str, ...]) -> st.SearchStrategy[str]:
    return st.sampled_from(schemes)


# -- what real deployments run ----------------------------------------------------

# Requests per example in the deployment scope: their prompts run to
# thousands of tokens, so a batch is smaller than a toy one.
MAX_DEPLOYMENT_BATCH = 8
# Prefill chunk limits a server uses (max_num_batched_tokens).
_CHUNKS = (512, 2048, 8192)
_RELEASE = re.compile(r"^(\d+\.\d+\.\d+)")


@functools.lru_cache(maxsize=None)
def deployment_configs(version: str | None, schemes: tuple[str, ...]) -> tuple[CoordinatorConfig, ...]:
    """The coordinator configurations the catalog's deployment profiles get
    on release ``version`` (``model.deployments.derive``, held to the
    release's own code by tests/integration/test_deployments.py), under each
    hash scheme in ``schemes``: only those the hybrid coordinator runs and
    the worker can drive (DCP > 1 is not; ``Capabilities.not_covered`` says
    so).  A tree whose version is not a release is derived as the newest
    release kvspec knows; before 0.28 there are none."""
    from kvspec.model.about import NEWEST_VALIDATED
    from kvspec.model.deployments import CATALOG, derive, schemes_for

    match = _RELEASE.match(version or "")
    release = match.group(1) if match else NEWEST_VALIDATED
    found: dict[CoordinatorConfig, None] = {}
    for profile in CATALOG:
        for legacy in schemes_for(profile, release):
            derived = derive(profile, release, legacy_hashes=legacy)
            config = derived.coordinator_config()
            if config is None or config.dcp_world_size > 1 or config.hash_scheme.value not in schemes:
                continue
            found[config] = None
    return tuple(found)


@functools.lru_cache(maxsize=None)
def _deployment_choice(configs: tuple[CoordinatorConfig, ...]) -> st.SearchStrategy[CoordinatorConfig]:
    return st.sampled_from(configs)


def deployment_requests(rng: random.Random, config: CoordinatorConfig) -> tuple[int, tuple[Step, ...]]:
    """A request of deployment size: a prompt of up to four scheduler blocks
    (at least 64 tokens, at most 8,192), prefilled in chunks of a server's
    limit (512, 2,048 or 8,192 tokens, the last one whatever is left), then
    decode steps with up to three drafts."""
    S = config.scheduler_block_size
    prompt_len = rng.randint(1, min(8192, max(64, 4 * S)))
    limit = rng.choice(_CHUNKS)
    steps = [Step("prefill", tokens=min(limit, prompt_len - start)) for start in range(0, prompt_len, limit)]
    for _ in range(rng.randint(0, 6)):
        drafts = rng.randint(0, 3)
        steps.append(Step("decode", drafts=drafts, accepted=rng.randint(0, drafts)))
    return prompt_len, tuple(steps)


@st.composite
def batches(draw, capabilities: Capabilities, max_size: int = MAX_BATCH,
            hash_schemes: tuple[str, ...] | None = None,
            deployments: tuple[CoordinatorConfig, ...] = ()) -> tuple[Case, ...]:
    """One configuration (drawn, so Hypothesis shrinks it) and a batch of
    requests from a drawn seed, each run on a fresh manager.

    The configuration comes from the small scope (``configs``: toy block
    sizes, where shrinking finds minimal counterexamples) or, when
    ``deployments`` are given, from what real deployments run (S in the
    hundreds, prompts of thousands of tokens); the hash scheme is drawn from
    ``hash_schemes`` (default: both where the subject has lookahead hashes)."""
    schemes = hash_schemes_of(capabilities) if hash_schemes is None else hash_schemes
    if deployments and draw(st.booleans()):
        config = _with_scheme(draw, draw(_deployment_choice(deployments)), ())
        count = draw(_between(1, MAX_DEPLOYMENT_BATCH))
        rng = random.Random(draw(_SEED))
        batch = Batch(Case(config, *deployment_requests(rng, config)) for _ in range(count))
        batch.scope = "deployment"
        return batch
    config = _with_scheme(draw, draw(configs(capabilities)), schemes)
    count = draw(_between(1, max_size))
    rng = random.Random(draw(_SEED))
    return Batch(Case(config, *random_request(rng)) for _ in range(count))


@st.composite
def full_attention_configs(draw, capabilities: Capabilities) -> CoordinatorConfig:
    """Layouts of full-attention groups only (two or three distinct block
    sizes): where the lookup model predicts the hit exactly."""
    caps = capabilities
    H = draw(_HASH_BLOCK)
    S = H * draw(_FULL_ATTENTION_MULTIPLE)
    sizes = draw(st.lists(_block_sizes(S, H), min_size=2, max_size=3, unique=True))
    groups = tuple(KVCacheGroup(GroupKind.FULL_ATTENTION, b, eagle=draw(st.booleans())) for b in sizes)
    lookahead = 0
    if caps.reprefillable_tokens:
        lookahead = draw(_between(0, S if any(g.eagle for g in groups) else 2 * S))
    return CoordinatorConfig(groups=groups, scheduler_block_size=S, hash_block_size=H,
                             num_prefill_lookahead=lookahead)


def random_probe(rng: random.Random, writer_tokens: int, unit: int) -> LookupProbe:
    """A later request: usually sharing a prefix that ends on or next to a
    block-ish boundary (where off-by-one-block lookups show), else anywhere."""
    if rng.random() < 0.6:
        shared = min(writer_tokens, max(0, rng.randint(0, writer_tokens // unit + 1) * unit
                                        + rng.choice((-1, 0, 0, 1))))
    else:
        shared = rng.randint(0, writer_tokens)
    return LookupProbe(shared, rng.randint(1, 8))


@st.composite
def lookup_batches(draw, capabilities: Capabilities,
                   max_size: int = MAX_BATCH) -> tuple[Case, ...]:
    """Like ``batches``, each request followed by a later request that looks
    up; half the configurations are full-attention-only (exact hits)."""
    if draw(st.booleans()):
        config = draw(full_attention_configs(capabilities))
    else:
        config = draw(configs(capabilities))
    count = draw(_between(1, max_size))
    rng = random.Random(draw(_SEED))
    out = []
    for _ in range(count):
        prompt_len, steps = random_request(rng)
        writer = Case(config, prompt_len, steps)
        unit = rng.choice([g.block_size for g in config.groups] + [config.scheduler_block_size])
        out.append(Case(config, prompt_len, steps, random_probe(rng, writer.writer_tokens, unit)))
    return Batch(out)
