"""What a user sees of a finding, measured on the subject (``model.finding.Impact``).

An engine finding (``diff_tests/engine.py``) is measured at its own engine
configuration -- the toy model and the engine flags the finding names, built
by the release's configuration code -- by driving its program on, through
the same worker and the same state oracle as the differential
(``drive_engine_program``): the program as found, then steps until every
request finished, then a resend of each distinct prompt the program sent
(one token of output each), each followed by steps until it finished.  Read
from what vLLM answered:

- a crash: vLLM raised (in its own frames: a fault of kvspec's driver is
  never counted) -- the operation, the exception and the steps before it;
- blocks leaked: blocks not free once no request is running, waiting or
  loading, against the pool's size less the null block;
- each request's prefix-cache hit (``get_computed_blocks``' tokens) at the
  lookup it was admitted on -- the program's own requests (siblings sharing
  prefixes, resends) and the resends after it -- against what is expected
  of it: on a kvspec mutant, the hit the unmutated release gives on the same
  extended program (measured the same way); on a release, the least hit
  kvspec's retention model owes the lookup (``model.retention``, computed by
  the oracle over the same answers) where the model predicts one;
- for a block-estimate finding, the pool under pressure
  (``pressure_probe``): the program with a request of its own beside it and
  the pool lowered until the over-estimated allocation finds one block fewer
  than it takes -- does ``schedule()`` raise?

The worst of these is the finding's impact; when none shows a loss, that is
said ("no hit lost at this configuration; the broken rule is internal"),
never a loss that was not measured.  A stateful finding is on a hand-built
geometry that no engine configuration reproduces yet: it is not measured,
and said so.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import attrs

from kvspec.model.finding import Category, Finding, Impact
from kvspec.model.replies import OpAnswer, Reply
from kvspec.model.requests import EngineOps, OpenEngine

__all__ = ["measure_engine_impact", "attach_engine_impact", "impact_from_runs", "extended_program",
           "admitted_lookups", "pressure_probe", "EngineRun"]

Say = Callable[[str], None]
DRAIN = 24  # steps after the program (and after each resend): a request of the engine differential ends in fewer
MAX_RESENDS = 4
_FRAME = re.compile(r'File "[^"]*/vllm/[^"]*", line \d+, in (\w+)')


# Rules whose breach reaches what a step's attention reads (a block freed,
# shared or not zeroed under a running request): their loss is on outputs.
_ON_OUTPUTS = frozenset({Category.STATE_WINDOW, Category.STATE_ZEROING, Category.STATE_ZEROING_MISSED,
                         Category.STATE_ONE_GROUP, Category.STATE_FREE_BLOCKS, Category.STATE_REF_COUNT,
                         Category.STATE_TABLE_COVERAGE, Category.STATE_TABLE_APPEND_ONLY,
                         Category.STATE_EVICTED_FINDABLE, Category.STATE_HIT_BOUNDS, Category.STATE_HIT_GROUPS})


def _quiet(message: str) -> None:
    return None


def extended_program(program):
    """The finding's program, then every request drained, then a resend of
    each distinct prompt it sent (the last ``MAX_RESENDS``), each drained."""
    prompts: list[tuple[str, list[int]]] = []
    for op in program.ops:
        if op.get("do") == "arrive" and all(list(op["tokens"]) != p for _, p in prompts):
            prompts.append((op["id"], list(op["tokens"])))
    ops = [dict(op) for op in program.ops] + [{"do": "step"} for _ in range(DRAIN)]
    resends = []
    for i, (of, tokens) in enumerate(prompts[-MAX_RESENDS:]):
        name = f"resend{i}"
        resends.append({"id": name, "of": of, "prompt_tokens": len(tokens), "at": len(ops)})
        ops.append({"do": "arrive", "id": name, "tokens": tokens, "max_tokens": 1})
        ops.extend({"do": "step"} for _ in range(DRAIN))
    return program.with_ops(ops), resends, len(program.ops)


@attrs.frozen
class EngineRun:
    """What one subject answered to the extended program."""

    label: str
    answers: tuple[OpAnswer, ...]  # one per operation run (up to a crash)
    crash: dict[str, Any] | None  # the operation vLLM raised on: index, error, function, steps before
    hits: dict[str, dict[str, Any]]  # request -> the lookup it was admitted on (hit, external, tokens, owed or None)
    leaked: dict[str, Any] | None  # after the program's drain: blocks not free, pool, idle or not
    leaked_end: dict[str, Any] | None  # after the last resend's drain


def _idle(answer: OpAnswer) -> bool:
    return not answer.running and not answer.waiting and not answer.result.loading


def _leak(answer: OpAnswer | None, num_blocks: int) -> dict[str, Any] | None:
    if answer is None:
        return None
    state = answer.state or {}
    free = state.get("num_free")
    if free is None:
        return None
    usable = num_blocks - 1  # the null block is never free
    held = len(state.get("held_elsewhere") or ())
    return {"free": free, "usable": usable, "leaked": usable - free - held, "idle": _idle(answer)}


def run_extended(proc, program, resends: list[dict[str, Any]], found_at: int) -> EngineRun:
    """Drive the extended program on ``proc`` through ``drive_engine_program``
    (past broken rules) and read crash, leak and each resend's hit."""
    from kvspec.diff_tests.engine import drive_engine_program

    oracles: list[Any] = []
    records = list(drive_engine_program(proc, program, through=True, oracle_out=oracles))
    opened = records[0].reply
    if records[0].found:  # the engine was not built: nothing measured
        raise RuntimeError(f"the engine was not built: {opened.error.message}")
    num_blocks = int(opened.payload.derived["num_blocks"])
    records = records[1:]
    answers = tuple(r.answer for r in records if r.answer is not None)
    crash = None
    last = records[-1] if records else None
    if last is not None and last.answer is None:  # vLLM raised on this operation
        error = last.reply.error
        index = error.index if error.index is not None else len(answers)
        frames = _FRAME.findall(error.traceback or "")
        steps = sum(op.get("do") == "step" for op in program.ops[:index])
        crash = {"index": index, "error": error.message, "origin": error.origin,
                 "function": frames[0] if frames else None, "op": dict(program.ops[index]) if index < len(program.ops)
                 else None, "steps_before": steps, "in_program": index < found_at}
    oracle = oracles[0] if oracles else None
    predicts = bool(oracle is not None and oracle.ledger is not None and oracle.ledger.layout.predicts)
    hits = admitted_lookups(answers, oracle.lookups_seen if oracle is not None else (), predicts)
    drained = found_at + DRAIN - 1
    leaked = _leak(answers[drained], num_blocks) if drained < len(answers) else None
    leaked_end = _leak(answers[-1], num_blocks) if len(answers) == len(program.ops) else None
    return EngineRun(proc.subject.label, answers, crash, hits, leaked, leaked_end)


def admitted_lookups(answers, seen, predicts: bool) -> dict[str, dict[str, Any]]:
    """Per request, the lookup it was admitted on -- its last lookup before
    it first shows among the running requests (a request the admission gate
    turns away looks up again; a preempted one, again later: not counted) --
    with the least hit kvspec's retention model owes that lookup (``seen``:
    the oracle's lookups, in the answers' order; None where the model
    predicts nothing).  A request never admitted: its last lookup."""
    owed = iter(seen)
    pending: dict[str, dict[str, Any]] = {}
    admitted: dict[str, dict[str, Any]] = {}
    for answer in answers:
        for part in answer.parts():
            for lk in part.result.lookups:
                model = next(owed, None)
                matches = model is not None and model.request == lk.request and model.hit == lk.hit
                pending[lk.request] = {"hit": lk.hit, "external": lk.external, "num_tokens": lk.num_tokens,
                                       "owed": model.owed if predicts and matches else None}
            for request in part.running:
                if request not in admitted and request in pending:
                    admitted[request] = pending.pop(request)
    for request, lk in pending.items():
        admitted.setdefault(request, lk)
    return admitted


def _config_words(finding: Finding) -> str:
    program = (finding.inputs or {}).get("engine_program") or {}
    engine = program.get("engine") or {}
    reached = (finding.inputs or {}).get("describe", "")
    flags = reached.split(" ops=[", 1)[0] if reached else engine.get("model", "?")
    return f"at the finding's engine configuration ({flags})"


def _crash_words(crash: dict[str, Any]) -> str:
    function = crash.get("function")
    op = crash.get("op") or {}
    call = {"step": f"{function or 'schedule'}()", "arrive": "add_request()", "abort": "finish_requests()",
            "reset": "reset_prefix_cache()"}.get(op.get("do"), f"{function or 'vLLM'}()")
    if op.get("do") == "step" and function:
        call = f"{function}()"
    dies = (": the engine process dies (every request in flight fails)" if op.get("do") == "step"
            else ": the engine core raises on the call (every request in flight fails with it)")
    return f"{call} raises {crash['error']} after {crash['steps_before']} engine steps{dies}"


def _who(row: dict[str, Any]) -> str:
    if row["resend_of"] is not None:
        return f"a resend of {row['resend_of']}'s {row['prompt_tokens']}-token prompt"
    return f"request {row['request']} of the finding's program ({row['prompt_tokens']}-token prompt)"


def impact_from_runs(finding: Finding, subject: EngineRun, reference: EngineRun | None,
                     resends: list[dict[str, Any]]) -> Impact:
    """The impact read from the subject's run of the extended program and,
    for a mutant, the unmutated release's run of the same program."""
    where = _config_words(finding)
    how = (f"measured on {subject.label} {where}: the finding's program, then steps until every request "
           f"finished, then a resend of each distinct prompt it sent (the last {MAX_RESENDS}, one output token "
           f"each), driven through vLLM's Scheduler as the engine differential drives it")
    expected_from = (f"the hit the unmutated {reference.label} gives on the same program, measured the same way"
                     if reference is not None else
                     "the least hit kvspec's retention model (model.retention) owes each lookup")
    how += f"; expected: {expected_from}"
    of = {r["id"]: r["of"] for r in resends}
    rows = []
    for request, got in subject.hits.items():  # every request's admitting lookup, the program's and the resends'
        ref = reference.hits.get(request) if reference is not None else None
        rows.append({"request": request, "resend_of": of.get(request), "prompt_tokens": got["num_tokens"],
                     "hit": got["hit"], "external": got["external"], "owed": got["owed"],
                     "reference_hit": None if ref is None or ref["num_tokens"] != got["num_tokens"] else ref["hit"]})
    crash = subject.crash
    if crash is not None and crash.get("origin") == "vllm":
        if reference is None or reference.crash is None:
            where_crash = ("on the finding's own program" if crash["in_program"] else
                           "when the finding's program goes on (requests drained, then resent)")
            also = f"; the unmutated {reference.label} runs the same program without raising" if reference else ""
            if reference is None and not crash["in_program"]:
                also = "; whether it follows from this finding's broken rule is not established"
            return Impact("crash", f"Measured {where}: {_crash_words(crash)} ({where_crash}){also}.",
                          measured=crash["steps_before"], unit="engine steps before the crash",
                          how_measured=how, lookups=tuple(rows),
                          reference=None if reference is None else reference.label)
    leak = subject.leaked_end if subject.leaked_end is not None else subject.leaked
    ref_leak = None if reference is None else (reference.leaked_end or reference.leaked)
    if leak is not None and leak["idle"] and leak["leaked"] > 0 and (ref_leak is None or ref_leak["leaked"] < leak["leaked"]):
        base = 0 if ref_leak is None else ref_leak["leaked"]
        vs = f", the unmutated {reference.label} {base}" if reference is not None else ""
        return Impact("blocks_leaked", f"Measured {where}: {leak['leaked']} of {leak['usable']} KV-cache blocks stay "
                                       f"out of the free pool once every request finished{vs}: every later request "
                                       f"has that many blocks fewer (more preemption, a smaller batch).",
                      measured=leak["leaked"], expected=base, unit="blocks", how_measured=how, lookups=tuple(rows),
                      reference=None if reference is None else reference.label)
    lost = []
    for row in rows:
        expected = row["reference_hit"] if reference is not None else row["owed"]
        if expected is not None and expected > row["hit"]:
            lost.append((expected - row["hit"], expected, row))
    if lost:
        gap, expected, row = max(lost, key=lambda t: t[0])
        source = f"the unmutated {reference.label} hits {expected}" if reference is not None else \
            f"kvspec's retention model owes {expected}"
        return Impact("hit_lost", f"Measured {where}: {_who(row)} hits {row['hit']} tokens of the prefix cache where "
                                  f"{source}: {gap} prompt tokens recomputed ({len(lost)} of {len(rows)} requests' "
                                  f"admitting lookups lose hits).",
                      measured=row["hit"], expected=expected, unit="tokens", how_measured=how, lookups=tuple(rows),
                      reference=None if reference is None else reference.label)
    gained = [(row["hit"] - row["reference_hit"], row) for row in rows
              if reference is not None and row["reference_hit"] is not None and row["hit"] > row["reference_hit"]]
    if gained:
        # More hit than the release is no gain: the tokens the release
        # recomputes are served from blocks it would not reuse.
        gap, row = max(gained, key=lambda t: t[0])
        return Impact("hit_gained", f"Measured {where}: {_who(row)} hits {row['hit']} tokens of the prefix cache "
                                    f"where the unmutated {reference.label} hits {row['reference_hit']}: {gap} "
                                    f"prompt tokens served from cached KV the release recomputes ({len(gained)} of "
                                    f"{len(rows)} requests' admitting lookups); whether that KV is stale shows on the "
                                    f"model's outputs, which this drive does not compute (not measured).",
                      measured=row["hit"], expected=row["reference_hit"], unit="tokens", how_measured=how,
                      lookups=tuple(rows), reference=reference.label)
    measured_rows = [r for r in rows if r["resend_of"] is not None]
    if not measured_rows:
        why = ("vLLM raised first" if crash is not None else "no resend was scheduled")
        return Impact("not_measured", f"Not measured {where}: {why}.", how_measured=how, lookups=tuple(rows))
    row = max(measured_rows, key=lambda r: r["prompt_tokens"])
    if reference is not None:
        against = f"as the unmutated {reference.label} does ({row['reference_hit']})"
    elif row["owed"] is not None:
        against = f"kvspec's retention model owes {row['owed']}"
    else:
        against = ("kvspec's model predicts no hit here (a KV connector, speculative decoding or caching off: "
                   "not modelled), so the hit is not compared")
    leak_words = ""
    if leak is not None and leak["idle"]:
        leak_words = f"; no block leaked ({leak['free']} of {leak['usable']} free once every request finished)"
    compared = row["owed"] is not None or reference is not None
    if finding.category in _ON_OUTPUTS:
        # What these rules guard is the KV a step reads, i.e. the model's
        # outputs, which the CPU drive does not compute: not called internal.
        verdict = (f"{'no hit lost and ' if compared else ''}nothing the cache's counts show at this configuration; "
                   f"what the broken rule risks ({finding.category.meaning}) is on the model's outputs, which this "
                   f"drive does not compute (not measured)")
    else:
        verdict = ("no hit lost at this configuration; the broken rule is internal" if compared
                   else "no loss measured at this configuration")
    extra = ""
    if crash is not None and reference is not None and reference.crash is not None:
        extra = f"; both it and the unmutated release raise later ({crash['error']}), not counted"
    elif crash is not None:
        extra = f"; vLLM raised later in the extension, outside its own frames ({crash['error']}), not counted"
    others = len(rows) - 1
    if others and (reference is not None or any(r["owed"] is not None for r in rows)):
        against += f" (and no other of the {others} requests' admitting lookups hits less than expected)"
    return Impact("no_loss", f"Measured {where}: {_who(row)} still hits {row['hit']} of {row['prompt_tokens']} "
                             f"tokens, {against}{leak_words}: "
                             f"{verdict}{extra}.",
                  measured=row["hit"], expected=row["reference_hit"] if reference is not None else row["owed"],
                  unit="tokens", how_measured=how, lookups=tuple(rows),
                  reference=None if reference is None else reference.label)


def measure_engine_impact(proc, finding: Finding, say: Say = _quiet) -> Impact:
    """The impact of an engine finding, on ``proc``'s subject and, for a
    mutant, on the release it was made from (a worker of its own)."""
    from kvspec.model.engine import EngineProgram

    program = EngineProgram.from_dict(finding.inputs["engine_program"])
    extended, resends, found_at = extended_program(program)
    say(f"  impact: driving {finding.inputs.get('operations', len(program.ops))} operations on, then "
        f"{len(resends)} resend(s), on {proc.subject.label}")
    subject_run = run_extended(proc, extended, resends, found_at)
    reference_run = None
    stored = finding.compared.get("subject") or {}
    if stored.get("kind") == "mutant" and stored.get("version"):
        from kvspec.subjects.process import SubjectProcess
        from kvspec.subjects.subject import release

        say(f"  impact: the same on vLLM {stored['version']} unmutated")
        with SubjectProcess(release(stored["version"])) as base:
            reference_run = run_extended(base, extended, resends, found_at)
    impact = impact_from_runs(finding, subject_run, reference_run, resends)
    if finding.category is Category.STATE_BLOCK_ESTIMATE and impact.kind != "crash":
        say(f"  impact: tightening the pool under the over-estimated allocation on {proc.subject.label}")
        probe = pressure_probe(proc, program)
        if probe is not None and reference_run is not None:
            with SubjectProcess(release(stored["version"])) as base:  # the release must not raise there too
                ops = _probe_ops(probe, program)
                reply = _drive(base, attrs.evolve(program.setup, num_gpu_blocks=probe["num_gpu_blocks"]), ops)
            if reply is None or not reply.ok:
                probe = None
        if probe is not None:
            impact = _with_pressure(finding, impact, probe, None if reference_run is None else reference_run.label)
    return impact


def _over_estimate(answers) -> dict[str, Any] | None:
    """The first allocation that took more free blocks than its groups estimated."""
    for answer in answers:
        for part in answer.parts():
            for a in part.result.allocations:
                if a.allocated and a.free_after is not None and None not in a.estimates:
                    taken = a.free_before - a.free_after
                    if taken > sum(e for e in a.estimates if e is not None):
                        return {"free_before": a.free_before, "estimates": list(a.estimates), "taken": taken}
    return None


def _drive(proc, setup, ops) -> Reply | None:
    """The worker's reply to ``ops`` on a fresh engine of ``setup`` (None: vLLM refused the setup)."""
    opened = proc.session(OpenEngine(setup.message()))
    if not opened.ok:
        return None
    return proc.session(EngineOps(dict(op) for op in ops))


FILLERS = (1, 64, 65, 128, 129, 192)  # tokens of the request run beside the finding's (a prompt of its own)


def _beside(length: int) -> list[dict[str, Any]]:
    """A request of its own (no prefix shared with the engine differential's
    prompts), admitted and running before the finding's program starts."""
    return [{"do": "arrive", "id": "beside", "tokens": [2999 - i for i in range(length)], "max_tokens": 64},
            {"do": "step"}, {"do": "step"}]


def _probe_ops(probe: dict[str, Any], program) -> list[dict[str, Any]]:
    return _beside(probe["beside"]) + [dict(op) for op in program.ops]


def pressure_probe(proc, program) -> dict[str, Any] | None:
    """A block-estimate finding's allocation takes more free blocks than the
    admission gate counted: with the pool one block short of what it takes
    (a request of its own running beside it, and ``--num-gpu-blocks-override``
    lowered by the difference), does ``schedule()`` raise?  The first such
    configuration found (vLLM refusing a pool too small for the model is
    tried with a larger request beside it), or None."""
    for length in FILLERS:
        filler = _beside(length)
        ops = filler + [dict(op) for op in program.ops]
        reply = _drive(proc, program.setup, ops)
        if reply is None or not reply.ok:
            continue
        over = _over_estimate(reply.payload.answers[len(filler):])
        if over is None:
            continue
        short = over["free_before"] - (over["taken"] - 1)  # blocks to take away: one short of what it takes
        pool = program.setup.num_gpu_blocks - short
        if short <= 0 or pool <= 0:
            continue
        tight = attrs.evolve(program.setup, num_gpu_blocks=pool)
        reply = _drive(proc, tight, ops)
        if reply is None or reply.ok or reply.error.origin != "vllm":
            continue
        index = reply.error.index or 0
        frames = _FRAME.findall(reply.error.traceback or "")
        return {"num_gpu_blocks": pool, "beside": length, "error": reply.error.message,
                "function": frames[0] if frames else None, "op": dict(ops[index]) if index < len(ops) else None,
                "steps_before": sum(op.get("do") == "step" for op in ops[:index]),
                "estimates": over["estimates"], "taken": over["taken"], "free": over["taken"] - 1}
    return None


def _with_pressure(finding: Finding, impact: Impact, probe: dict[str, Any], reference_label: str | None) -> Impact:
    words = _crash_words({"function": probe["function"], "op": probe["op"], "error": probe["error"],
                          "steps_before": probe["steps_before"]})
    also = f"; the unmutated {reference_label} runs the same without raising" if reference_label else ""
    where = _config_words(finding)
    own = impact.summary
    if own.startswith(f"Measured {where}: "):
        own = own[len(f"Measured {where}: "):]
    summary = (f"Measured {where} with --num-gpu-blocks-override {probe['num_gpu_blocks']} instead and a "
               f"{probe['beside']}-token request of its own running beside the finding's (whose allocation then "
               f"finds {probe['free']} free blocks: enough for the groups' estimate {sum(probe['estimates'])}, one "
               f"short of the {probe['taken']} it takes): {words}{also}. At the finding's own pool: {own}")
    how = (f"{impact.how_measured}; then the finding's program with a request of its own run beside it and the "
           f"pool lowered until the over-estimated allocation finds one block fewer than it takes (the first such "
           f"configuration of requests beside of {', '.join(map(str, FILLERS))} tokens vLLM accepts)")
    return attrs.evolve(impact, kind="crash", summary=summary, measured=probe["steps_before"], expected=None,
                        unit="engine steps before the crash", how_measured=how)


def attach_engine_impact(proc, finding: Finding, say: Say = _quiet) -> Finding:
    """``finding`` with its measured impact; a measurement that fails is said, never fatal."""
    try:
        impact = measure_engine_impact(proc, finding, say)
    except Exception as exc:  # the measurement is evidence; its failure is said, not fatal
        impact = Impact("not_measured", f"Not measured: the measurement failed ({type(exc).__name__}: {exc}).",
                        how_measured="the finding's program driven on through vLLM's Scheduler (failed)")
    return attrs.evolve(finding, impact=impact)
