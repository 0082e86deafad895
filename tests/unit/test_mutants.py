"""Mutation operators on synthetic coordinator sources (no vLLM needed).

The snippets below are written for these tests: they only mimic the *shape*
of the two forms of the registration rule (0.28-0.31: inside
``HybridKVCacheCoordinator.cache_blocks``; 0.32+: inside
``get_num_cacheable_tokens``), with their own local names, so the operators
are checked to key on structure and not on vLLM's spelling.  Each mutated
snippet is executed and compared with the model variant the operator claims
to re-introduce.
"""

from __future__ import annotations

import ast
import itertools
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvspec.model.arith import INT
from kvspec.model.spec import BoundaryInputs
from kvspec.model.variants import WRONG, Conformance, variant
from kvspec.model.errors import UsageError
from kvspec.subjects import provision
from kvspec.subjects.provision import is_checked_hash
from kvspec.subjects.mutation import (
    COORDINATOR_FILE,
    REGISTRATION_MUTANTS as MUTANTS,
    MutationError,
    MutationOperator,
    MutationTargetNotFound,
    make_mutant_tree,
    mutant,
)

BASE = '''
class KVCacheCoordinator:
    """Base coordinator: it trims re-prefillable tokens too, and operators
    must leave this copy of the arithmetic alone."""

    enable_partial_hash_hits = False

    def __init__(self, scheduler_block_size, hash_block_size, managers, num_prefill_lookahead=0):
        assert scheduler_block_size % hash_block_size == 0
        self.scheduler_block_size = scheduler_block_size
        self.num_reprefillable_tokens = max(0, num_prefill_lookahead - 1)
        self.single_type_managers = managers
'''

# 0.28-0.31 shape: the rule lives in the hybrid coordinator's cache_blocks.
SHAPE_CACHE_BLOCKS = BASE + '''
    def cache_blocks(self, request, num_computed_tokens):
        for m in self.single_type_managers:
            m.cache_blocks(request, max(0, num_computed_tokens - self.num_reprefillable_tokens))


class HybridKVCacheCoordinator(KVCacheCoordinator):
    def __init__(self, scheduler_block_size, hash_block_size, managers, num_prefill_lookahead=0, partial=False):
        super().__init__(scheduler_block_size, hash_block_size, managers, num_prefill_lookahead)
        self.hash_block_size = hash_block_size
        self.enable_partial_hash_hits = partial

    def _align_cacheable(self, n):
        """Identity under partial hits, else down to a scheduler block."""
        if self.enable_partial_hash_hits:
            return n
        return n - n % self.scheduler_block_size

    def cache_blocks(self, request, num_computed_tokens):
        boundary = self._align_cacheable(num_computed_tokens)
        for mgr in self.single_type_managers:
            todo = boundary
            # lookahead block for EAGLE groups
            if mgr.use_eagle and boundary > 0:
                final = max(
                    0, num_computed_tokens - self.num_reprefillable_tokens
                )
                final_boundary = self._align_cacheable(
                    final
                )
                todo = min(
                    final,
                    final_boundary + mgr.block_size,
                )
            mgr.cache_blocks(request, todo, retention=0)
'''

# 0.32+ shape: a per-group get_num_cacheable_tokens with an early EAGLE
# return; a non-ASCII local checks that spans are computed in bytes.
SHAPE_GET_NUM_CACHEABLE = BASE + '''
    def get_num_cacheable_tokens(self, num_computed_tokens, group):
        return max(0, num_computed_tokens - self.num_reprefillable_tokens)

    def cache_blocks(self, request, num_computed_tokens):
        for gid, m in enumerate(self.single_type_managers):
            m.cache_blocks(request, self.get_num_cacheable_tokens(num_computed_tokens, gid))


class HybridKVCacheCoordinator(KVCacheCoordinator):
    def __init__(self, scheduler_block_size, hash_block_size, managers, num_prefill_lookahead=0, partial=False):
        super().__init__(scheduler_block_size, hash_block_size, managers, num_prefill_lookahead)
        self.hash_block_size = hash_block_size
        self.enable_partial_hash_hits = partial

    def _align_cacheable(self, tokens):
        if self.enable_partial_hash_hits:
            return tokens
        return tokens // self.scheduler_block_size * self.scheduler_block_size

    def get_num_cacheable_tokens(self, num_computed_tokens, group):
        aligned = self._align_cacheable(num_computed_tokens)
        m = self.single_type_managers[group]
        if m.use_eagle and aligned > 0:
            finalisé = max(0, num_computed_tokens - self.num_reprefillable_tokens)
            return min(
                finalisé,
                self._align_cacheable(finalisé)
                + m.block_size,
            )
        return aligned
'''

# 0.26-0.27 shape: partial hits but no finalized tokens and no helper.
SHAPE_PRE_028 = '''
class KVCacheCoordinator:
    def __init__(self, scheduler_block_size):
        self.scheduler_block_size = scheduler_block_size


class HybridKVCacheCoordinator(KVCacheCoordinator):
    def cache_blocks(self, request, num_computed_tokens):
        if self.enable_partial_hash_hits:
            boundary = num_computed_tokens
        else:
            boundary = num_computed_tokens // self.scheduler_block_size * self.scheduler_block_size
        for mgr in self.single_type_managers:
            todo = boundary
            if mgr.use_eagle and boundary > 0:
                todo = min(num_computed_tokens, boundary + mgr.block_size)
            mgr.cache_blocks(request, todo)
'''

SHAPES = {"cache_blocks": SHAPE_CACHE_BLOCKS, "get_num_cacheable_tokens": SHAPE_GET_NUM_CACHEABLE}


class _Manager:
    def __init__(self, block_size: int, use_eagle: bool):
        self.block_size = block_size
        self.use_eagle = use_eagle
        self.calls: list[int] = []

    def cache_blocks(self, request, num_tokens, **kwargs):
        self.calls.append(num_tokens)


def _edit(source: str, old: str, new: str) -> str:
    assert source.count(old) == 1, old
    return source.replace(old, new)


def _load(source: str):
    ns: dict = {}
    exec(compile(source, "<snippet>", "exec"), ns)
    return ns["HybridKVCacheCoordinator"]


def _registered(coordinator_cls, S, H, L, partial, groups, n) -> list[int]:
    managers = [_Manager(B, eagle) for B, eagle in groups]
    coord = coordinator_cls(S, H, managers, num_prefill_lookahead=L, partial=partial)
    coord.cache_blocks(SimpleNamespace(), n)
    assert all(len(m.calls) == 1 for m in managers)
    return [m.calls[0] for m in managers]


def _grid():
    for S in (4, 8):
        for H in [h for h in (1, 2, 4) if S % h == 0]:
            for B in [b for b in (1, 2, 4, 8) if S % b == 0 and b % H == 0]:
                for L, eagle, partial in itertools.product(range(S + 1), (False, True), (False, True)):
                    for n in range(2 * S + 3):
                        yield BoundaryInputs(n=n, S=S, H=H, B=B, L=L, eagle=eagle, partial=partial)


def _mismatches(source: str, variant_name: str) -> list[tuple]:
    cls = _load(source)
    rule = variant(variant_name).rule
    bad = []
    for p in _grid():
        got = _registered(cls, p.S, p.H, p.L, p.partial, [(p.B, p.eagle)], p.n)[0]
        want = rule(INT, p)
        if got != want:
            bad.append((p, got, want))
    return bad


def test_catalog_shape():
    names = [op.name for op in MUTANTS]
    assert names[0] == "refloor_50062"
    assert len(names) >= 7 and len(set(names)) == len(names)
    wrong = {v.name for v in WRONG}
    for op in MUTANTS:
        assert isinstance(op, MutationOperator)
        # Each operator models a wrong variant, or a correct one (an equivalent mutant).
        assert op.models_variant in wrong or variant(op.models_variant).conformance is Conformance.CORRECT, op.name
        assert op.summary and "\n" not in op.summary
        assert op.target_file == COORDINATOR_FILE
    assert mutant("refloor_50062").models_variant == "regression_50062"
    for required in ("lookahead_dropped", "finalized_ignored", "eagle_guard_always",
                     "reprefillable_off_by_one", "floor_non_eagle_under_partial",
                     "missing_clamp_at_zero", "lookahead_unclamped",
                     "lookahead_scheduler_block", "round_to_hash_block"):
        assert mutant(required).models_variant == required


def test_unknown_mutant_lists_names():
    with pytest.raises(UsageError, match="refloor_50062"):
        mutant("no_such_operator")


@pytest.mark.parametrize("shape", SHAPES)
def test_snippets_are_the_fix(shape):
    assert _mismatches(SHAPES[shape], "fix_52419") == []


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op", MUTANTS, ids=lambda op: op.name)
def test_operator_rewrites_and_models_its_variant(op, shape):
    source = SHAPES[shape]
    out = op.apply(source)
    assert out != source
    ast.parse(out)
    # The base class's own trimming arithmetic is untouched by rule operators.
    if op.name != "reprefillable_off_by_one":
        base = lambda s: s.split("class HybridKVCacheCoordinator")[0]  # noqa: E731
        assert base(out) == base(source)
    assert _mismatches(out, op.models_variant) == []
    # A wrong variant's mutant differs from the fix on this grid; an equivalent one never does.
    if variant(op.models_variant).conformance is Conformance.WRONG:
        assert _mismatches(out, "fix_52419") != []
    else:
        assert _mismatches(out, "fix_52419") == []


@pytest.mark.parametrize("shape", SHAPES)
def test_refloor_gives_the_regression_numbers(shape):
    # Full attention (block 2, EAGLE) + Mamba align (block 8), H=2, S=8, 22 tokens.
    geometry = dict(S=8, H=2, L=0, partial=True, groups=[(2, True), (8, False)], n=22)
    assert _registered(_load(SHAPES[shape]), **geometry) == [22, 22]
    mutated = mutant("refloor_50062").apply(SHAPES[shape])
    assert _registered(_load(mutated), **geometry) == [18, 22]


@pytest.mark.parametrize("op", MUTANTS, ids=lambda op: op.name)
def test_pre_028_shape_is_refused(op):
    with pytest.raises(MutationTargetNotFound) as info:
        op.apply(SHAPE_PRE_028)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{op.name}: {COORDINATOR_FILE}: ")


@pytest.mark.parametrize("op", MUTANTS, ids=lambda op: op.name)
@pytest.mark.parametrize(
    "source",
    [
        "x = 1\n",  # no coordinator at all
        _edit(SHAPE_CACHE_BLOCKS, "class HybridKVCacheCoordinator", "class OtherCoordinator"),
        "def broken(:\n",  # does not parse
        # ambiguous: the EAGLE branch appears twice
        _edit(
            SHAPE_CACHE_BLOCKS,
            "            mgr.cache_blocks(request, todo, retention=0)",
            "            if mgr.use_eagle and boundary > 0:\n"
            "                pass\n"
            "            mgr.cache_blocks(request, todo, retention=0)",
        ),
    ],
    ids=["no-coordinator", "no-hybrid-class", "syntax-error", "ambiguous-eagle-branch"],
)
def test_missing_or_ambiguous_target_is_refused(op, source):
    with pytest.raises(MutationTargetNotFound, match=rf"^{op.name}: "):
        op.apply(source)


def test_duplicate_finalized_computation_is_refused():
    twice = _edit(
        SHAPE_CACHE_BLOCKS,
        "                final_boundary = self._align_cacheable(",
        "                again = max(0, num_computed_tokens - self.num_reprefillable_tokens)\n"
        "                final_boundary = self._align_cacheable(",
    )
    with pytest.raises(MutationTargetNotFound, match="exactly one finalized tokens"):
        mutant("missing_clamp_at_zero").apply(twice)


def test_reprefillable_operator_needs_its_target():
    source = _edit(
        SHAPE_GET_NUM_CACHEABLE, "max(0, num_prefill_lookahead - 1)", "max(0, num_prefill_lookahead)"
    )
    with pytest.raises(MutationTargetNotFound, match="num_prefill_lookahead - 1"):
        mutant("reprefillable_off_by_one").apply(source)
    # The other operators do not depend on that line.
    mutant("refloor_50062").apply(source)


def test_round_to_hash_block_needs_the_attribute():
    source = _edit(SHAPE_CACHE_BLOCKS, "self.hash_block_size = hash_block_size", "pass")
    with pytest.raises(MutationTargetNotFound, match="hash_block_size"):
        mutant("round_to_hash_block").apply(source)


def _release(root, source: str):
    core = root / "vllm" / "v1" / "core"
    core.mkdir(parents=True)
    (root / "vllm" / "__init__.py").write_text("__version__ = 'synthetic'\n")
    (core / "kv_cache_coordinator.py").write_text(source, encoding="utf-8")
    cache = core / "__pycache__"
    cache.mkdir()
    (cache / "kv_cache_coordinator.cpython-311.pyc").write_bytes(b"stale")
    (root / "vllm" / "__pycache__").mkdir()
    (root / "vllm" / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"kept")
    return root


def test_make_mutant_tree(tmp_path, monkeypatch):
    # The runtime's interpreter compiles the mutated module; this one stands in for it.
    monkeypatch.setattr(provision, "ensure_runtime", lambda progress=None: Path(sys.executable))
    release = _release(tmp_path / "release", SHAPE_GET_NUM_CACHEABLE)
    op = mutant("refloor_50062")
    dest = make_mutant_tree(release, op, tmp_path / "mutant")
    assert dest == tmp_path / "mutant"
    mutated = (dest / COORDINATOR_FILE).read_text(encoding="utf-8")
    assert mutated == op.apply(SHAPE_GET_NUM_CACHEABLE) != SHAPE_GET_NUM_CACHEABLE
    assert (release / COORDINATOR_FILE).read_text(encoding="utf-8") == SHAPE_GET_NUM_CACHEABLE
    assert (dest / "vllm" / "__init__.py").read_text() == "__version__ = 'synthetic'\n"
    # The mutated module's bytecode is kvspec's own compile of the mutation
    # (the release's would run instead of it); bytecode Python would import
    # unchecked goes (provision.byte_compile).
    (pyc,) = dest.rglob("kv_cache_coordinator.*.pyc")
    assert is_checked_hash(pyc) and pyc.read_bytes() != b"stale"
    assert not (dest / "vllm" / "__pycache__" / "__init__.cpython-311.pyc").exists()
    marker = json.loads((dest / "MUTANT.json").read_text())
    assert marker["operator"] == "refloor_50062"
    assert marker["models_variant"] == "regression_50062"
    assert marker["source_root"] == str(release.resolve())
    assert marker["target_file"] == COORDINATOR_FILE


def test_make_mutant_tree_refuses_before_copying(tmp_path):
    release = _release(tmp_path / "release", SHAPE_PRE_028)
    with pytest.raises(MutationTargetNotFound):
        make_mutant_tree(release, mutant("lookahead_dropped"), tmp_path / "mutant")
    assert not (tmp_path / "mutant").exists()
    with pytest.raises(MutationTargetNotFound, match="no such file"):
        make_mutant_tree(tmp_path / "empty", mutant("lookahead_dropped"), tmp_path / "m2")


def test_make_mutant_tree_will_not_overwrite(tmp_path):
    release = _release(tmp_path / "release", SHAPE_CACHE_BLOCKS)
    (tmp_path / "mutant").mkdir()
    (tmp_path / "mutant" / "keep").write_text("x")
    with pytest.raises(FileExistsError):
        make_mutant_tree(release, mutant("refloor_50062"), tmp_path / "mutant")


def test_a_rewrite_that_escapes_its_method_is_an_error():
    # An operator whose rewrite touches code outside its method must fail.
    def rogue(src):
        tree_node = next(n for n in ast.walk(src.tree) if isinstance(n, ast.Constant) and n.value == 1)
        return "HybridKVCacheCoordinator.cache_blocks", [src.replace(tree_node, "2")]

    op = MutationOperator("rogue", "test only", "lookahead_dropped", rogue)
    with pytest.raises(MutationError, match="expected a change in HybridKVCacheCoordinator.cache_blocks only"):
        op.apply(SHAPE_CACHE_BLOCKS)


_POOL_SOURCE = '''
class BlockPool:
    def get_new_blocks(self, num_blocks):
        ret = self.free_block_queue.popleft_n(num_blocks)
        for block in ret:
            block.ref_cnt = 1
        return ret

    def touch(self, blocks):
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks):
        last = []
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                last.append(block)
        self.free_block_queue.append_n(last)

    def get_cached_block(self, block_hash, kv_cache_group_ids):
        cached_blocks = []
        for group_id in kv_cache_group_ids:
            block = self.cached_block_hash_to_block.get_one_block((block_hash, group_id))
            if not block:
                return None
            cached_blocks.append(block)
        return cached_blocks

    def reset_prefix_cache(self):
        num_used_blocks = self.num_gpu_blocks - self.get_num_free_blocks()
        if num_used_blocks != 1:
            return False
        self.cached_block_hash_to_block.clear()
        return True
'''


@pytest.mark.parametrize("name, removed, added", [
    ("touch_keeps_free_block", "self.free_block_queue.remove(block)", None),
    ("free_leaks_cached_blocks", "self.free_block_queue.append_n(last)", None),
    ("free_cached_to_head", "self.free_block_queue.append_n(last)", "self.free_block_queue.prepend_n(last)"),
    ("reset_ignores_held_blocks", "if num_used_blocks != 1:", "if False:"),
    ("new_block_double_ref", "block.ref_cnt = 1", "block.ref_cnt = 2"),
    ("free_cached_block_misses", "if not block:", "if not block or block.ref_cnt == 0:"),
    ("allocate_from_queue_tail", "self.free_block_queue.popleft_n(num_blocks)",
     "for b in self.free_block_queue.get_all_free_blocks()[::-1][:num_blocks]]"),
])
def test_state_operators_rewrite_the_block_pool(name, removed, added):
    from kvspec.subjects.mutation import STATE_MUTANTS

    op = {o.name: o for o in STATE_MUTANTS}[name]
    out = op.apply(_POOL_SOURCE)
    assert removed not in out and (added is None or added in out)
    assert op.side == "state" and op.target_file.endswith(".py")


_MANAGER_SOURCE = '''
class SingleTypeKVCacheManager:
    def add_local_computed_blocks(self, request_id, new_computed_blocks):
        req_blocks = self.req_to_blocks[request_id]
        if self.enable_caching:
            self.block_pool.touch(new_computed_blocks)
        req_blocks.extend(new_computed_blocks)

    def free(self, request_id):
        self.block_pool.free_blocks(reversed(self.pop_blocks_for_free(request_id)))

    def take_new_block_ids(self):
        ids = self.new_block_ids
        self.new_block_ids = []
        return ids

    def _remove_blocks_in_range(self, request_id, first_block, last_block):
        blocks = self.req_to_blocks[request_id]
        freed = []
        for i in range(last_block - 1, first_block - 1, -1):
            if blocks[i] == self._null_block:
                break
            freed.append(blocks[i])
            blocks[i] = self._null_block
        self.block_pool.free_blocks(freed)

    def allocate_new_blocks(self, request_id, num_tokens):
        req_blocks = self.req_to_blocks[request_id]
        num_required_blocks = cdiv(num_tokens, self.block_size)
        num_new_blocks = num_required_blocks - len(req_blocks)
        if num_new_blocks <= 0:
            return []
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        req_blocks.extend(new_blocks)
        return new_blocks


class FullAttentionManager(SingleTypeKVCacheManager):
    @classmethod
    def find_longest_cache_hit(cls, block_hashes, block_size, block_pool, kv_cache_group_ids, drop):
        computed_blocks = tuple([] for _ in kv_cache_group_ids)
        for block_hash in block_hashes:
            if not (cached_block := block_pool.get_cached_block(block_hash, kv_cache_group_ids)):
                break
            for computed, cached in zip(computed_blocks, cached_block):
                computed.append(cached)
        hit_length = len(computed_blocks[0]) * block_size
        if drop and hit_length > 0:
            hit_length -= block_size
        num_blocks = cdiv(hit_length, block_size)
        for computed in computed_blocks:
            del computed[num_blocks:]
        return computed_blocks, hit_length


class SlidingWindowManager(SingleTypeKVCacheManager):
    def get_num_skipped_tokens(self, num_computed_tokens):
        return max(0, num_computed_tokens - self.sliding_window + 1)


class MambaManager(SingleTypeKVCacheManager):
    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, block_pool):
        computed_blocks = tuple([] for _ in kv_cache_group_ids)
        for i in range(len(block_hashes) - 1, -1, -1):
            if cached_block := block_pool.get_cached_block(block_hashes[i], kv_cache_group_ids):
                for computed, cached in zip(computed_blocks, cached_block):
                    computed.extend([block_pool.null_block] * i)
                    computed.append(cached)
                break
        return computed_blocks

    def allocate_new_blocks(self, request_id, num_tokens, num_tokens_main_model):
        req_blocks = self.req_to_blocks[request_id]
        prev_block_len = len(req_blocks)
        num_skipped_blocks = cdiv(num_tokens_main_model, self.block_size) - 1
        if prev_block_len < num_skipped_blocks:
            req_blocks.extend([self._null_block for _ in range(prev_block_len, num_skipped_blocks)])
        for block_idx in range(prev_block_len, len(req_blocks)):
            pass
        return self.block_pool.get_new_blocks(cdiv(num_tokens_main_model, self.block_size) - len(req_blocks))
'''


@pytest.mark.parametrize("name, removed, added", [
    ("local_hit_untouched", "self.block_pool.touch(new_computed_blocks)", None),
    ("allocate_floors_partial_block", "cdiv(num_tokens, self.block_size)", "num_tokens // self.block_size"),
    ("mamba_hit_unpadded", "computed.extend([block_pool.null_block] * i)", None),
    ("hit_keeps_trimmed_blocks", "del computed[num_blocks:]", None),
    ("free_head_first", "free_blocks(reversed(self.pop_blocks_for_free(request_id)))",
     "free_blocks(self.pop_blocks_for_free(request_id))"),
    ("window_frees_early", "max(0, num_computed_tokens - self.sliding_window + 1)",
     "max(0, (num_computed_tokens - self.sliding_window + 1) + self.block_size)"),
    ("mamba_state_slot_nulled", "range(prev_block_len, num_skipped_blocks)",
     "range(prev_block_len, num_skipped_blocks + 1)"),
    ("zeroing_ids_undrained", "self.new_block_ids = []", None),
    ("skipped_slots_deleted", "blocks[i] = self._null_block", "del blocks[i]"),
])
def test_state_operators_rewrite_the_managers(name, removed, added):
    from kvspec.subjects.mutation import STATE_MUTANTS

    op = {o.name: o for o in STATE_MUTANTS}[name]
    out = op.apply(_MANAGER_SOURCE)
    assert removed in _MANAGER_SOURCE and removed not in out
    assert added is None or added in out
    assert op.side == "state" and op.target_file.endswith("single_type_kv_cache_manager.py")


# The lookup and zeroing operators' targets, in 0.34's shape (written for these tests).
_LOOKUP_SOURCE = '''
class KVCacheManager:
    def get_computed_blocks(self, request, max_cache_hit_length=None):
        computed_blocks, num_new_computed_tokens, num_uncached = self.coordinator.find_longest_cache_hit(
            request.block_hashes, request.num_tokens - 1)
        blocks = self.create_kv_cache_blocks(computed_blocks)
        return blocks, num_new_computed_tokens, 0


class UnitaryKVCacheCoordinator:
    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        hit_blocks, hit_length = self.single_type_managers[0].find_longest_cache_hit(
            block_hashes=block_hashes,
            max_length=max_cache_hit_length,
            drop_eagle_block=0 in self.drop_eagle_group_ids,
            alignment_tokens=self.block_size,
        )
        return hit_blocks, hit_length, 0


class SingleTypeKVCacheManager:
    def allocate_new_blocks(self, request_id, num_tokens, num_tokens_main_model):
        req_blocks = self.req_to_blocks[request_id]
        num_new_blocks = cdiv(num_tokens, self.block_size) - len(req_blocks)
        if num_new_blocks <= 0:
            return []
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        req_blocks.extend(new_blocks)
        if self._record_new_block_ids:
            self.new_block_ids.extend(b.block_id for b in new_blocks)
        return new_blocks


class FullAttentionManager(SingleTypeKVCacheManager):
    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, block_pool, block_size):
        computed_blocks = tuple([] for _ in kv_cache_group_ids)
        for block_hash in itertools.islice(block_hashes, max_length // block_size):
            if not (cached_block := block_pool.get_cached_block(block_hash, kv_cache_group_ids)):
                break
            for computed, cached in zip(computed_blocks, cached_block):
                computed.append(cached)
        return computed_blocks, len(computed_blocks[0]) * block_size
'''


@pytest.mark.parametrize("name, removed, added", [
    ("lookup_touches_hit", None, "        for group_blocks in computed_blocks:\n"
                                 "            self.block_pool.touch(group_blocks)\n        return blocks"),
    ("unitary_hit_limit_decremented", "max_length=max_cache_hit_length,",
     "max_length=max(0, max_cache_hit_length - 1),"),
    ("lookup_counts_partial_block", "islice(block_hashes, max_length // block_size)",
     "islice(block_hashes, cdiv(max_length, block_size))"),
    ("zeroing_ids_overwritten", "self.new_block_ids.extend(b.block_id for b in new_blocks)",
     "self.new_block_ids = [b.block_id for b in new_blocks]"),
])
def test_state_operators_rewrite_the_lookup_and_zeroing(name, removed, added):
    from kvspec.subjects.mutation import STATE_MUTANTS

    op = {o.name: o for o in STATE_MUTANTS}[name]
    out = op.apply(_LOOKUP_SOURCE)
    assert removed is None or (removed in _LOOKUP_SOURCE and removed not in out)
    assert added in out and added not in _LOOKUP_SOURCE
    assert op.side == "state"


def test_the_lookup_operator_takes_a_reference_on_each_hit_block_at_the_lookup():
    # Executed: the mutated lookup touches every group's hit blocks once, the
    # release's touches none (allocate_slots does, later).
    from kvspec.subjects.mutation import mutant

    touched = []
    hit = ([1, 2], [3])
    manager = SimpleNamespace(
        coordinator=SimpleNamespace(find_longest_cache_hit=lambda hashes, limit: (hit, 32, 0)),
        create_kv_cache_blocks=lambda blocks: blocks, block_pool=SimpleNamespace(touch=touched.extend))
    request = SimpleNamespace(block_hashes=[], num_tokens=40)
    for source, want in ((_LOOKUP_SOURCE, []), (mutant("lookup_touches_hit").apply(_LOOKUP_SOURCE), [1, 2, 3])):
        ns = {}
        exec(compile(source, "<snippet>", "exec"), ns)
        touched.clear()
        assert ns["KVCacheManager"].get_computed_blocks(manager, request) == (hit, 32, 0)
        assert touched == want


def test_the_hit_blocks_operator_finds_the_method_of_older_releases():
    # Before 0.26 the method that takes a hit's blocks is allocate_new_computed_blocks.
    from kvspec.subjects.mutation import STATE_MUTANTS

    op = {o.name: o for o in STATE_MUTANTS}["local_hit_untouched"]
    older = _MANAGER_SOURCE.replace("def add_local_computed_blocks", "def allocate_new_computed_blocks")
    assert op.mutated_method(older) == "SingleTypeKVCacheManager.allocate_new_computed_blocks"
    assert "self.block_pool.touch(" not in op.apply(older)


def test_state_operators_refuse_a_source_without_their_target():
    from kvspec.subjects.mutation import STATE_MUTANTS

    for op in STATE_MUTANTS:
        with pytest.raises(MutationTargetNotFound):
            op.apply("class BlockPool:\n    def touch(self, blocks):\n        pass\n")


def test_a_kill_matrix_row_is_typed_and_serialises_to_the_rows_of_kvspec_mutants_1():
    from kvspec.report.mutants import KillRow, render_matrix
    from kvspec.usecases.mutants import MutantRow

    operator = mutant("refloor_50062")
    inapplicable = MutantRow(operator, "non-equivalent", not_run="not applicable", error="no such code")
    assert inapplicable.status == "not applicable" and inapplicable.as_dict() == {
        "mutant": "refloor_50062", "models_variant": operator.models_variant, "summary": operator.summary,
        "side": operator.side, "model": "non-equivalent", "status": "not applicable", "error": "no such code"}
    survived = SimpleNamespace(failure=None, cases_to_first_failure=None, seconds_to_first_failure=None, cases=900)
    row = MutantRow(operator, "equivalent", fuzz=survived,
                    swept={"failing_cases": 0, "cases": 412, "seconds": 9.5}, wall_seconds=3.25)
    assert row.status == "equivalent"
    data = row.as_dict()
    assert (data["fuzz"], data["stateful"], data["exhaustive"], data["exhaustive_failing"]) == (
        "equivalent", "not run", "equivalent", "0/412")
    assert "symbolic" not in data and data["wall_seconds"] == 3.25 and data["differential"] == "registration"
    assert "refloor_50062" in render_matrix([KillRow.parse(data), KillRow.parse(inapplicable.as_dict())])
