"""The deployment catalog and the model of vLLM's configuration code (no vLLM
here: tests/integration/test_deployments.py holds the model to each
release's own code)."""

from __future__ import annotations

import pytest

from kvspec.model.deployments import CATALOG, MODELS, derive, families, mamba_page_bytes, profile, schemes_for


def test_the_catalog_spans_real_families():
    assert len(CATALOG) >= 12 and len(families()) >= 6
    assert len({p.name for p in CATALOG}) == len(CATALOG)
    for p in CATALOG:
        assert p.model.sources, p.name
        for source in p.model.sources + (p.drafter.sources if p.drafter else ()):
            assert source.kind in ("config", "defaults", "recalled", "hypothetical") and source.where


@pytest.mark.parametrize("name, layers, kinds", [
    ("Qwen3-Next-80B-A3B-Instruct", 48, {"mamba": 36, "full": 12}),
    ("NVIDIA-Nemotron-Nano-9B-v2", 31, {"mamba": 27, "full": 4}),
    ("granite-4.0-h-small", 40, {"mamba": 36, "full": 4}),
    ("Falcon-H1-7B-Instruct", 88, {"mamba": 44, "full": 44}),
    ("AI21-Jamba-1.5-Mini", 32, {"mamba": 28, "full": 4}),
    ("gpt-oss-20b", 24, {"sliding:128": 12, "full": 12}),
    ("gemma-3-27b-it (text)", 62, {"sliding:1024": 52, "full": 10}),
])
def test_layer_layouts_read_from_the_published_fields(name, layers, kinds):
    from collections import Counter

    found = MODELS[name].layers()
    assert len(found) == layers and Counter(found) == kinds


@pytest.mark.parametrize("name, page", [
    # The research note's table (section 3), each checked there by hand against the formulas.
    ("Qwen3-Next-80B-A3B-Instruct", 49_152 + 1_048_576),
    ("NVIDIA-Nemotron-Nano-9B-v2", 73_728 + 5_242_880),
    ("granite-4.0-h-small", 50_688 + 2_097_152),
    ("Falcon-H1-7B-Instruct", 21_504 + 1_572_864),
    ("AI21-Jamba-1.5-Mini", 49_152 + 262_144),
])
def test_mamba_pages(name, page):
    assert mamba_page_bytes(MODELS[name], 1, 0) == page


@pytest.mark.parametrize("name, release, S, H, partial", [
    ("qwen3-next", "0.33.0", 544, 544, False),
    ("qwen3-next", "0.34.0", 576, 576, False),  # 0.34 raised DEFAULT_BLOCK_SIZE from 16 to 64
    ("qwen3-next+mtp+pmu16", "0.33.0", 560, 16, True),  # conv states grow with the drafts
    ("nemotron-nano-9b-v2", "0.33.0", 1312, 1312, False),
    ("qwen3-next+eagle3-kv8+pmu16", "0.34.0", 1152, 16, True),
    ("qwen3-next+mtp+tp4dcp2", "0.34.0", 640, 320, True),  # DCP > 1: Mamba block >= H
    ("qwen3-next+mtp+tp4dcp2", "0.28.0", 576, 288, False),  # 0.28: no partial hits under DCP
    ("gpt-oss-20b", "0.34.0", 64, 64, False),
])
def test_modelled_block_sizes(name, release, S, H, partial):
    d = derive(profile(name), release)
    assert (d.scheduler_block_size, d.hash_block_size, d.partial_hash_hits) == (S, H, partial)
    assert set(d.modelled) >= {"attention_block", "block_sizes"} and not d.called


def test_hash_schemes_and_the_eagle_branch():
    p = profile("qwen3-next+mtp+pmu16")
    assert schemes_for(p, "0.28.0") == (False,) and schemes_for(p, "0.33.0") == (False, True)
    default, legacy = derive(p, "0.33.0"), derive(p, "0.33.0", legacy_hashes=True)
    assert default.hash_scheme == "lookahead" and not default.use_eagle and not default.eagle_branch_live
    assert legacy.hash_scheme == "legacy" and legacy.eagle_branch_live
    config = legacy.coordinator_config()
    assert config.eagle_drop and config.partial_hash_hits == legacy.partial_hash_hits
    assert default.coordinator_config().num_hash_lookahead_tokens == 1
    # 0.33: a KV connector means legacy hashes; 0.34 asks the connector.
    assert derive(profile("qwen3-next+mtp+connector"), "0.33.0").hash_scheme == "legacy"
    assert derive(profile("qwen3-next+mtp+connector"), "0.34.0").hash_scheme == "lookahead"
    # DSpark is no block-drop method from 0.33 (it was before).
    assert not derive(profile("qwen3-next+dspark"), "0.33.0").use_eagle
    assert derive(profile("qwen3-next+dspark"), "0.32.0").use_eagle


def test_an_eagle_group_smaller_than_s_needs_a_drafter_with_a_larger_page():
    shapes = {p.name: derive(p, "0.34.0", legacy_hashes=True) for p in CATALOG}
    smaller = sorted(name for name, d in shapes.items() if d.error is None and d.eagle_branch_live and any(
        g.eagle and g.block_size < d.scheduler_block_size for g in d.groups))
    assert smaller == ["qwen3-next+eagle3-kv8+pmu16"]


def test_out_of_scope_profiles_say_why():
    assert "Unitary" in derive(profile("llama-3.1-8b+eagle3"), "0.33.0").in_scope
    assert derive(profile("qwen3-next"), "0.27.1").error
