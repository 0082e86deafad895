"""Each deployment profile's derivation, the release's own configuration code
against kvspec's model of it (``model/deployments.derive``), on the CI
releases and 0.34.0 (the newest, whose default block changed).

The probe is run afresh (no cache): what is compared was computed by vLLM's
code in this test."""

from __future__ import annotations

import attrs
import pytest

from kvspec.model.capabilities import expected_regime, known_capabilities
from kvspec.model.deployments import CATALOG, ERAS, derive, from_probe, schemes_for
from kvspec.subjects.drivers.deployments import derivations, probe_release
from kvspec.subjects.subject import release

RELEASES = ("0.28.0", "0.33.0", "0.34.0")
# Where the release's code cannot run on a CPU (said in the derivation's steps).
NOT_CALLABLE = {("qwen3-next+dspark", v): "Model Runner V2 requires Triton" for v in ("0.28.0",)}


@pytest.fixture(scope="module", params=RELEASES)
def probed(request):
    return request.param, probe_release(release(request.param), use_cache=False)


def test_every_profile_is_derived_by_the_release_and_matches_the_model(probed):
    version, result = probed
    assert "fatal" not in result, result.get("fatal")
    assert result["release_facts"]["speculative_methods"]["eagle3"]["use_eagle"] is True
    called = 0
    for p in CATALOG:
        for legacy in schemes_for(p, version):
            answer = result["results"][f"{p.name}|{'legacy' if legacy else 'default'}"]
            if (p.name, version) in NOT_CALLABLE:
                assert not answer["ok"] and NOT_CALLABLE[(p.name, version)] in answer["error"]
                continue
            assert answer["ok"], (p.name, answer.get("error"))
            modelled = derive(p, version, legacy_hashes=legacy)
            derived = from_probe(p, version, legacy, answer, modelled)
            assert {"engine_config", "attention_block", "layer_specs", "groups", "block_sizes",
                    "speculative", "manager"} <= set(derived.called), p.name
            assert derived.comparable() == modelled.comparable(), (p.name, legacy)
            config = derived.coordinator_config()
            if config is not None:  # kvspec's own regime rule agrees with the coordinator's
                regime = expected_regime(config, known_capabilities(version))
                assert regime.partial_hash_hits == derived.partial_hash_hits, p.name
                assert regime.eagle_branch_live == derived.eagle_branch_live, p.name
            called += 1
    assert called >= len(CATALOG) - 1


def test_the_comparison_can_fail(probed):
    """The model of another era disagrees with this release somewhere."""
    import kvspec.model.deployments as deployments

    version, result = probed
    era = deployments.config_era(version)
    other = next(e for e in ERAS if e.default_block != era.default_block or e.eagle_flags != era.eagle_flags)
    wrong = attrs.evolve(other, low=version, high=version)
    original = deployments.ERAS
    deployments.ERAS = (wrong,)
    try:
        differing = 0
        for p in CATALOG:
            answer = result["results"][f"{p.name}|default"]
            if not answer["ok"]:
                continue
            modelled = derive(p, version)
            differing += from_probe(p, version, False, answer, modelled).comparable() != modelled.comparable()
    finally:
        deployments.ERAS = original
    assert differing > 0


def test_derivations_fall_back_to_the_model_and_say_why():
    found = derivations(release("0.28.0"), "0.28.0")
    dspark = [d for d in found if d.profile == "qwen3-next+dspark"]
    assert dspark and all(d.steps[0].step == "release_code" and "Triton" in d.steps[0].note for d in dspark)
    assert all(not d.called for d in dspark)
    assert sum(bool(d.called) for d in found) >= len(found) - len(dspark)
