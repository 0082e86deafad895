"""Renders one ``Finding``: terminal text and Markdown for a pull-request comment.

Both lead with what a reviewer decides on, in this order: one sentence of
impact (the deployment-profile assessment, ``Finding.reach``, when there is
one; otherwise the finding's own geometry, said so), who is affected, the
minimal case, then the evidence (ledger, proofs, sweep, regression test),
how to reproduce it, the run's statistics and a glossary of every term the
report keeps.  Both read the same small tables and sentences, so a number is
never computed twice.  Markdown never shows a machine-local path (artifacts
by relative path or name) and escapes what a finding holds: a finding may
come from a file kvspec did not write.
"""

from __future__ import annotations

import os
import re
from typing import Any

from kvspec.model.finding import VLLM_TESTS_NOT_ASKED, Category, Finding, GroupRow

from .escape import code_span, fence, md_inline, path_safe, terminal

__all__ = ["group_table", "derivation_table", "subject_line", "impact_sentence", "impact_lines", "affected_lines",
           "sweep_lines", "vllm_tests_lines", "caught_by", "proposes_test", "run_line", "glossary", "public_label", "artifact_name", "render_text",
           "render_markdown"]

_LOCAL_PATH = re.compile(r"(?<![\w.:/-])(?:~|/)[^\s,;()`'\"]*")


def public_label(text: str) -> str:
    """``text`` without machine-local paths: each absolute or ``~`` path is
    cut to its last component (what is meant for a pull request never
    shows where a file sits on one machine)."""
    return _LOCAL_PATH.sub(lambda m: m.group(0).rstrip("/").rsplit("/", 1)[-1] or "/", text)


def artifact_name(path: str) -> str:
    """A stored artifact as a pull request can name it: relative to the
    working directory when it lies below it (how CI uploads the findings
    directory), else its file name alone."""
    path = str(path)
    if not os.path.isabs(os.path.expanduser(path)):
        return public_label(path)
    try:
        rel = os.path.relpath(path)
    except ValueError:
        rel = ""
    return rel if rel and not rel.startswith("..") else os.path.basename(path)


def _yes(value: Any) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _num(value: Any) -> str:
    return "-" if value is None else str(value)


def _tokens(count: Any) -> str:
    return f"{count} token" + ("" if count == 1 else "s")


_KINDS = {"full_attention": "full attention", "sliding_window": "sliding window",
          "mamba_align": "Mamba align"}


def _group_words(g: GroupRow) -> str:
    return (f"group {g.group} ({_KINDS.get(g.kind, g.kind)}, block {g.block_size}"
            f"{', EAGLE' if g.eagle else ''})")


def group_table(f: Finding) -> tuple[list[str], list[list[str]]]:
    headers = ["group", "kind", "block", "EAGLE", "spec tokens", "subject tokens", "lost tokens",
               "spec blocks", "subject blocks"]
    rows = []
    for g in f.groups:
        gap = g.token_gap
        rows.append([str(g.group), g.kind, str(g.block_size), _yes(g.eagle), _num(g.expected_tokens),
                     _num(g.observed_tokens), _num(gap), _num(g.expected_blocks),
                     _num(g.observed_blocks)])
    return headers, rows


def derivation_table(f: Finding) -> tuple[list[str], list[list[str]]]:
    headers = ["group", "side", "cached", "finalized", "aligned(finalized)",
               "min(finalized, aligned + B)", "EAGLE branch", "bound"]
    rows = []
    for g in f.groups:
        for side in (g.spec, g.subject):
            if side is None:
                continue
            rows.append([str(g.group), side.rule, _num(side.cached), _num(side.finalized),
                         _num(side.aligned_finalized), _num(side.eagle_bound),
                         _yes(side.eagle_branch), _num(side.bound)])
    return headers, rows


def subject_line(f: Finding) -> str:
    subject = f.compared.get("subject", {})
    parts = [subject.get("label", "?")]
    if subject.get("vllm_version"):
        parts.append(f"vLLM {subject['vllm_version']}")
    if subject.get("git_commit"):
        parts.append(f"commit {subject['git_commit'][:12]}")
    mutant = f.compared.get("mutant")
    if mutant:
        models = mutant.get("models_variant")
        # Findings stored before the side was recorded: a mutant without a
        # modelled variant was then always on the lookup side.
        side = {"state": "state side", "lookup": "lookup side"}.get(mutant.get("side", "lookup"), "lookup side")
        parts.append(f"kvspec mutant {mutant['operator']}" + (f" (models {models})" if models else f" ({side})"))
    return ", ".join(parts)


def _versions(f: Finding) -> str:
    v = f.compared.get("versions", {})
    return ", ".join(f"{k} {v[k]}" for k in ("kvspec", "z3", "hypothesis") if k in v)


def _label(f: Finding) -> str:
    return str(f.compared.get("subject", {}).get("label", "the subject"))


# -- what a reviewer decides on ------------------------------------------------

def _sweep_losses(f: Finding, group: int) -> list[tuple[int, int]]:
    """(n, spec minus subject) at every swept length where the group differs."""
    sweep = f.sweep or {}
    try:
        spec, subject = sweep["spec"][group], sweep["subject"][group]
    except (KeyError, IndexError, TypeError):
        return []
    return [(n, s - o) for n, s, o in zip(sweep.get("n", ()), spec, subject)
            if isinstance(s, int) and isinstance(o, int) and s != o]


def _closed_form(f: Finding) -> str | None:
    e = f.explanation
    if e is None or not e.loss_formula:
        return None
    # The catalog states its formula "... tokens per call where reachable,
    # 0 elsewhere": the formula itself is what precedes " tokens".
    return e.loss_formula.split(" tokens", 1)[0].strip() or None


def impact_sentence(f: Finding) -> str:
    """One sentence: how badly, and where -- the worst affected deployment
    when profiles were assessed, else this finding's own geometry (said so).
    A finding whose impact was measured on the subject (``Finding.impact``,
    ``kvspec.findings.impact``) leads with that measurement."""
    if f.impact is not None and (f.impact.kind != "not_measured" or f.reach is None):
        if f.reach is not None and f.reach.profiles:  # measured here; who else is affected, after it
            return f"{f.impact.summary} Deployments: {f.reach.summary}"
        return f.impact.summary
    if "program" in (f.inputs or {}):  # a stateful finding: what the engine showed of it, then the impact
        from kvspec.model.finding import hand_built_impact

        unmeasured = f.impact if f.impact is not None else hand_built_impact(f.category)
        if f.reach is None:
            return unmeasured.summary
        return ("Hardening, not a regression: " if f.reach.hardening else "") + f"{f.reach.summary}. " \
            + unmeasured.summary
    if "engine_program" in (f.inputs or {}):  # stored before engine impacts were measured
        return ("Not measured (this finding was stored before kvspec measured what a user sees; `kvspec replay` "
                "on it measures that)" + (f"; deployments: {f.reach.summary}" if f.reach is not None else "") + ".")
    if f.reach is not None:
        return ("Hardening, not a regression: " if f.reach.hardening else "") + f.reach.summary
    scope = "this finding's own geometry only; no deployment profile assessed"
    differing = f.differing_groups
    if f.category in (Category.UNDER_REGISTRATION, Category.OVER_REGISTRATION) and differing \
            and differing[0].token_gap:
        g = differing[0]
        gap = g.token_gap
        n = f.n
        if gap > 0:
            core = (f"a request whose computed tokens end at n = {n} leaves {gap} of its "
                    f"{g.expected_tokens} registrable tokens out of the prefix cache in {_group_words(g)}, "
                    "so a later request sharing that prefix recomputes them")
        else:
            core = (f"a request at n = {n} computed tokens has {-gap} more tokens registered in "
                    f"{_group_words(g)} than the spec allows (not finalized, or unreachable by a "
                    "lookup), so a later request may reuse KV that is not valid for it")
        losses = _sweep_losses(f, g.group)
        if losses and f.sweep:
            ns = f.sweep["n"]
            worst = max(abs(d) for _, d in losses)
            core += (f"; over single prefills of n = {ns[0]}..{ns[-1]} tokens, {len(losses)} of "
                     f"{len(ns)} lengths differ, by up to {_tokens(worst)}")
        formula = _closed_form(f)
        if formula and f.explanation.loss_predicted == f.explanation.loss_observed:
            core += f", as the proved closed form {formula} predicts"
        return f"For this finding's own geometry only (no deployment profile assessed), {core}."
    if f.category in (Category.LOOKUP_CONTRACT, Category.HIT_MISMATCH):
        return (f"For this finding's own geometry only (no deployment profile assessed), a later "
                f"request's prefix-cache hit is wrong: {f.category.meaning}.")
    if f.category.is_state or "program" in f.inputs:
        return (f"For this finding's own program only (no deployment profile assessed), vLLM's KV-cache "
                f"manager, driven as its scheduler drives it, ends in a state its own rules forbid: "
                f"{f.category.meaning}.")
    return f"Not quantified ({scope}): {f.category.meaning}."


def _profile_line(p: Any) -> str:
    if not isinstance(p, dict):
        return str(p)
    name = p.get("profile") or p.get("name") or p.get("label") or "profile"
    rest = [f"{k} {v}" for k, v in p.items() if k not in ("profile", "name", "label")
            and isinstance(v, (str, int, float, bool))]
    impact = p.get("impact")
    if isinstance(impact, dict):
        rest = [r for r in rest if not r.startswith("impact ")] + [
            f"{k} {v}" for k, v in impact.items() if isinstance(v, (str, int, float, bool))]
    return f"{name}" + (f": {', '.join(rest)}" if rest else "")


def affected_lines(f: Finding) -> list[str]:
    """Who is affected: the assessed deployment profiles, or why nobody can say yet."""
    # An engine finding is reached by its engine flags whatever the catalog says.
    reached = f.inputs.get("how_a_user_reaches_it") if isinstance(f.inputs, dict) else None
    if isinstance(reached, str) and (f.reach is None or not f.reach.profiles):
        catalog = ("no deployment profile of the catalog reaches it" if f.reach is not None
                   and "No known deployment" in f.reach.summary
                   else "no deployment profile of the catalog was checked for it")
        return [f"{reached}; {catalog}"]
    if f.reach is None:
        knobs = " (the configurations that take this branch are listed as knobs under the evidence)" \
            if f.explanation and f.explanation.knobs else ""
        return [f"not assessed: no deployment profile was checked for this finding{knobs}"]
    if not f.reach.profiles:
        engine = f.inputs.get("engine_reproduction") if isinstance(f.inputs, dict) else None
        driven = ("not reproduced through vLLM's engine in the search the impact line states" if engine
                  else "no engine configuration was driven for it")
        return ["no known deployment reaches it: hand-built geometry only (the catalog's profiles checked are "
                f"named in the impact line; {driven})"]
    out = [_profile_line(p) for p in f.reach.profiles]
    if f.reach.worst:
        out.append(f"worst affected: {_profile_line(f.reach.worst)}")
    return out


def impact_lines(f: Finding) -> list[str]:
    """How the impact was measured, and each resend's hit against the expected one."""
    i = f.impact
    if i is None or not i.how_measured or (i.kind == "not_measured" and not i.lookups):
        return []  # the impact sentence says it all
    out = [f"impact ({i.kind.replace('_', ' ')}): {i.how_measured}"]
    # The resends, and the program's own requests whose hit fell short of the expected one.
    shown = [r for r in i.lookups if r.get("resend_of") is not None or
             (r.get("hit") is not None and max(r.get("owed") or 0, r.get("reference_hit") or 0) > r["hit"])]
    for r in shown[:8]:
        parts = [f"hit {_num(r.get('hit'))}"]
        if r.get("owed") is not None:
            parts.append(f"kvspec's model owes {r['owed']}")
        if r.get("reference_hit") is not None:
            parts.append(f"{i.reference or 'the reference'} hits {r['reference_hit']}")
        if r.get("external"):
            parts.append(f"{r['external']} tokens from the KV connector")
        who = f"resend of {r['resend_of']}" if r.get("resend_of") is not None else f"request {r.get('request')}"
        out.append(f"{who} ({r.get('prompt_tokens')}-token prompt, admitted on a hit of {_num(r.get('hit'))}): {', '.join(parts[1:]) or 'nothing to compare'}")
    if len(shown) > 8:
        out.append(f"... {len(shown) - 8} more in the finding's JSON (impact.lookups)")
    return out


def _call_words(f: Finding) -> str:
    """The differing call, counted from 1 in words (``Finding.call`` is an index)."""
    if f.call is None:
        return ""
    return f"the request's cache_blocks call {f.call + 1} (counted from 1), "


def _minimal_line(f: Finding) -> str | None:
    if f.n is None:
        return None
    line = f"at {_call_words(f)}n = {f.n} computed tokens ({f.hashed_tokens} hashed)"
    differing = f.differing_groups
    if differing:
        g = differing[0]
        line += (f": {_group_words(g)} registers {_tokens(g.observed_tokens)} where the spec "
                 f"registers {g.expected_tokens}")
    return line


def _loss_lines(f: Finding) -> list[str]:
    e = f.explanation
    if e is None:
        return []
    out = []
    if e.loss_formula:
        status = next((t.status for t in e.theorems if t.name.startswith("loss.") and
                       "closed_form" in t.name), "?")
        out.append(f"loss ({status}): {e.loss_formula}; predicts {e.loss_predicted} here, "
                   f"{e.loss_observed} observed. \"Per call\" is one cache_blocks call's bound; "
                   "calls do not add up: registration accumulates, so what a request leaves "
                   "unregistered at its end is its last call's loss")
    elif e.loss_observed is not None:
        out.append(f"loss: {_tokens(e.loss_observed)} at this call, which a request ending here leaves "
                   "unregistered (no closed form in the catalog)")
    if e.worst_case:
        out.append(_worst_case_line(f))
    return out


def _finding_geometry(f: Finding) -> tuple[int, int] | None:
    """The finding's scheduler block S and its first differing group's block B."""
    config = f.inputs.get("config") if isinstance(f.inputs, dict) else None
    S = config.get("scheduler_block_size") if isinstance(config, dict) else None
    differing = f.differing_groups
    if not isinstance(S, int) or not differing:
        return None
    return S, differing[0].block_size


def _worst_case_scope(f: Finding) -> tuple[str | None, bool | None, str | None, str]:
    """The worst case's bounds, whether they cover the finding, what the
    closed form gives instead, and the finding's S in words."""
    e = f.explanation
    geometry = _finding_geometry(f)
    bounds, covers, here = e.worst_case_bounds, e.worst_case_covers, e.worst_case_here
    if bounds is None and geometry is not None:  # stored before the bounds were recorded
        from kvspec.proofs.explain import worst_case_scope

        scope = worst_case_scope(e.diagnosis, *geometry)
        if scope is not None:
            bounds, covers, here = scope.bounds, scope.covers, scope.here
    return bounds, covers, here, (f"this finding's S = {geometry[0]}" if geometry else "this finding's S")


def _worst_case_line(f: Finding) -> str:
    """A proved worst case with the bounds it was proved over; one that does
    not cover the finding's S is not printed as if it did."""
    e = f.explanation
    status = next((t.status for t in e.theorems if "worst_case" in t.name), "?")
    bounds, covers, here, S = _worst_case_scope(f)
    if bounds is None:
        return f"worst case ({status}): {e.worst_case}"
    if covers:
        return f"worst case ({status} over {bounds}, which covers {S}): {e.worst_case}"
    return (f"worst case ({status}) covers only {bounds}; {S} is outside it, so its figure does not apply "
            f"here" + (f"; instead, {here}" if here else ""))


def _explanation_lines(f: Finding) -> list[str]:
    e = f.explanation
    if e is None:
        return []
    out = [f"diagnosis: behaves like model variant {e.diagnosis}: {e.diagnosis_summary}"
           if e.diagnosis else f"diagnosis: {e.diagnosis_summary}"]
    out.append(f"nature: {e.nature}" + ("" if e.nature != "regression" else
                                         " (the subject loses what the spec registers)"))
    out += _loss_lines(f)
    if e.reachability:
        reach = next((t.status for t in e.theorems if t.name.startswith("reachability.")), "?")
        out.append(f"reachability ({reach}): {e.reachability}")
    out += [f"knob: {k}" for k in e.knobs]
    out += [f"intended by the spec: {d}" for d in e.intended_drop]
    if not e.intended_drop and e.nature == "regression":
        out.append("intended by the spec: nothing here -- the spec registers every token the "
                   "subject drops")
    return out


def _theorem_lines(f: Finding) -> list[str]:
    e = f.explanation
    if e is None:
        return []
    return [f"theorem {t.name}: {t.status}" + ("" if t.as_expected else " (NOT as expected)")
            + f" ({float(t.seconds):.2f} s)" for t in e.theorems]


def _ledger_line(f: Finding, label=lambda s: s) -> str | None:
    led = f.ledger
    if led is None:
        return None
    legs = (f"Z3 spec {list(led.z3_spec) if led.z3_spec is not None else '-'}, "
            f"oracle {list(led.oracle) if led.oracle is not None else '-'}, "
            f"{label(led.subject_label)} {list(led.subject) if led.subject is not None else '-'}")
    line = f"ledger: {legs} -> {led.blame.value}" + (f" ({led.note})" if led.note else "")
    rc = led.real_code
    if rc:
        line += f"; real code, symbolically: {rc['status']}"
        if rc.get("recorded"):
            line += f" (recorded {rc['recorded']} on the same tree and kvspec code, reused)"
        cx = rc.get("counterexample")
        if cx:
            line += " at " + ", ".join(f"{k}={v}" for k, v in cx["args"].items()) + \
                f" (vLLM {cx['real']}, spec {cx['spec']})"
        line += f" -- {led.real_code_reading}"
    return line


def sweep_lines(f: Finding) -> list[str]:
    """Per group and per prompt length, what the sweep's single prefills
    showed (each length is its own request: no sum over them means anything)."""
    sweep = f.sweep
    if not sweep:
        return []
    ns = sweep["n"]
    out = [f"sweep: one request per prompt length n = {ns[0]}..{ns[-1]}, a single prefill each, "
           f"on a fresh cache; the subject differs at {len(sweep['differing_n'])} of {len(ns)} lengths"]
    for g in range(len(sweep.get("spec", ()))):
        losses = _sweep_losses(f, g)
        if not losses:
            continue
        row = f.groups[g] if g < len(f.groups) else None
        who = _group_words(row) if row else f"group {g}"
        fewer = [(n, d) for n, d in losses if d > 0]
        more = [(n, -d) for n, d in losses if d < 0]
        for words, items in (("fewer", fewer), ("more", more)):
            if not items:
                continue
            amounts = {d for _, d in items}
            shown = items[:8]
            if len(amounts) == 1:
                each = _tokens(amounts.pop())
                lengths = ", ".join(str(n) for n, _ in shown) + (", ..." if len(items) > 8 else "")
                out.append(f"{who} registers {each} {words} than the spec at each of n = {lengths}")
            else:
                pairs = ", ".join(f"n = {n}: {d}" for n, d in shown) + (", ..." if len(items) > 8 else "")
                out.append(f"{who} registers fewer tokens than the spec ({pairs})" if words == "fewer"
                           else f"{who} registers more tokens than the spec ({pairs})")
    return out


# A pytest node id of vLLM's tests, as kvspec prints it (a finding may come
# from a file kvspec did not write: anything else is not shown as a test).
_TEST_FILE = re.compile(r"tests/[\w/.-]+\.py")
_NODE_ID = re.compile(_TEST_FILE.pattern + r"(?:::[\w.-]+)+(?:\[[\w.,=+-]*\])?")


def caught_by(f: Finding) -> list[str]:
    """vLLM's own tests that fail on the subject and pass on its release."""
    asked = f.vllm_tests if isinstance(f.vllm_tests, dict) else {}
    nodes = asked.get("caught_by")
    return [n for n in nodes if isinstance(n, str) and _NODE_ID.fullmatch(n)] if isinstance(nodes, list) else []


def proposes_test(f: Finding) -> bool:
    """Whether the report offers kvspec's test (not when vLLM's already catch it)."""
    return bool(f.regression_test) and f.regression_test.get("proposed", True) is not False and not caught_by(f)


def _side(run: Any) -> str:
    if not isinstance(run, dict):
        return "not run"
    failing = len(run.get("failed") or ()) + len(run.get("errors") or ())
    words = f"{run.get('passed', '?')} of {run.get('tests', '?')} pass"
    if run.get("outcome") == "error":
        words += f", the run did not finish ({run.get('summary', '')})"
    elif failing:
        words += f", {failing} fail"
    if run.get("reused"):
        words += f" (recorded {run.get('recorded', '?')}, reused: same tree, tests and runtime)"
    elif isinstance(run.get("seconds"), (int, float)):
        words += f" ({float(run['seconds']):.0f} s)"
    return words


def vllm_tests_lines(f: Finding, label=lambda s: s) -> list[str]:
    """What vLLM's own tests said about the subject, first among the tests."""
    asked = f.vllm_tests
    if not isinstance(asked, dict):
        return []
    if asked.get("asked") is False:  # the reason is kvspec's own text, chosen by a known key
        why = VLLM_TESTS_NOT_ASKED.get(asked.get("why_not"))  # type: ignore[arg-type]
        return [f"vLLM's own tests not asked: {why}"] if why else []
    files = [n for n in asked.get("files") or () if isinstance(n, str) and _TEST_FILE.fullmatch(n)]
    subject, baseline = asked.get("subject"), asked.get("baseline")
    line = (f"asked first, vLLM's own tests ({', '.join(files)}): on "
            f"{label(str((subject or {}).get('against', 'the subject')))} {_side(subject)}")
    if baseline is not None:
        line += f"; on {label(str((baseline or {}).get('against', 'the release')))} {_side(baseline)}"
    caught = caught_by(f)
    if caught:
        shown = ", ".join(caught[1:4]) + (", ..." if len(caught) > 4 else "")
        more = f" (and {len(caught) - 1} more: {shown})" if len(caught) > 1 else ""
        return [line, f"already caught by {caught[0]}{more}: it fails on the subject"
                + (" and passes on the release" if baseline is not None else "")
                + "; kvspec proposes no test of its own"]
    if isinstance(subject, dict) and subject.get("outcome") == "passed":
        return [line, f"not caught by vLLM's tests: its {subject.get('tests', '?')} CPU tests of these files "
                      "pass on it"]
    return [line]


def _caught_already(which: str) -> str:
    return (f"the test kvspec emitted {which}: not proposed (vLLM's own test above already catches the finding); "
            "stored with the finding as an artifact only, not run")


def _test_lines(f: Finding, label=lambda s: s) -> list[str]:
    t = f.regression_test
    if not t:
        return []
    from kvspec.emit.regression_test import FILE_NAME

    if f.compared.get("differential") in ("stateful", "engine"):
        return _stateful_test_lines(f, label)
    where = f"tests/v1/core/{FILE_NAME}"
    if not proposes_test(f):
        return [_caught_already(f"for {where}")]
    module = t.get("module")
    if isinstance(module, str) and _TEST_FILE.fullmatch(module):
        where += f", to merge into {module} (the release's module that already covers this)"
    checks = []
    for c in t.get("verified", ()):
        outcome = c["outcome"]
        if outcome == "failed" and c.get("as_expected"):
            outcome = "failed on its assertion"
        checks.append(f"{outcome} on {label(c['against'])}"
                      + ("" if c.get("as_expected") else f" (it must have {c['must']})"))
    lint = t.get("lint")
    if lint:
        checks.append(f"ruff check and ruff format --check with the release's configuration: "
                      f"{lint['outcome']}")
    out = [f"regression test for {where}" + (f": {'; '.join(checks)}" if checks else " (not run)")]
    return out


def _check_words(c: dict[str, Any], label) -> str:
    """One run of an emitted test: its outcome, how it failed, where."""
    outcome = str(c.get("outcome"))
    if c.get("cannot_run"):
        return str(c["cannot_run"])
    if outcome == "failed" and c.get("failure"):
        outcome = f"failed on {c['failure']}"
    words = f"{outcome} on {label(str(c.get('against')))}"
    return words + ("" if c.get("as_expected") else f" (it must have {c.get('must')})")


def _stateful_test_lines(f: Finding, label) -> list[str]:
    """A stateful finding's test: the module it extends, both runs, the lint."""
    t = f.regression_test
    name = t.get("test_name")
    if caught_by(f):  # (vLLM's own test that catches it is said on its own line)
        return [_caught_already(f"({name})")] if isinstance(name, str) and name.isidentifier() else []
    if name is None and t.get("why_not_proposed"):  # none written: why, in one line
        return [f"no regression test: {t['why_not_proposed'].removeprefix('no test written: ')}"]
    name = name if isinstance(name, str) and name.isidentifier() else "the test"
    module = t.get("module")
    where = (f"{name}, to add to {module} (the release's test module that covers this)"
             if isinstance(module, str) and _TEST_FILE.fullmatch(module) else f"{name}, for tests/v1/core")
    checks = [_check_words(c, label) for c in t.get("verified", ()) if isinstance(c, dict)]
    if t.get("other_side"):
        checks.append(f"not run where the bug is absent: {t['other_side']}")
    lint = t.get("lint")
    if isinstance(lint, dict):
        checks.append(f"ruff check and ruff format --check with the release's configuration: {lint.get('outcome')}")
    else:
        checks.append("ruff not run (ruff or the release's configuration unavailable)")
    if t.get("proposed") is False and t.get("why_not_proposed"):
        checks.append(f"not proposed: {t['why_not_proposed']}")
    return [f"regression test {where}: {'; '.join(checks)}"]


def run_line(f: Finding) -> str | None:
    """The run's statistics, each under its exact name."""
    r = f.run
    if not r:
        return None
    parts = []
    if "seed" in r:
        parts.append(f"seed {r['seed']}")
    if "examples" in r or "cases" in r:
        parts.append(f"{r.get('examples', '?')} Hypothesis examples, {r.get('cases', '?')} differential cases")
    if r.get("cases_to_first_failure") is not None:
        at = r.get("seconds_to_first_failure")
        parts.append(f"first discrepancy after {r['cases_to_first_failure']} cases"
                     + (f" ({float(at):.2f} s into fuzzing)" if at is not None else ""))
    if "seconds" in r:
        parts.append(f"fuzzing and shrinking {float(r['seconds']):.2f} s in all"
                     if f.source == "fuzz" else f"solver {float(r['seconds']):.2f} s")
    if "flaky" in r:
        parts.append("flaky" if r["flaky"] else "not flaky")
    if r.get("shrink_budget"):
        parts.append(f"shrinking stopped at its budget of {r['shrink_budget']} test runs "
                     "(the example shown is the smallest failing one found within it)")
    stages = r.get("completion_seconds")
    if isinstance(stages, dict) and stages:
        parts.append("completing the finding: " + ", ".join(
            f"{k} {float(v):.1f} s" for k, v in stages.items() if isinstance(v, (int, float))))
    if r.get("stopped"):
        parts.append(f"stopped: {r['stopped']}")
    return "; ".join(parts)


def _reproduce(f: Finding, path=lambda p: p) -> list[str]:
    """Commands that reproduce the finding (from validated fields only)."""
    from kvspec.model.errors import InputError

    out = []
    stored = f.artifacts.get("finding") if isinstance(f.artifacts, dict) else None
    if path_safe(path(stored)) if isinstance(stored, str) else False:
        out.append(f"kvspec replay {path(stored)}")
    elif f.replay:  # the file's own replay line is never copied: a placeholder for its path
        out.append("kvspec replay FINDING.json")
    subject = f.compared.get("subject", {}) or {}
    seed = f.run.get("seed") if f.run else None
    if f.source == "fuzz" and isinstance(seed, int):
        version, mutant = subject.get("version"), subject.get("mutant")
        # The differential that found it: a program is the stateful one's, an
        # engine program the engine one's, a case with a later lookup the
        # hit-length one's (registration included).
        inputs = f.inputs if isinstance(f.inputs, dict) else {}
        differential = (" --stateful" if "program" in inputs else " --engine" if "engine_program" in inputs
                        else " --lookup" if isinstance(inputs.get("probe"), dict) else "")
        if subject.get("kind") in ("release", "mutant") and isinstance(version, str) \
                and re.fullmatch(r"\d+\.\d+\.\d+(\.post\d+)?", version):
            command = f"kvspec fuzz --vllm {version}"
            if isinstance(mutant, str) and re.fullmatch(r"[a-z0-9_]+", mutant):
                command += f" --mutant {mutant}"
            out.append(f"{command}{differential} --seed {seed}")
            reproduction = inputs.get("engine_reproduction")
            if isinstance(reproduction, dict) and reproduction.get("status") == "reproduced":
                stored_as = path(stored) if isinstance(stored, str) and path_safe(path(stored)) else "FINDING.json"
                run = command.replace("kvspec fuzz", "kvspec run", 1)
                out.append(f"{run} --engine-program {stored_as}   # through vLLM's Scheduler")
        elif subject.get("kind") == "source":
            out.append(f"kvspec fuzz --vllm-src YOUR_VLLM_TREE{differential} --seed {seed}")
    caught = caught_by(f)
    if caught:
        out.append(f"pytest '{caught[0]}'   # vLLM's own test, failing on the subject's tree")
    elif f.source == "fuzz" and f.compared.get("differential") == "engine":
        from kvspec.emit.engine_test import engine_test_name

        # From the rule (free_order's part by its fixed words), never copied from the finding's text.
        name = engine_test_name(f)
        if name and proposes_test(f):
            out.append(f"pytest tests/v1/core/{name}.py::{name}   # in a vLLM checkout, with the test added")
    elif f.source == "fuzz" and f.regression_test:
        from kvspec.emit.regression_test import pytest_command

        try:
            out.append(pytest_command(f) + "   # in a vLLM checkout, with the test added")
        except InputError:
            pass
    return out


# -- glossary -----------------------------------------------------------------

_GLOSSARY = (
    (r"\bspec\b", "spec", "kvspec's reference rule (model.spec.registration_bound): the most tokens "
     "each KV-cache group may register in the prefix cache after a cache_blocks call"),
    (r"\bsubject\b", "subject", "the vLLM under test"),
    (r"\bn = |\bn=", "n", "the tokens a request has computed when cache_blocks is called"),
    (r"\bS\b|\bS=", "S", "the scheduler block size (vLLM sizes it to the Mamba page on hybrids)"),
    (r"\bH=|hash block", "H", "the hash block size: the granularity of prefix-cache hashes"),
    (r"\bB\b|\bB=|\bblock \d", "B", "a group's own block size"),
    (r"\bL\b|\bL=|lookahead", "L", "num_prefill_lookahead (multi-module MTP)"),
    (r"\bR\b|\bR =", "R", "max(0, L - 1): tokens the next step may recompute, never registered"),
    (r"S_max", "S_max", "the largest scheduler block the worst-case proof covers"),
    (r"\(P\)|\(E\)|\bP\b|\bE\b|P/E", "P / E",
     "P: partial hash hits are on (hits may end mid scheduler block); E: the group is an EAGLE group "
     "(it drops its last block, which the draft model rewrites)"),
    (r"partial hash hits|partial hits", "partial hash hits",
     "vLLM's mode in which a hit may end at any hash block, not only at a scheduler block"),
    (r"\bregime\b", "regime", "the flags (partial hash hits, EAGLE per group) the coordinator derives "
     "from the configuration; they choose the branch of the rule"),
    (r"\bledger\b", "ledger", "the three-way check: the spec evaluated by Z3, the oracle, the subject "
     "(and the subject's code checked symbolically); which pair disagrees names the blame"),
    (r"\boracle\b", "oracle", "kvspec's executable model that predicts each group's bound from the "
     "configuration alone"),
    (r"aligned\(", "aligned(x)", "x rounded down to the scheduler block (to the hash block under "
     "partial hash hits)"),
    (r"\bcases?\b", "case / example", "a differential case is one request compared with the spec at "
     "every cache_blocks call; a Hypothesis example draws one configuration and a batch of cases"),
)


def glossary(text: str) -> list[tuple[str, str]]:
    """Each term the report uses, defined once (terms it does not use are left out)."""
    return [(term, meaning) for pattern, term, meaning in _GLOSSARY if re.search(pattern, text)]


# -- text -------------------------------------------------------------------------

def _aligned(headers: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    def line(cells: list[str]) -> str:
        return indent + "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    return [line(headers)] + [line(r) for r in rows]


def render_text(f: Finding) -> str:
    out = [f"IMPACT: {impact_sentence(f)}"]
    affected = affected_lines(f)
    if len(affected) == 1:
        out.append(f"  who is affected: {affected[0]}")
    else:
        out += ["  who is affected:", *[f"    {line}" for line in affected]]
    out += [f.verdict,
            f"  compared: {f.compared.get('spec_rule')} vs {subject_line(f)} ({_versions(f)})",
            f"  configuration: {f.compared.get('configuration') or 'not recorded (a finding from before kvspec said)'}",
            f"  category: {f.category.title}: {f.category.meaning}",
            f"  minimal case: {f.inputs.get('describe')}"]
    minimal = _minimal_line(f)
    if minimal:
        out.append(f"  {minimal}")
    if f.groups:
        out += _aligned(*group_table(f))
        out.append("  derivation:")
        out += _aligned(*derivation_table(f), indent="    ")
    evidence = [line for line in (_ledger_line(f),) if line] + impact_lines(f) + _explanation_lines(f) \
        + sweep_lines(f) + vllm_tests_lines(f) + _test_lines(f) + _theorem_lines(f)
    if evidence:
        out.append("  evidence:")
        out += [f"    {line}" for line in evidence]
    if f.detail and not f.groups:
        out.append(f"  detail: {f.detail}")
    if f.traceback:
        out.append("  vLLM traceback (last lines):")
        out += ["    " + text for text in f.traceback.strip().splitlines()[-6:]]
    reproduce = _reproduce(f)
    if reproduce:
        out.append("  reproduce:")
        out += [f"    {line}" for line in reproduce]
    run = run_line(f)
    if run:
        out.append(f"  run: {run}")
    terms = glossary("\n".join(out))
    if terms:
        out.append("  glossary:")
        out += [f"    {term}: {meaning}" for term, meaning in terms]
    return terminal("\n".join(out))


# -- Markdown -----------------------------------------------------------------------

# Every field shown goes through kvspec.report.escape (one escaping module).
_md, _code_span, _fence = md_inline, code_span, fence


def _md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r in rows:
        out.append("| " + " | ".join(r) + " |")
    return out


def _fold(summary: str, body: list[str]) -> list[str]:
    return [f"<details><summary>{summary}</summary>", "", *body, "", "</details>", ""]


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _stateful_test_fold(f: Finding) -> list[str]:
    """A stateful finding's test, emitted anew from its recorded calls
    (validated by the emitter: plain ids, whole numbers, known calls)."""
    from kvspec.emit.stateful_test import emit_stateful_test
    from kvspec.emit.vllm_tests import Idiom

    t = f.regression_test or {}
    trace = t.get("trace")
    if not isinstance(trace, list) or not all(isinstance(e, dict) for e in trace):
        return []
    code = emit_stateful_test(f, trace, f.subject_capabilities(), Idiom.from_recorded(t.get("idiom")))
    if code is None:
        return []
    module = t.get("module")
    where = module if isinstance(module, str) and _TEST_FILE.fullmatch(module) else "tests/v1/core"
    body = [f"Add to `{where}` of vLLM (as its own file it runs as is: it imports the release's helpers):",
            "", *_fence(code, "python")]
    return _fold(f"Regression test for {where}", body)


def _engine_test_fold(f: Finding) -> list[str]:
    """An engine finding's test, emitted anew from its engine program and
    settings (validated by the emitter: known model, numbers, plain ids)."""
    from kvspec.emit.engine_test import rendered_engine_test

    version = (f.compared.get("subject") or {}).get("version")
    code = rendered_engine_test(f, version if isinstance(version, str) else "")
    if code is None:
        return []
    from kvspec.emit.engine_test import engine_test_name

    module = (f.regression_test or {}).get("module")
    if isinstance(module, str) and _TEST_FILE.fullmatch(module):
        where, how = module, f"Add to `{module}`"
    else:
        where = f"tests/v1/core/{engine_test_name(f)}.py"  # free_order: its part's name
        how = f"Add as `{where}`"
    body = [f"{how} of vLLM (it imports vLLM and torch only and builds its scheduler from the settings vLLM "
            "derived):", "", *_fence(code, "python")]
    return _fold(f"Regression test for {where}", body)


def _regression_test_code(f: Finding, xfail: bool = False) -> str | None:
    """The test, emitted anew from the finding's (validated) inputs: code is
    never copied from a finding into a report."""
    from kvspec.model.errors import InputError

    from kvspec.emit.regression_test import emit_test
    from kvspec.emit.vllm_tests import Idiom

    idiom = Idiom.from_recorded((f.regression_test or {}).get("idiom"))
    try:
        return emit_test(f, f.subject_capabilities(), idiom, xfail=xfail)
    except InputError:
        return None


def _sweep_table(f: Finding) -> list[str]:
    """The plot's content as a small table: the lengths where a group differs."""
    sweep = f.sweep or {}
    rows = []
    for g in range(len(sweep.get("spec", ()))):
        for n, d in _sweep_losses(f, g)[:12]:
            i = sweep["n"].index(n)
            rows.append([str(g), str(n), _num(sweep["spec"][g][i]), _num(sweep["subject"][g][i]), str(d)])
    if not rows:
        return []
    return _md_table(["group", "n", "spec tokens", "subject tokens", "lost tokens"], rows)


def render_markdown(f: Finding, heading: str = "###", plot_path: str | None = None,
                    lead: bool = True) -> str:
    """The finding as a pull-request comment.  ``plot_path``: the image to
    embed (shown by relative path or artifact name); by default the stored
    PNG.  ``lead=False`` leaves out the impact line (a fuzz report puts it
    first for the whole run)."""
    def label(s: object) -> str:
        return public_label(str(s))
    out = [f"**Impact:** {_md(public_label(impact_sentence(f)))}", ""] if lead else []
    out += [f"{heading} {_md(public_label(f.verdict))}", ""]
    affected = affected_lines(f)
    if len(affected) == 1:
        out += [f"**Who is affected:** {_md(affected[0])}", ""]
    else:
        out += ["**Who is affected:**", "", *[f"- {_md(line)}" for line in affected], ""]
    out += [f"**Minimal case:** {_code_span(f.inputs.get('describe'))}"
            + (f" -- {_md(_minimal_line(f))}." if _minimal_line(f) else ""), ""]
    if f.groups:
        headers, rows = group_table(f)
        rows = [[_md(cell) for cell in row] for row in rows]
        for r, g in zip(rows, f.groups):
            if g.differs:
                r[5] = f"**{r[5]}**"
        out += _md_table(headers, rows) + [""]
    out += [f"Compared: {_md(f.compared.get('spec_rule'))} vs **{_md(label(subject_line(f)))}** "
            f"({_md(_versions(f))}); category **{f.category.title}** ({f.category.meaning}).", "",
            f"Configuration: {_md(f.compared.get('configuration') or 'not recorded')}.", ""]
    evidence = []
    if f.ledger is not None:
        evidence.append(f"**Ledger verdict: {_md(f.ledger.blame.value)}** -- {_md(_ledger_line(f, label))}")
    evidence += [_md(_sentence(public_label(line))) for line in impact_lines(f)]
    evidence += [_md(_sentence(line)) for line in _explanation_lines(f)]
    evidence += [_md(_sentence(line)) for line in sweep_lines(f)]
    evidence += [_md(_sentence(line)) for line in vllm_tests_lines(f, label) + _test_lines(f, label)]
    if evidence:
        out += ["**Evidence**", ""] + [f"- {line}" for line in evidence] + [""]
    image = plot_path or f.artifacts.get("plot_png") or f.artifacts.get("plot")
    table = _sweep_table(f)
    if image and f.sweep and path_safe(artifact_name(image)) and artifact_name(image).endswith((".png", ".svg")):
        name = artifact_name(image)  # a relative image file only: never a URL a reader's browser fetches
        out += [f"![Registered vs computed tokens, spec vs subject]({_md(name).replace(' ', '%20')})", "",
                f"Plot: {_code_span(name)} (stored with the finding; a CI run uploads it with the "
                "findings directory).", ""]
        if table:
            out += _fold("The plot as a table", table)
    elif table:
        out += ["Where the sweep differs:", "", *table, ""]
    if f.groups:
        headers, rows = derivation_table(f)
        out += _fold("Derivation (spec and subject)", _md_table(headers, [[_md(c) for c in r] for r in rows]))
    stateful = f.compared.get("differential") == "stateful"
    if stateful and f.source == "fuzz" and proposes_test(f):
        out += _stateful_test_fold(f)
    engine = f.compared.get("differential") == "engine"
    if engine and f.source == "fuzz" and proposes_test(f):
        out += _engine_test_fold(f)
    code = (_regression_test_code(f) if f.source == "fuzz" and proposes_test(f) and not stateful and not engine
            else None)
    if code is not None:
        t = f.regression_test or {}
        from kvspec.emit.regression_test import FILE_NAME, xfail_decorator

        body = [f"Add as `tests/v1/core/{FILE_NAME}` of vLLM:", "", *_fence(code, "python"), "",
                f"To pin the defect until it is fixed instead, decorate the test with "
                f"{_code_span(xfail_decorator(f))} (and `import pytest`): it passes while vLLM "
                "is wrong and fails the day the fix lands."]
        if t.get("lint") and t["lint"].get("outcome") != "passed":
            body.append("")
            body += _fence(str(t["lint"].get("output", "")))
        out += _fold(f"Regression test for tests/v1/core/{FILE_NAME}", body)
    reproduce = _reproduce(f, artifact_name)
    if reproduce:
        out += ["**Reproduce**", "", *_fence("\n".join(reproduce), "bash"), ""]
    if f.explanation is not None and f.explanation.theorems:
        bounds, covers, _, S = _worst_case_scope(f) if f.explanation.worst_case else (None, None, None, "")
        outside = f" (proved over {bounds} only: {S} is outside it)" if bounds and covers is False else ""
        out += _fold("Theorems behind the explanation", [
            f"- {_code_span(t.name)}: {_md(t.status)}{'' if t.as_expected else ' (NOT as expected)'} "
            f"({float(t.seconds):.2f} s): "
            + (f"{_md(bounds)}: not stated here{_md(outside)}" if outside and "worst_case" in t.name
               else _md(t.statement)) for t in f.explanation.theorems])
    if f.detail and not f.groups:
        out += [f"Detail: {_md(label(f.detail))}", ""]
    if f.traceback:
        out += _fold("vLLM traceback", _fence(public_label(str(f.traceback)).strip()))
    run = run_line(f)
    if run:
        out += _fold("Run statistics", [_md(label(run))])
    terms = glossary("\n".join(out))
    if terms:
        out += _fold("Glossary", [f"- **{term}**: {_md(meaning)}" for term, meaning in terms])
    return "\n".join(out) + "\n"
