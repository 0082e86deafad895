"""The impact a user sees (kvspec.findings.impact), read from what vLLM answered: the
hit a request was admitted on against the expected one, blocks leaked, a
crash of schedule(); never a loss that was not measured."""

from __future__ import annotations

import json
from pathlib import Path

import attrs

from kvspec.findings.impact import EngineRun, admitted_lookups, extended_program, impact_from_runs
from kvspec.model.engine import EngineProgram
from kvspec.model.finding import Category, Finding, Impact, Reach, hand_built_impact
from kvspec.model.replies import OpAnswer, Reply
from kvspec.model.requests import EngineOps, OpenEngine
from kvspec.model.state import Lookup
from kvspec.report.finding import impact_sentence, render_markdown, render_text

FIXTURE = Path(__file__).parent.parent / "fixtures" / "finding_engine_mamba_estimate_0.34.0.json"
RESENDS = [{"id": "resend0", "of": "r0", "prompt_tokens": 65, "at": 26}]


def _finding(mutant: bool = False, category: Category | None = None) -> Finding:
    finding = Finding.from_dict(json.loads(FIXTURE.read_text()))
    if mutant:
        subject = {**finding.compared["subject"], "kind": "mutant", "mutant": "some_mutant",
                   "label": "vllm 0.34.0 + some_mutant"}
        finding = attrs.evolve(finding, compared={**finding.compared, "subject": subject})
    return finding if category is None else attrs.evolve(finding, category=category)


def _lookup(request: str, hit: int, tokens: int = 65) -> dict:
    return {"request": request, "hit": hit, "num_tokens": tokens, "group_blocks": []}


def _run(label: str, hits: dict, *, leaked: int = 0, crash: dict | None = None) -> EngineRun:
    leak = {"free": 21 - leaked, "usable": 21, "leaked": leaked, "idle": True}
    rows = {r: {"hit": h, "external": 0, "num_tokens": 65, "owed": owed} for r, (h, owed) in hits.items()}
    return EngineRun(label, (), crash, rows, leak, leak)


def test_the_hit_counted_is_the_one_the_request_was_admitted_on():
    # r1 is turned away by the admission gate (a lookup, not running), looks up
    # again next step and is admitted on a hit of 64: that is its hit.
    answers = [OpAnswer.parse(a) for a in [
        {"scheduled": {"result": {"lookups": [_lookup("r0", 0), _lookup("r1", 0)]}, "running": {"r0": 65},
                       "waiting": ["r1"], "state": None},
         "result": {}, "running": {}, "waiting": [], "state": None},
        {"scheduled": {"result": {"lookups": [_lookup("r1", 64)]}, "running": {"r1": 65}, "waiting": [],
                       "state": None}, "result": {}, "running": {"r1": 65}, "waiting": [], "state": None},
    ]]
    seen = [Lookup("r0", 0, (), 65), Lookup("r1", 0, (), 65, owed=0), Lookup("r1", 64, (), 65, owed=64)]
    hits = admitted_lookups(answers, seen, predicts=True)
    assert hits["r0"]["hit"] == 0 and hits["r1"]["hit"] == 64 and hits["r1"]["owed"] == 64
    # Where the model predicts nothing (a KV connector), no owed hit is claimed.
    assert admitted_lookups(answers, seen, predicts=False)["r1"]["owed"] is None


def test_a_mutant_hitting_less_than_the_release_loses_the_difference():
    impact = impact_from_runs(_finding(mutant=True), _run("vllm 0.34.0 + some_mutant", {"resend0": (0, None)}),
                              _run("vllm 0.34.0", {"resend0": (64, None)}), RESENDS)
    assert (impact.kind, impact.measured, impact.expected, impact.unit) == ("hit_lost", 0, 64, "tokens")
    assert "a resend of r0's 65-token prompt hits 0 tokens" in impact.summary
    assert "the unmutated vllm 0.34.0 hits 64: 64 prompt tokens recomputed" in impact.summary
    assert "--num-gpu-blocks-override 22" in impact.summary  # at the finding's engine configuration


def test_a_release_hitting_less_than_the_model_owes_loses_the_difference():
    impact = impact_from_runs(_finding(), _run("vllm 0.34.0", {"r0": (0, 0), "r5": (16, 48), "resend0": (64, 64)}),
                              None, RESENDS)
    assert (impact.kind, impact.measured, impact.expected) == ("hit_lost", 16, 48)
    assert "request r5 of the finding's program" in impact.summary and "owes 48: 32 prompt tokens" in impact.summary


def test_a_mutant_hitting_more_than_the_release_is_not_called_no_loss():
    """A dropped EAGLE block (eagle_drop_removed on 0.34.0 hits 80 where the
    release hits 64) reuses KV the release recomputes: said as such."""
    impact = impact_from_runs(_finding(mutant=True), _run("vllm 0.34.0 + some_mutant", {"resend0": (80, None)}),
                              _run("vllm 0.34.0", {"resend0": (64, None)}), RESENDS)
    assert (impact.kind, impact.measured, impact.expected) == ("hit_gained", 80, 64)
    assert "hits 80 tokens of the prefix cache where the unmutated vllm 0.34.0 hits 64" in impact.summary
    assert "16 prompt tokens served from cached KV the release recomputes" in impact.summary
    assert "no hit lost" not in impact.summary


def test_no_loss_is_said_and_no_loss_invented():
    impact = impact_from_runs(_finding(mutant=True), _run("vllm 0.34.0 + some_mutant", {"resend0": (64, None)}),
                              _run("vllm 0.34.0", {"resend0": (64, None)}), RESENDS)
    assert impact.kind == "no_loss" and impact.measured == impact.expected == 64
    assert "still hits 64 of 65 tokens" in impact.summary
    assert "no hit lost at this configuration; the broken rule is internal" in impact.summary
    # Without a reference or a model prediction the hit is not compared, and no verdict on hits is given.
    alone = impact_from_runs(_finding(), _run("vllm 0.34.0", {"resend0": (64, None)}), None, RESENDS)
    assert "not compared" in alone.summary and "no hit lost" not in alone.summary
    # A rule guarding what attention reads is not called internal.
    window = impact_from_runs(_finding(category=Category.STATE_WINDOW), _run("vllm 0.34.0", {"resend0": (64, 64)}),
                              None, RESENDS)
    assert "internal" not in window.summary and "model's outputs" in window.summary


def test_a_crash_of_schedule_in_vllms_frames_is_the_impact():
    crash = {"index": 3, "error": "ValueError: Cannot get 1 free blocks from the pool", "origin": "vllm",
             "function": "schedule", "op": {"do": "step"}, "steps_before": 2, "in_program": True}
    impact = impact_from_runs(_finding(), _run("vllm 0.34.0", {}, crash=crash), None, RESENDS)
    assert impact.kind == "crash" and impact.measured == 2
    assert ("schedule() raises ValueError: Cannot get 1 free blocks from the pool after 2 engine steps: the engine "
            "process dies (every request in flight fails)") in impact.summary
    # kvspec's own driver raising is never vLLM's crash.
    ours = impact_from_runs(_finding(), _run("vllm 0.34.0", {}, crash={**crash, "origin": "kvspec"}), None, RESENDS)
    assert ours.kind != "crash"
    # A mutant's crash the unmutated release shares is not the mutant's impact.
    both = impact_from_runs(_finding(mutant=True), _run("m", {"resend0": (64, None)}, crash=crash),
                            _run("vllm 0.34.0", {"resend0": (64, None)}, crash=crash), RESENDS)
    assert both.kind != "crash"


def test_blocks_leaked_once_every_request_finished():
    impact = impact_from_runs(_finding(mutant=True), _run("m", {"resend0": (64, None)}, leaked=3),
                              _run("vllm 0.34.0", {"resend0": (64, None)}), RESENDS)
    assert (impact.kind, impact.measured, impact.expected, impact.unit) == ("blocks_leaked", 3, 0, "blocks")
    assert "3 of 21 KV-cache blocks stay out of the free pool" in impact.summary


def test_the_extension_resends_each_distinct_prompt_after_draining():
    program = EngineProgram.from_dict(json.loads(FIXTURE.read_text())["inputs"]["engine_program"])
    extended, resends, found_at = extended_program(program)
    assert found_at == len(program.ops) and extended.ops[:found_at] == program.ops
    assert [r["of"] for r in resends] == ["r0"]
    arrival = extended.ops[resends[0]["at"]]
    assert arrival["do"] == "arrive" and arrival["tokens"] == program.ops[0]["tokens"]


def test_the_impact_leads_every_renderer_and_round_trips():
    impact = Impact("no_loss", "Measured somewhere: nothing lost.", 64, 64, "tokens", "how it was measured",
                    ({"request": "resend0", "resend_of": "r0", "prompt_tokens": 65, "hit": 64, "external": 0,
                      "owed": None, "reference_hit": 64},), "vllm 0.34.0")
    finding = attrs.evolve(_finding(), impact=impact)
    assert Finding.from_dict(json.loads(json.dumps(finding.to_dict()))) == finding
    assert impact_sentence(finding) == impact.summary
    text = render_text(finding)
    assert text.startswith("IMPACT: Measured somewhere: nothing lost.")
    assert "impact (no loss): how it was measured" in text
    assert "resend of r0 (65-token prompt, admitted on a hit of 64): vllm 0.34.0 hits 64" in text
    assert render_markdown(finding).startswith("**Impact:** Measured somewhere: nothing lost.")


def test_a_stateful_finding_says_its_impact_is_not_measured():
    finding = attrs.evolve(_finding(category=Category.STATE_LEAK), inputs={"program": {}, "describe": "a program"},
                           impact=hand_built_impact(Category.STATE_LEAK), reach=None)
    assert render_text(finding).startswith(
        "IMPACT: Not measured: hand-built configuration (no engine configuration reproduces it yet)")
    # Stored before impacts were recorded: the same sentence.
    assert impact_sentence(attrs.evolve(finding, impact=None)) == hand_built_impact(Category.STATE_LEAK).summary
    # What the engine showed of it (its reach) comes first, then that the impact is not measured.
    hand_built_only = Reach("hand-built only: not reproduced through the engine in a search of 40 programs",
                            profiles=(), hardening=True)
    assert impact_sentence(attrs.evolve(finding, reach=hand_built_only)) == (
        "Hardening, not a regression: hand-built only: not reproduced through the engine in a search of 40 "
        "programs. " + hand_built_impact(Category.STATE_LEAK).summary)


def test_an_unassessed_reach_is_not_called_a_checked_catalog():
    text = render_text(_finding())
    assert "no deployment profile of the catalog was checked for it" in text
    assert "no deployment profile of the catalog reaches it" not in text


class _ScriptedWorker:
    """A worker answering the probe's engine runs from a script: the pool
    sizes vLLM accepts and, per run, the allocation or the exception."""

    def __init__(self, accepted_from: int):
        self.accepted_from, self.pool, self.pools = accepted_from, None, []

    def session(self, request):
        return Reply.parse(self._record(request), request.op)  # parsed as the subject process parses it

    def _record(self, request):
        if isinstance(request, OpenEngine):
            self.pool = request.setup["engine_args"]["num_gpu_blocks_override"]
            self.pools.append(self.pool)
            if self.pool < self.accepted_from:
                return {"ok": False, "error_kind": "construct", "error": "ValueError: too few blocks"}
            return {"ok": True, "derived": {}, "state": {}}
        assert isinstance(request, EngineOps)
        beside = len(request.ops[0]["tokens"])
        free = self.pool - 1 - (3 if beside > 64 else 1)
        if free < 6:  # the allocation takes 6 where the groups estimated 4
            return {"ok": False, "error_kind": "drive", "index": 4, "origin": "vllm",
                    "error": "ValueError: Cannot get 1 free blocks from the pool",
                    "traceback": 'File "/x/vllm/v1/core/sched/scheduler.py", line 1, in schedule\n'}
        allocation = {"request": "r0", "estimates": [1, 1, 2], "free_before": free, "free_after": free - 6,
                      "allocated": True}
        nothing = {"result": {}, "running": {}, "waiting": [], "state": None}
        return {"ok": True, "answers": [nothing] * 4 + [
            {**nothing, "scheduled": {**nothing, "result": {"allocations": [allocation]}}}]}


def test_the_pressure_probe_lowers_the_pool_to_one_block_short_of_the_allocation():
    from kvspec.findings.impact import pressure_probe

    program = EngineProgram.from_dict(json.loads(FIXTURE.read_text())["inputs"]["engine_program"])
    worker = _ScriptedWorker(accepted_from=9)
    probe = pressure_probe(worker, program)
    # With a 1-token request beside it the allocation found 20 free blocks: the pool
    # lowered by 15 (to 7) is refused; with a 64-token one, the same; with 65
    # tokens (3 blocks held) it found 18, and a pool of 22 - 13 = 9 leaves it 5: one short.
    assert probe is not None and probe["num_gpu_blocks"] == 9 and probe["beside"] == 65
    assert probe["free"] == 5 and probe["taken"] == 6 and probe["function"] == "schedule"
    assert worker.pools == [22, 7, 22, 7, 22, 9]
    assert probe["error"] == "ValueError: Cannot get 1 free blocks from the pool"


def test_an_engine_finding_stored_before_impacts_says_how_to_measure_it():
    sentence = impact_sentence(_finding())
    assert sentence.startswith("Not measured (this finding was stored before kvspec measured what a user sees; "
                               "`kvspec replay` on it measures that)")
