"""The fuzzing scope of real deployments and the hash schemes it draws."""

from __future__ import annotations

from hypothesis import Phase, given, seed, settings

from kvspec.diff_tests.strategies import batches, deployment_configs, hash_schemes_of
from kvspec.model.domain import GroupKind, HashScheme

from tests.support import capabilities


def test_hash_schemes_per_release_and_narrowing():
    assert hash_schemes_of(capabilities("0.28.0")) == ("legacy",)
    assert hash_schemes_of(capabilities("0.33.0")) == ("legacy", "lookahead")
    assert hash_schemes_of(capabilities("0.33.0"), ("lookahead",)) == ("lookahead",)
    assert hash_schemes_of(capabilities("0.28.0"), ("lookahead",)) == ()


def test_deployment_configurations_have_real_sizes():
    configs = deployment_configs("0.33.0", ("legacy", "lookahead"))
    assert len(configs) >= 10
    assert max(c.scheduler_block_size for c in configs) >= 1000
    assert {c.hash_scheme for c in configs} == {HashScheme.LEGACY, HashScheme.LOOKAHEAD}
    assert all(c.dcp_world_size == 1 for c in configs)  # DCP > 1 is not driven (said in not_covered)
    # The EAGLE branch is live only under legacy hashes.
    assert all(not c.eagle_drop for c in configs if c.hash_scheme is HashScheme.LOOKAHEAD)
    assert any(c.eagle_drop for c in configs if c.hash_scheme is HashScheme.LEGACY)
    assert deployment_configs("0.27.1", ("legacy",)) == ()
    assert deployment_configs("0.35.0.dev12+g1234", ("legacy",))  # a tree: the newest era


def test_batches_draw_both_scopes_and_both_schemes():
    configs = deployment_configs("0.33.0", ("legacy", "lookahead"))
    seen = {"deployment": 0, "small": 0, "lookahead": 0, "long_prompt": 0}

    @settings(max_examples=60, database=None, phases=[Phase.generate], deadline=None)
    @seed(7)
    @given(batch=batches(capabilities("0.33.0"), deployments=configs))
    def record(batch):
        seen[batch.scope] += 1
        seen["lookahead"] += batch[0].config.hash_scheme is HashScheme.LOOKAHEAD
        seen["long_prompt"] += any(c.prompt_len > 512 for c in batch)

    record()
    assert seen["deployment"] and seen["small"] and seen["lookahead"] and seen["long_prompt"]


def test_a_known_bugs_configurations_are_drawn_as_any_other():
    """Nothing is kept out of the draw: the sliding-window EAGLE crash's
    layouts (an EAGLE sliding-window group, no full attention, lookahead
    hashes of 2+ tokens) are drawn under lookahead hashes on 0.33.0; a run
    that meets the crash recognises it (model.known) and searches on."""
    met = []

    @settings(max_examples=400, database=None, phases=[Phase.generate])
    @seed(0)
    @given(batch=batches(capabilities("0.33.0")))
    def record(batch):
        config = batch[0].config
        if (config.hash_scheme is HashScheme.LOOKAHEAD and config.num_hash_lookahead_tokens >= 2
                and not any(g.kind is GroupKind.FULL_ATTENTION for g in config.groups)
                and any(g.kind is GroupKind.SLIDING_WINDOW and g.eagle for g in config.groups)):
            met.append(config)

    record()
    assert met
