"""Renders one ``Finding``: terminal text and Markdown for a pull-request comment.

Both read the same small tables (``group_table``, ``derivation_table``) so a
number can never be computed twice; Markdown puts the verdict first, a table
per group, and folds the details.
"""

from __future__ import annotations

import html
import re
from typing import Any

from kvspec.model.finding import Finding

__all__ = ["group_table", "derivation_table", "subject_line", "render_text", "render_markdown"]


def _yes(value: Any) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _num(value: Any) -> str:
    return "-" if value is None else str(value)


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
        parts.append(f"kvspec mutant {mutant['operator']}"
                     + (f" (models {models})" if models else " (lookup side)"))
    return ", ".join(parts)


def _versions(f: Finding) -> str:
    v = f.compared.get("versions", {})
    return ", ".join(f"{k} {v[k]}" for k in ("kvspec", "z3", "hypothesis") if k in v)


def _per_group(f: Finding) -> str | None:
    if not f.groups:
        return None
    expected = [g.expected_tokens for g in f.groups]
    observed = [g.observed_tokens for g in f.groups]
    return f"per-group tokens: spec {expected} vs subject {observed}"


def _ledger_line(f: Finding) -> str | None:
    led = f.ledger
    if led is None:
        return None
    legs = (f"Z3 spec {list(led.z3_spec) if led.z3_spec is not None else '-'}, "
            f"oracle {list(led.oracle) if led.oracle is not None else '-'}, "
            f"{led.subject_label} {list(led.subject) if led.subject is not None else '-'}")
    line = f"ledger: {legs} -> {led.blame.value}" + (f" ({led.note})" if led.note else "")
    rc = led.real_code
    if rc:
        line += f"; real code, symbolically: {rc['status']}"
        cx = rc.get("counterexample")
        if cx:
            line += " at " + ", ".join(f"{k}={v}" for k, v in cx["args"].items()) + \
                f" (vLLM {cx['real']}, spec {cx['spec']})"
        line += f" -- {led.real_code_reading}"
    return line


def _explanation_lines(f: Finding) -> list[str]:
    e = f.explanation
    if e is None:
        return []
    out = [f"diagnosis: behaves like model variant {e.diagnosis}: {e.diagnosis_summary}"
           if e.diagnosis else f"diagnosis: {e.diagnosis_summary}"]
    out.append(f"nature: {e.nature}" + ("" if e.nature != "regression" else
                                         " (the subject loses what the spec registers)"))
    if e.loss_formula:
        loss_status = next((t.status for t in e.theorems if t.name.startswith("loss.") and
                            "closed_form" in t.name), "?")
        out.append(f"loss ({loss_status}): {e.loss_formula}; predicts {e.loss_predicted} here, "
                   f"{e.loss_observed} observed")
    elif e.loss_observed is not None:
        out.append(f"loss: {e.loss_observed} tokens at this call (no closed form in the catalog)")
    if e.worst_case:
        worst = next((t.status for t in e.theorems if "worst_case" in t.name), "?")
        out.append(f"worst case ({worst}): {e.worst_case}")
    if e.reachability:
        reach = next((t.status for t in e.theorems if t.name.startswith("reachability.")), "?")
        out.append(f"reachability ({reach}): {e.reachability}")
    out += [f"knob: {k}" for k in e.knobs]
    out += [f"intended by the spec: {d}" for d in e.intended_drop]
    if not e.intended_drop and e.nature == "regression":
        out.append("intended by the spec: nothing here -- the spec registers every token the "
                   "subject drops")
    out += [f"theorem {t.name}: {t.status}" + ("" if t.as_expected else " (NOT as expected)")
            + f" ({t.seconds:.2f} s)" for t in e.theorems]
    return out


def sweep_line(f: Finding) -> str | None:
    """How widespread the difference is over the sweep's single prefills."""
    sweep = f.sweep
    if not sweep:
        return None
    ns, differing = sweep["n"], sweep["differing_n"]
    lost = sum(s - o for g in range(len(sweep["spec"]))
               for s, o in zip(sweep["spec"][g], sweep["subject"][g]) if s is not None and o is not None)
    shown = ", ".join(map(str, differing[:8])) + (", ..." if len(differing) > 8 else "")
    return (f"sweep of single prefills n = {ns[0]}..{ns[-1]}: the subject differs at "
            f"{len(differing)} of {len(ns)} lengths" + (f" (n = {shown})" if differing else "")
            + f"; net tokens lost over the sweep: {lost}")


def _test_line(f: Finding) -> str | None:
    t = f.regression_test
    if not t:
        return None
    checks = "; ".join(
        f"{c['outcome']} on {c['against']}" + ("" if c.get("as_expected") else f" (it must have {c['must']})")
        for c in t.get("verified", ()))
    return (f"regression test {t['file_name']} for tests/v1/core/"
            + (f": {checks}" if checks else " (not run)"))


def _aligned(headers: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = lambda cells: indent + "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    return [line(headers)] + [line(r) for r in rows]


def render_text(f: Finding) -> str:
    out = [f.verdict, f"  compared: {f.compared.get('spec_rule')} vs {subject_line(f)} ({_versions(f)})",
           f"  category: {f.category.title}: {f.category.meaning}",
           f"  minimal inputs: {f.inputs.get('describe')}"]
    if f.n is not None:
        call = "" if f.call is None else f"cache_blocks call {f.call}, "
        out.append(f"  at {call}n = {f.n} computed tokens, {f.hashed_tokens} hashed")
    if f.groups:
        out += _aligned(*group_table(f))
        out.append(f"  {_per_group(f)}")
        out.append("  derivation:")
        out += _aligned(*derivation_table(f), indent="    ")
    for line in (_ledger_line(f), sweep_line(f), _test_line(f)):
        if line:
            out.append(f"  {line}")
    out += [f"  {line}" for line in _explanation_lines(f)]
    if f.detail and not f.groups:
        out.append(f"  detail: {f.detail}")
    if f.traceback:
        out.append("  vLLM traceback (last lines):")
        out += ["    " + l for l in f.traceback.strip().splitlines()[-6:]]
    if f.replay:
        out.append(f"  replay: {f.replay}")
    return "\n".join(out)


def _md(text: Any) -> str:
    """Text from a finding, safe inline in Markdown: no raw HTML, no new
    block (a finding may come from a file kvspec did not write)."""
    return (html.escape(str(text), quote=False).replace("\r", " ").replace("\n", " ")
            .replace("|", "\\|"))


def _code_span(text: Any) -> str:
    body = str(text).replace("\r", " ").replace("\n", " ")
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", body)), default=0) + 1)
    pad = " " if body.startswith("`") or body.endswith("`") else ""
    return f"{ticks}{pad}{body}{pad}{ticks}"


def _fence(text: str, lang: str = "") -> list[str]:
    """A fenced block no line of ``text`` can close early."""
    ticks = "`" * max(3, max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    return [f"{ticks}{lang}", text.rstrip(), ticks]


def _md_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r in rows:
        out.append("| " + " | ".join(r) + " |")
    return out


def _fold(summary: str, body: list[str]) -> list[str]:
    return [f"<details><summary>{summary}</summary>", "", *body, "", "</details>", ""]


def _regression_test_code(f: Finding) -> str | None:
    """The test, emitted anew from the finding's (validated) inputs: code is
    never copied from a finding into a report."""
    from kvspec.model.errors import InputError

    from .regression_test import emit_test

    try:
        return emit_test(f, f.subject_capabilities())
    except InputError:
        return None


def render_markdown(f: Finding, heading: str = "###", plot_path: str | None = None) -> str:
    out = [f"{heading} {_md(f.verdict)}", ""]
    if f.ledger is not None:
        out += [f"**Ledger verdict: {_md(f.ledger.blame.value)}**", ""]
    out += [f"Compared: {_md(f.compared.get('spec_rule'))} vs **{_md(subject_line(f))}** ({_md(_versions(f))})",
            "", f"Category: **{f.category.title}** ({f.category.meaning})", "",
            f"Minimal inputs: {_code_span(f.inputs.get('describe'))}", ""]
    if f.n is not None:
        call = "" if f.call is None else f"`cache_blocks` call {_md(f.call)}, "
        out += [f"At {call}n = {_md(f.n)} computed tokens ({_md(f.hashed_tokens)} hashed): "
                f"{_md(_per_group(f))}.", ""]
    if f.groups:
        headers, rows = group_table(f)
        rows = [[_md(cell) for cell in row] for row in rows]
        for r, g in zip(rows, f.groups):
            if g.differs:
                r[5] = f"**{r[5]}**"
        out += _md_table(headers, rows) + [""]
    e = f.explanation
    if e is not None:
        out += [f"- {_md(line)}" for line in _explanation_lines(f) if not line.startswith("theorem ")]
        out.append("")
    if f.ledger is not None:
        out += [f"- {_md(_ledger_line(f))}", ""]
    if f.replay:
        out += [f"Replay: {_code_span(f.replay)}", ""]
    test_line = _test_line(f)
    if test_line:
        out += [_md(test_line[0].upper() + test_line[1:]), ""]
    if sweep_line(f):
        out += [_md(sweep_line(f)[0].upper() + sweep_line(f)[1:]) + ".", ""]
    if plot_path:
        out += [f"Plot of registered vs computed tokens: {_code_span(plot_path)}", ""]
    if f.groups:
        headers, rows = derivation_table(f)
        out += _fold("Derivation (spec and subject)", _md_table(headers, [[_md(c) for c in r] for r in rows]))
    code = _regression_test_code(f) if f.source == "fuzz" else None
    if code is not None:
        name = _md((f.regression_test or {}).get("file_name") or "the regression test")
        out += _fold(f"Regression test for tests/v1/core/ ({name})", _fence(code, "python"))
    if e is not None and e.theorems:
        out += _fold("Theorems behind the explanation", [
            f"- {_code_span(t.name)}: {_md(t.status)}{'' if t.as_expected else ' (NOT as expected)'} "
            f"({float(t.seconds):.2f} s): {_md(t.statement)}" for t in e.theorems])
    if f.traceback:
        out += _fold("vLLM traceback", _fence(str(f.traceback).strip()))
    if f.run:
        out += _fold("Run statistics", [_md(", ".join(f"{k} {v}" for k, v in f.run.items()))])
    return "\n".join(out) + "\n"
