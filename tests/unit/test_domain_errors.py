"""Bad configurations are rejected with the field, the rule and the value."""

import pytest

from kvspec.model.domain import CoordinatorConfig, GroupKind, InvalidGeometry, KVCacheGroup

FA, MAMBA = GroupKind.FULL_ATTENTION, GroupKind.MAMBA_ALIGN


def config(**changes):
    base = dict(groups=(KVCacheGroup(FA, 2, eagle=True), KVCacheGroup(MAMBA, 8)),
                scheduler_block_size=8, hash_block_size=2)
    base.update(changes)
    return CoordinatorConfig(**base)


@pytest.mark.parametrize(
    "changes, field, fragment",
    [
        (dict(scheduler_block_size=6, groups=(KVCacheGroup(FA, 2), KVCacheGroup(FA, 6)),
              hash_block_size=4), "scheduler_block_size", "multiple of hash_block_size"),
        (dict(groups=(KVCacheGroup(FA, 2), KVCacheGroup(MAMBA, 16))), "groups[1].block_size",
         "divide scheduler_block_size"),
        (dict(hash_block_size=4, groups=(KVCacheGroup(FA, 2), KVCacheGroup(MAMBA, 8))),
         "groups[0].block_size", "multiple of hash_block_size"),
        (dict(num_prefill_lookahead=9), "num_prefill_lookahead", "scheduler_block_size (=8) >="),
        (dict(groups=()), "groups", "at least one group"),
        (dict(scheduler_block_size=0), "scheduler_block_size", "positive integer"),
        (dict(dcp_world_size=0), "dcp_world_size", "positive integer"),
        (dict(num_prefill_lookahead=-1), "num_prefill_lookahead", "non-negative"),
    ],
)
def test_invalid_config(changes, field, fragment):
    with pytest.raises(InvalidGeometry) as info:
        config(**changes)
    assert info.value.field == field
    assert fragment in str(info.value)
    assert repr(info.value.value) in str(info.value)


def test_invalid_group_kind_names_choices():
    with pytest.raises(InvalidGeometry, match="must be one of full_attention"):
        KVCacheGroup("linear_attention", 4)


def test_sliding_window_needs_window():
    with pytest.raises(InvalidGeometry, match="sliding_window"):
        KVCacheGroup(GroupKind.SLIDING_WINDOW, 4)


def test_lookahead_guard_only_binds_with_eagle():
    ok = config(groups=(KVCacheGroup(FA, 2), KVCacheGroup(MAMBA, 8)), num_prefill_lookahead=9)
    assert ok.num_reprefillable_tokens == 8


@pytest.mark.parametrize(
    "groups, H, dcp, caching, expected",
    [
        ((KVCacheGroup(FA, 2), KVCacheGroup(MAMBA, 8)), 2, 1, True, True),
        ((KVCacheGroup(FA, 2), KVCacheGroup(MAMBA, 8)), 2, 1, False, False),
        ((KVCacheGroup(FA, 8), KVCacheGroup(MAMBA, 8)), 8, 1, True, False),  # Mamba block == H
        ((KVCacheGroup(FA, 8), KVCacheGroup(MAMBA, 8)), 8, 2, True, True),  # DCP accepts ==
        ((KVCacheGroup(FA, 2), KVCacheGroup(FA, 8)), 2, 1, True, False),  # no Mamba group
        ((KVCacheGroup(FA, 2), KVCacheGroup(MAMBA, 8),
          KVCacheGroup(GroupKind.SLIDING_WINDOW, 2, sliding_window=4)), 2, 1, True, True),
        ((KVCacheGroup(FA, 2), KVCacheGroup(MAMBA, 8),
          KVCacheGroup(GroupKind.SLIDING_WINDOW, 4, sliding_window=4)), 2, 1, True, False),
    ],
)
def test_partial_hash_hits_is_derived(groups, H, dcp, caching, expected):
    c = CoordinatorConfig(groups=groups, scheduler_block_size=8, hash_block_size=H,
                          dcp_world_size=dcp, enable_caching=caching)
    assert c.partial_hash_hits is expected


def test_one_group_is_a_configuration_but_never_a_registration_case():
    # vLLM serves one group with its unitary coordinator: the stateful
    # differential drives it, the registration boundary does not exist there.
    from kvspec.model.case import Case, InvalidCase, Step

    single = CoordinatorConfig((KVCacheGroup(FA, 4),), 4, 4)
    assert not single.hybrid and config().hybrid
    with pytest.raises(InvalidCase, match="at least two KV-cache groups"):
        Case(single, 4, (Step("prefill", tokens=4),))
