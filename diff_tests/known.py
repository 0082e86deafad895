"""Findings already reported, kept out of the default draw so they do not
mask others -- and never unsaid: every fuzz result lists the ones it kept
out (``FuzzResult.known_excluded``), and each has a test that it still
reproduces on the releases it was found on
(``tests/integration/test_known_findings.py``), so a fix shows.

A configuration a known finding covers is drawn under legacy hashes
instead of the scheme that triggers it, so the rest of what it exercises
is still fuzzed.
"""

from __future__ import annotations

from typing import Callable

import attrs

from kvspec.model.capabilities import Capabilities
from kvspec.model.domain import CoordinatorConfig, GroupKind, HashScheme

__all__ = ["KnownFinding", "KNOWN", "known_for", "without_known"]


@attrs.frozen
class KnownFinding:
    name: str
    summary: str  # what vLLM does, in one sentence
    found_on: tuple[str, ...]  # releases it was reproduced on
    applies: Callable[[CoordinatorConfig, Capabilities], bool]
    reach: str  # who is affected, as kvspec.reach found it


def _sliding_window_eagle_lookahead(config: CoordinatorConfig, caps: Capabilities) -> bool:
    eagle = [g for g in config.groups if g.eagle]
    return (caps.lookahead_block_hashes and config.num_hash_lookahead_tokens >= 2
            and not any(g.kind is GroupKind.FULL_ATTENTION for g in config.groups)
            and any(g.kind is GroupKind.SLIDING_WINDOW for g in eagle))


KNOWN: tuple[KnownFinding, ...] = (
    KnownFinding(
        "sliding_window_eagle_multi_module_lookahead_crash",
        "SlidingWindowManager.find_longest_cache_hit raises IndexError (block_hashes[i]) on a request's "
        "first lookup when a sliding-window group is an EAGLE group, no group is full attention (the "
        "others are Mamba 'align' or sliding window) and lookahead block hashes cover 2 or more tokens "
        "(multi-module MTP): it scans max_length // block_size blocks, but lookahead hashes stop "
        "num_hash_lookahead_tokens short of the request (a full-attention group, looked up first, keeps the "
        "candidate within the hashes)",
        ("0.33.0", "0.34.0"), _sliding_window_eagle_lookahead,
        "no known deployment: it needs a drafter layer with sliding-window attention, multi-module MTP and no "
        "full-attention group; no profile of the catalog has one (hardening)"),
)


def known_for(config: CoordinatorConfig, caps: Capabilities) -> KnownFinding | None:
    """The known finding this configuration would reproduce, if any."""
    for known in KNOWN:
        if known.applies(config, caps):
            return known
    return None


def without_known(config: CoordinatorConfig, caps: Capabilities) -> CoordinatorConfig:
    """``config``, drawn under legacy hashes when its own scheme reproduces a known finding."""
    if config.hash_scheme is HashScheme.LOOKAHEAD and known_for(config, caps) is not None:
        return attrs.evolve(config, hash_scheme=HashScheme.LEGACY)
    return config
