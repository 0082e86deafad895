"""The hit-rate replay's model side: the workload, the spec's ideal cache and
the report (no vLLM needed)."""

import re
import xml.dom.minidom

import pytest

from kvspec.model.capabilities import expected_regime
from kvspec.model.domain import CoordinatorConfig, GroupKind, KVCacheGroup
from kvspec.model.variants import variant
from kvspec.model.workload import LAYOUTS, Workload, layout
from kvspec.model.retention import common_prefix
from kvspec.oracles.ideal_cache import SpecCache
from kvspec.report.hitrate import HitrateFile, render_text
from kvspec.report.hitrate_plot import render_svg
from kvspec.subjects.drivers.hitrate import replay
from kvspec.usecases.hitrate import compare_with_reference

from tests.support import capabilities

CAPS = capabilities("0.33.0")
SMALL = Workload(conversations=6, turns=3, concurrency=4, system_prompt_tokens=100)


def _ideal(config, workload=SMALL, rule=None):
    regime = expected_regime(config, CAPS)
    cache = SpecCache(config, regime) if rule is None else SpecCache(config, regime, rule)
    return replay(workload, cache)


def test_workload_is_deterministic_and_multi_turn():
    first, again = SMALL.requests(), SMALL.requests()
    assert first == again
    assert len(first) == 6 * 3
    by_conversation = {}
    for r in first:
        if r.turn:
            previous = by_conversation[r.conversation]
            assert r.after == previous.index
            assert r.prompt[:len(previous.prompt) + len(previous.output)] == previous.prompt + previous.output
        by_conversation[r.conversation] = r
    assert Workload(seed=1).requests() != Workload(seed=0).requests()


@pytest.mark.parametrize("bad", [{"concurrency": 0}, {"user_tokens": (5, 2)}, {"turns": 0}, {"drafts": -1}])
def test_workload_rejects_bad_parameters(bad):
    with pytest.raises(ValueError):
        Workload(**bad)


@pytest.mark.parametrize("name", LAYOUTS)
def test_ideal_hits_are_landing_points_within_what_earlier_requests_computed(name):
    config = layout(name, 64)
    result = _ideal(config)
    requests = SMALL.requests()
    assert result.hit_tokens > 0
    for outcome, request in zip(result.outcomes, requests):
        earlier = [r.prompt + r.output for r in requests[:request.index]]
        shared = max((common_prefix(request.prompt, tokens) for tokens in earlier), default=0)
        assert outcome.hit % config.hash_block_size == 0
        assert outcome.hit <= min(shared, len(request.prompt) - 1)


def test_no_caching_means_no_hits():
    config = CoordinatorConfig(groups=(KVCacheGroup(GroupKind.FULL_ATTENTION, 16),
                                       KVCacheGroup(GroupKind.FULL_ATTENTION, 32)),
                               scheduler_block_size=32, hash_block_size=16, enable_caching=False)
    assert _ideal(config).hit_tokens == 0


def test_a_rule_registering_less_never_hits_more():
    # lookahead_dropped registers at most what the subject does, per call.
    config = layout("full-attention", 64)
    subject, dropped = _ideal(config), _ideal(config, rule=variant("lookahead_dropped").rule)
    assert all(d.hit <= s.hit for d, s in zip(dropped.outcomes, subject.outcomes))
    assert dropped.hit_tokens < subject.hit_tokens


def _row(label, hits, mutant, exact, S=64, version="0.33.0"):
    prompts = [100] * len(hits)
    rate = sum(hits) / sum(prompts)
    return {"label": label, "vllm_version": version, "mutant": mutant, "scheduler_block_size": S,
            "ideal_exact": exact, "hits": hits, "hit_rate": rate, "requests": len(hits),
            "prompt_lengths": prompts, "turns": [0] * len(hits), "per_turn": [rate],
            "ideal_hits": [50] * len(hits), "ideal_hit_rate": 0.5, "ideal_per_turn": [0.5],
            "model_rule": "spec", "model_hit_rate": 0.5, "model_matches_per_request": hits == [50] * len(hits)}


def test_mamba_mutants_are_held_to_their_release_and_releases_to_nothing():
    rows = [_row("vllm 0.33.0", [50, 40], False, False), _row("0.33.0 + m", [50, 20], True, False)]
    compare_with_reference(rows)
    assert rows[0]["reference"] is None  # the ideal is not exact with a Mamba group
    ref = rows[1]["reference"]
    assert ref["label"] == "vllm 0.33.0" and ref["requests_differing"] == 1 and ref["hit_tokens_lost"] == 20
    assert ref["first_difference"]["request"] == 1


def test_exact_layouts_are_held_to_the_ideal_and_the_report_renders():
    rows = [_row("vllm 0.33.0", [50, 50], False, True), _row("0.33.0 + m", [50, 30], True, True)]
    compare_with_reference(rows)
    assert rows[0]["reference"]["requests_differing"] == 0
    assert rows[1]["reference"]["points"] == -10.0
    doc = {"verdict": "v", "layout": "L", "workload": {"text": "W"}, "subjects": rows, "errors": []}
    text = render_text(HitrateFile.parse(doc))
    assert "0.33.0 + m" in text and "20 hit tokens lost" in text
    svg = render_svg(HitrateFile.parse(doc))
    xml.dom.minidom.parseString(svg)  # well-formed
    texts = re.findall(r"<text[^>]*>([^<]*)</text>", svg)  # matplotlib, text kept as text
    assert "vllm 0.33.0 (S=64)" in texts and "0.33.0 + m (S=64)" in texts and "-10.0 pts" in " ".join(texts)


@pytest.mark.parametrize("args, cause", [
    (["--vllm", "0.33.0", "--mutant", "no_such_mutant"], "unknown mutation operator"),
    (["--current", "--mutant", "refloor_50062"], "--mutant applies to a release"),
    (["--vllm", "0.33.0", "--scheduler-block-size", "64,x"], "--scheduler-block-size"),
    (["--vllm", "0.33.0", "--concurrency", "0"], "concurrency"),
])
def test_bad_hitrate_arguments_are_usage_errors(args, cause, capsys):
    from kvspec.model.outcome import Outcome
    from kvspec.cli import main

    assert main(["hitrate", *args]) == Outcome.USAGE.exit_code
    assert cause in capsys.readouterr().err
