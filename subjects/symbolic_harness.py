"""Symbolic conformance of vLLM's own registration code (runs in a vLLM runtime).

Started by ``subjects/symbolic.py`` as ``python -I symbolic_harness.py
OPTIONS_JSON``; the options name the folders that hold kvspec's packages
(``kvspec_paths``: the harness imports ``kvspec.model``, ``kvspec.proofs`` and
the worker's introspection from them) and the subject tree comes in
``KVSPEC_SUBJECT_TREE``, as for the worker.  vLLM is imported normally first
(CrossHair forbids side effects during analysis), then CrossHair executes
``real`` and ``spec`` on symbolic unbounded integers and booleans and looks
for an input where they differ.

``real`` calls vLLM's unmodified ``HybridKVCacheCoordinator.get_num_cacheable_tokens``
on an instance made without its constructor: the attributes the method reads
are set directly, and the group manager is a stand-in holding ``use_eagle``
and ``block_size``.  ``spec`` is kvspec's ``registration_bound`` on the integer
backend.  Both return -1 outside the well-formed geometry (the proofs' own
``well_formed``) and outside the release's era (``Capabilities``), so only
admissible inputs can differ.  One JSON line on stdout is the answer.
"""

import json
import os
import sys
import time
import types
from collections import Counter

OPTIONS = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
# kvspec's packages, without installing kvspec into the runtime: a namespace
# whose path holds the folders of kvspec.model, kvspec.proofs, kvspec.subjects.
_namespace = types.ModuleType("kvspec")
_namespace.__path__ = list(OPTIONS.get("kvspec_paths", ()))
sys.modules["kvspec"] = _namespace

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

from kvspec.subjects.worker import use_subject_tree  # noqa: E402
from kvspec.subjects.vllm_side.introspection import introspect  # noqa: E402

use_subject_tree()

from vllm.v1.core import kv_cache_coordinator  # noqa: E402  (before any analysis)

from kvspec.model.arith import INT  # noqa: E402
from kvspec.model.capabilities import Capabilities  # noqa: E402
from kvspec.model.spec import BoundaryInputs, registration_bound  # noqa: E402
from kvspec.proofs.encoding import Vars, well_formed  # noqa: E402

TARGET = "HybridKVCacheCoordinator.get_num_cacheable_tokens"
ABSTRACTED = (
    "HybridKVCacheCoordinator.__init__ is not run: the instance is made with object.__new__ and "
    "given enable_partial_hash_hits = partial, scheduler_block_size = S, hash_block_size = H, "
    "num_reprefillable_tokens = max(0, L - 1)",
    "single_type_managers = [a stand-in group manager with use_eagle = eagle, block_size = B]",
    "inputs restricted to the proofs' well_formed geometry (both sides return -1 elsewhere)",
)


class GroupManagerStandIn:
    """What get_num_cacheable_tokens reads of a group manager, and nothing else."""

    def __init__(self, use_eagle, block_size):
        self.use_eagle = use_eagle
        self.block_size = block_size


# The release's era, found by the worker's introspection in main(): inputs it
# cannot express (partial hash hits before 0.26, reprefillable tokens before
# 0.28) are excluded.
ERA = Capabilities()


def _well_formed(n, S, H, B, L, eagle, partial):
    if H < 1 or B < 1:
        return False
    if partial and not ERA.partial_hash_hits:
        return False
    if L > 1 and not ERA.reprefillable_tokens:
        return False
    v = Vars(n=n, t=n, S=S, H=H, B=B, L=L, m=B // H, k=S // B, E=eagle, P=partial)
    return bool(well_formed(INT, v))


class RecordingGroupManager(GroupManagerStandIn):
    """For releases whose rule is inline in cache_blocks: records the bound it receives."""

    enable_caching = True
    received = None

    def cache_blocks(self, request, num_tokens, *args, **kwargs):
        self.received = num_tokens


class RequestStandIn:
    def __init__(self, n):
        self.num_prompt_tokens = n
        self.num_tokens = n


def _coordinator(S, H, L, partial, manager):
    coordinator = object.__new__(kv_cache_coordinator.HybridKVCacheCoordinator)
    coordinator.enable_partial_hash_hits = partial
    coordinator.scheduler_block_size = S
    coordinator.hash_block_size = H
    coordinator.num_reprefillable_tokens = max(0, L - 1)
    coordinator.retention_interval = None
    coordinator.single_type_managers = [manager]
    return coordinator


def real(n: int, S: int, H: int, B: int, L: int, eagle: bool, partial: bool) -> int:
    if not _well_formed(n, S, H, B, L, eagle, partial):
        return -1
    coordinator = _coordinator(S, H, L, partial, GroupManagerStandIn(eagle, B))
    return coordinator.get_num_cacheable_tokens(n, 0)


def real_cache_blocks(n: int, S: int, H: int, B: int, L: int, eagle: bool, partial: bool) -> int:
    if not _well_formed(n, S, H, B, L, eagle, partial):
        return -1
    manager = RecordingGroupManager(eagle, B)
    _coordinator(S, H, L, partial, manager).cache_blocks(RequestStandIn(n), n)
    return manager.received


def spec(n: int, S: int, H: int, B: int, L: int, eagle: bool, partial: bool) -> int:
    if not _well_formed(n, S, H, B, L, eagle, partial):
        return -1
    return registration_bound(INT, BoundaryInputs(n, S, H, B, L, eagle, partial))


def main():
    global ERA
    options = OPTIONS
    hybrid = getattr(kv_cache_coordinator, "HybridKVCacheCoordinator", None)
    if hybrid is None or not hasattr(hybrid, "cache_blocks"):
        print(json.dumps({"status": "UNSUPPORTED", "target": "",
                          "reason": "this vLLM has no HybridKVCacheCoordinator.cache_blocks for the "
                                    "symbolic harness to drive"}))
        return 0
    found = introspect()
    ERA = Capabilities.from_dict(found)
    era = list(ERA.era_restrictions())
    if hasattr(hybrid, "get_num_cacheable_tokens"):
        target, subject, abstracted = TARGET, real, ABSTRACTED
    else:  # 0.23-0.31: the rule is inline in cache_blocks
        target, subject = "HybridKVCacheCoordinator.cache_blocks", real_cache_blocks
        abstracted = ABSTRACTED[:1] + (
            "single_type_managers = [a recording stand-in: use_eagle = eagle, block_size = B, "
            "enable_caching; its cache_blocks records the bound it receives], retention_interval = "
            "None, the request a stand-in",) + ABSTRACTED[2:]
    if era:
        abstracted = abstracted + ("inputs restricted to the release's era: " + "; ".join(era),)
    from crosshair.core_and_libs import standalone_statespace  # noqa: F401  (registers the libraries)
    from crosshair.diff_behavior import diff_behavior
    from crosshair.fnutil import FunctionInfo
    from crosshair.options import DEFAULT_OPTIONS, AnalysisOptionSet

    analysis = DEFAULT_OPTIONS.overlay(AnalysisOptionSet(
        per_condition_timeout=float(options.get("timeout", 60.0)),
        per_path_timeout=float(options.get("per_path_timeout", 10.0))))
    analysis.stats = Counter()
    started = time.perf_counter()
    diffs = diff_behavior(FunctionInfo.from_fn(subject), FunctionInfo.from_fn(spec), analysis)
    seconds = time.perf_counter() - started
    if isinstance(diffs, str):
        print(json.dumps({"status": "ERROR", "target": target, "reason": diffs}))
        return 0
    out = []
    for d in diffs:
        out.append({"args": {k: _value(v) for k, v in d.args.items()},
                    "real": d.result1.describe(set()), "spec": d.result2.describe(set())})
    print(json.dumps({
        "status": "DIFFERS" if out else "NO_DIFFERENCE",
        # CrossHair runs both orderings; "exhausted" means every path of both was explored.
        "exhausted": analysis.stats["exhaustion"] >= 2,
        "paths": analysis.stats["num_paths"],
        "seconds": round(seconds, 3),
        "target": target,
        "abstracted": list(abstracted),
        "capabilities": ERA.as_dict(),
        "vllm_version": found.get("vllm_version"),
        "diffs": out,
    }))
    return 0


def _value(text):
    """CrossHair reports arguments as repr strings: back to ints and bools."""
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        return text


if __name__ == "__main__":
    sys.exit(main())
