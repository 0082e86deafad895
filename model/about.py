"""What a result says about kvspec itself: the versions it ran with, the
schema id of every document it writes, and the vLLM releases it supports.

One module, at the bottom of the tree, so that every layer names these the
same way.
"""

from __future__ import annotations

import platform

__all__ = ["SCHEMAS", "OLDEST_SUPPORTED", "NEWEST_VALIDATED", "release_key", "versions"]

# Every JSON document kvspec writes carries one of these in its "schema" field;
# bump the number when a field changes meaning or goes away.
SCHEMAS = {
    "finding": "kvspec.finding/2",
    "fuzz": "kvspec.fuzz/4",
    "prove": "kvspec.prove/1",
    "history": "kvspec.history/1",
    "mutants": "kvspec.mutants/1",
    "exhaust": "kvspec.exhaust/1",
    "hitrate": "kvspec.hitrate/1",
    "mtp": "kvspec.mtp/1",
}

# The oldest release whose registration rule kvspec models (KVCacheManager
# takes scheduler_block_size from 0.23.0), and the newest whose capabilities
# kvspec has checked: a newer tree is still fuzzed, and says so.
OLDEST_SUPPORTED = "0.23.0"
NEWEST_VALIDATED = "0.34.0"


def release_key(version: str) -> tuple[int, ...]:
    """A final release number as a sortable tuple: "0.33.0" -> (0, 33, 0)."""
    return tuple(int(part) for part in version.split(".")[:3])


def versions() -> dict[str, str]:
    """kvspec's version and its solver's, fuzzer's and interpreter's."""
    import hypothesis
    import z3

    import kvspec

    return {
        "kvspec": kvspec.__version__,
        "z3": z3.get_version_string(),
        "hypothesis": hypothesis.__version__,
        "python": platform.python_version(),
    }
