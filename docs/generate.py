"""The manual's reference pages, generated from kvspec's code.

MkDocs runs this file as a hook (``hooks:`` in mkdocs.yml): ``on_files`` adds
every page below to the site at build time, so a reference page can never
drift from the code it describes.  To read the pages without building the
site: ``python docs/generate.py OUT_DIR`` writes them as Markdown files.

The release-history and kill-matrix pages render the result files committed
under ``docs/results/`` (the JSON that ``kvspec history --json`` and ``kvspec
mutants --json`` write); ``RESULTS`` names the command that makes each, and a
file whose recorded settings differ from its command fails the build.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

DOCS = Path(__file__).resolve().parent
RESULTS_DIR = DOCS / "results"

# Each committed result file and the one command that makes it (run from the
# repository's root).  The page shows the command beside the table.
RESULTS = {
    "history": ("history-0.23.0..0.34.0.json",
                "kvspec history --vllm 0.23.0..0.34.0 --max-examples 300 --seed 0 --symbolic "
                "--json docs/results/history-0.23.0..0.34.0.json"),
    "mutants": ("mutants-0.34.0.json",
                "kvspec mutants --vllm 0.34.0 --max-examples 300 --seed 0 --every-technique "
                "--json docs/results/mutants-0.34.0.json"),
}



def _cell(text: Any) -> str:
    """One Markdown table cell: no line breaks, no bare pipes."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _page(title: str, source: str, *parts: str) -> str:
    generated = f"This page is generated from {source} when the manual is built (`docs/generate.py`)."
    return "\n\n".join([f"# {title}", generated, *parts]) + "\n"


# -- the command line ---------------------------------------------------------------

def cli() -> str:
    import argparse as ap

    from kvspec.cli import build_parser

    def fixed_width(parser: ap.ArgumentParser) -> ap.ArgumentParser:
        parser.formatter_class = lambda prog: ap.HelpFormatter(prog, width=100)
        return parser

    def options(parser: ap.ArgumentParser) -> str:
        rows = []
        for action in parser._actions:  # argparse keeps no public list of a parser's arguments
            if isinstance(action, (ap._HelpAction, ap._SubParsersAction)):
                continue
            value = f" {action.metavar or action.dest.upper()}" if action.option_strings and action.nargs != 0 else ""
            name = ", ".join(f"`{o}{value}`" for o in action.option_strings) or f"`{action.metavar or action.dest}`"
            default = action.default
            shown = "" if default in (None, False, ap.SUPPRESS) or action.nargs == 0 else f"`{default}`"
            if action.choices:
                shown = (shown + " " if shown else "") + "one of " + ", ".join(f"`{c}`" for c in action.choices)
            rows.append([name, shown, action.help or ""])
        return _table(["argument", "default", "what it does"], rows) if rows else "No arguments."

    parser = fixed_width(build_parser())
    (sub,) = [a for a in parser._actions if isinstance(a, ap._SubParsersAction)]
    helps = {c.dest: c.help for c in sub._choices_actions}
    parts = ["Every command is a module of `kvspec.commands`; `kvspec COMMAND --help` prints the same.",
             "```\n" + parser.format_help().rstrip() + "\n```"]
    parts += [_table(["command", "what it does"], [[f"[`{n}`](#kvspec-{n})", helps[n]] for n in sub.choices])]
    for name, command in sub.choices.items():
        fixed_width(command)
        parts += [f"## kvspec {name}", helps[name] + ".",
                  "```\n" + command.format_usage().strip() + "\n```",
                  (command.description or "").strip(), options(command)]
    return _page("Command line", "the argument parser, `kvspec.cli.build_parser`", *[p for p in parts if p])


# -- exit codes ---------------------------------------------------------------------

def exit_codes() -> str:
    from kvspec.model.outcome import Outcome

    by_code = sorted(Outcome, key=lambda o: o.exit_code)
    by_urgency = sorted(Outcome, reverse=True)
    return _page(
        "Exit codes", "`model/outcome.py`, the `Outcome` enum",
        "Every command computes its exit code from one ordered outcome: each thing it did has an "
        "outcome, and the command exits with the most urgent one.",
        _table(["code", "outcome", "meaning"], [[o.exit_code, o.name.lower(), o.meaning] for o in by_code]),
        "From the most urgent to the least: " + ", ".join(f"{o.name.lower()} ({o.exit_code})" for o in by_urgency)
        + ". A finding outranks everything: it is true whatever else went wrong.")


# -- the theorem catalog ------------------------------------------------------------

def theorems() -> str:
    from kvspec.proofs.catalog import CATALOG

    categories: dict[str, list[Any]] = {}
    for t in CATALOG:
        categories.setdefault(t.category, []).append(t)
    parts = [f"`kvspec prove` runs these {len(CATALOG)} theorems over unbounded integers, each query in a fresh "
             "Z3 context with a resource budget; `kvspec prove --list` prints the same list. *Expected* is the "
             "verdict the catalog asserts: a theorem expected REFUTED says a rule is wrong on purpose. "
             "*Refuted by* names the known-wrong rules each theorem's vacuity check runs (they must refute it)."]
    for category, items in categories.items():
        parts += [f"## {category}", _table(
            ["theorem", "statement", "assumptions", "target", "expected", "refuted by"],
            [[f"`{t.name}`", t.statement, t.assumptions_text, f"`{t.target.name}`", t.expected.value,
              ", ".join(f"`{r.name}`" for r in t.refuters) or t.no_refuter_reason or "-"] for t in items])]
    return _page("Theorem catalog", "`proofs/catalog.py` and `proofs/lookup_catalog.py`, `CATALOG`", *parts)


# -- the state invariants ------------------------------------------------------------

def invariants() -> str:
    from kvspec.model.state import INVARIANTS, OUT_OF_SCOPE

    return _page(
        "State invariants", "`model/state.py`, `INVARIANTS` and `OUT_OF_SCOPE`",
        f"The stateful differential checks these {len(INVARIANTS)} rules after every operation, in this "
        "order (a finding names the earliest one broken). *Exact* rules state vLLM's own contract; the "
        "others are the weaker statement kvspec does check, said in the statement.",
        _table(["invariant", "finding category", "checked after every operation", "exact"],
               [[f"`{i.name}`", i.category.value, i.statement, "yes" if i.exact else "weaker"]
                for i in INVARIANTS]),
        "## Not checked", "\n".join(f"- {text}" for text in OUT_OF_SCOPE))


# -- deployment profiles -------------------------------------------------------------

DERIVED_RELEASES = ("0.33.0", "0.34.0")
KIND = {"full_attention": "FA", "sliding_window": "SW", "mamba_align": "M", "mamba_none": "M(none)"}


def deployments() -> str:
    from kvspec.model.deployments import CATALOG, derive, schemes_for

    def groups(d: Any) -> str:
        if d.error:
            return f"not derived: {d.error}"
        return " + ".join(f"{KIND.get(g.kind, g.kind)}[{g.block_size}{'*' if g.eagle else ''}]" for g in d.groups)

    def scheme(d: Any) -> str:
        hashes = "legacy" if d.num_hash_lookahead_tokens == 0 else f"lookahead {d.num_hash_lookahead_tokens}"
        return f"{hashes}, EAGLE branch {'live' if d.use_eagle else 'not live'}"

    parts = [f"{len(CATALOG)} deployment profiles: a model given by its published configuration fields, a "
             "drafter and the knobs that change the KV-cache geometry. *Provenance* is the weakest source "
             "any of its numbers came from: `config` (a published config.json), `defaults` (the transformers "
             "class's defaults), `recalled` (not verified here), `hypothetical` (no published drafter "
             "configuration was read).",
             _table(["profile", "model (family)", "drafter and knobs", "provenance", "note"],
                    [[f"`{p.name}`", f"{p.model.name} ({p.family})", p.knobs(), p.provenance, p.note]
                     for p in CATALOG])]
    for release in DERIVED_RELEASES:
        rows = []
        for p in CATALOG:
            for legacy in schemes_for(p, release):
                d = derive(p, release, legacy_hashes=legacy)
                rows.append([f"`{p.name}`" + (" (legacy hashes asked)" if legacy else ""), groups(d),
                             f"{d.scheduler_block_size} / {d.hash_block_size}",
                             "on" if d.partial_hash_hits else "off", scheme(d), d.coordinator])
        parts += [f"## What {release} builds, as kvspec models it",
                  "From `model.deployments.derive`, kvspec's model of the release's configuration code "
                  "(`tests/integration/test_deployments.py` holds it to the release's own code). Groups: "
                  "FA full attention, SW sliding window, M Mamba align; `*` an EAGLE group; the number is "
                  "the group's block in tokens. `kvspec run --vllm VERSION --profiles` prints the "
                  "release's own derivation, step by step.",
                  _table(["profile", "groups", "S / H", "partial hits", "hash scheme", "coordinator"], rows)]
    return _page("Deployment profiles", "`model/deployments.py`, `CATALOG` and `derive`", *parts)


# -- known vLLM bugs -----------------------------------------------------------------

def known_bugs() -> str:
    from kvspec.model.known import KNOWN_BUGS

    rows = [[f"`{b.name}`" if b.name else "-", b.category.value,
             f"{b.first} to {b.fixed_in} (fixed)" if b.fixed_in else f"{b.first} on (not fixed)",
             b.summary, b.needs or "-",
             f"`{b.reproduction}`" if b.reproduction else "-"]
            for b in KNOWN_BUGS]
    return _page(
        "Known vLLM bugs", "`model/known.py`, `KNOWN_BUGS`",
        "Bugs kvspec found in published vLLM releases, each shrunk and judged a vLLM bug (not a gap in the "
        "model). The stateful and engine differentials recognise a known bug when a program meets it (by "
        "its mechanism), count it, say it and go on (`--include-known` reports it as a finding instead); the "
        "registration and lookup differentials likewise, per example; none is kept out of the draw. The shipped "
        "tests do the same and report the known bugs of the release they run on (a tree or a mutant: the "
        "release its `_version.py` names) that they met as XFAIL naming each, once the whole budget ran. "
        "*Releases* run from the first release kvspec checked that carries the bug to the first without it.",
        _table(["name", "finding category", "releases", "what vLLM does", "needs",
                "standalone reproduction"], rows))


# -- mutation operators --------------------------------------------------------------

def mutants() -> str:
    from kvspec.subjects.mutation import ALL_MUTANTS

    parts = [f"`kvspec mutants` and `kvspec fuzz --mutant NAME` re-apply these {len(ALL_MUTANTS)} known-wrong "
             "rules to a release tree by source transformation; each rewrites exactly one method and fails "
             "loudly when its target is missing (reported \"not applicable\" to that release)."]
    for side in dict.fromkeys(m.side for m in ALL_MUTANTS):
        items = [m for m in ALL_MUTANTS if m.side == side]
        header = ["mutant", "what it does", "file"] + (["model variant"] if side == "registration" else [])
        parts += [f"## {side.capitalize()} side", _table(header, [
            [f"`{m.name}`", m.summary, f"`{m.target_file}`"] + ([f"`{m.models_variant}`"]
                                                               if side == "registration" else [])
            for m in items])]
    return _page("Mutation operators", "`subjects/mutation/`, `ALL_MUTANTS`", *parts)


# -- measured results ----------------------------------------------------------------

def _result(kind: str) -> tuple[str, str, dict[str, Any] | None]:
    name, command = RESULTS[kind]
    path = RESULTS_DIR / name
    return name, command, json.loads(path.read_text()) if path.exists() else None


def _missing(name: str, command: str) -> str:
    return (f"!!! note \"Not measured yet\"\n    No result file `docs/results/{name}` is committed. Run the "
            f"command above from the repository's root and commit the file: this page then shows it.")


def _settings_agree(command: str, recorded: dict[str, Any]) -> None:
    """A result file must be what its command makes: the settings it records
    appear in the command, or the build fails."""
    for flag, value in recorded.items():
        if f"{flag} {value}" not in command:
            raise ValueError(f"docs/results: the file records {flag} {value}, its command says: {command}")


def history() -> str:
    name, command, data = _result("history")
    parts = ["The table on this page is rendered from the committed result of this command, run from the "
             "repository's root:", f"```\n{command}\n```"]
    if data is None:
        parts.append(_missing(name, command))
    else:
        from kvspec.model.outcome import RunStatus
        from kvspec.report.history import HistoryFile, render_explanations, render_table

        result = HistoryFile.parse(data)
        rows, planned = result.releases, result.planned
        _settings_agree(command, {"--max-examples": result.max_examples, "--seed": result.seed,
                                  "--vllm": f"{planned[0]}..{planned[-1]}"})
        parts += [f"Status: {RunStatus(result.status).value}, {len(rows)} of {len(planned)} releases "
                  f"(`{result.schema}`, [the file](../results/{name})).",
                  render_table(rows, symbolic=any(r.symbolic is not None for r in rows)),
                  "## Each finding explained",
                  "Matched against the [known vLLM bugs](known-bugs.md) by category, words and release range "
                  "(`kvspec.report.history.render_explanations`).",
                  render_explanations(rows)]
    return _page("Release history", f"`docs/results/{name}`, rendered by `kvspec.report.history`", *parts)


def kill_matrix() -> str:
    name, command, data = _result("mutants")
    parts = ["The table on this page is rendered from the committed result of this command, run from the "
             "repository's root:", f"```\n{command}\n```"]
    if data is None:
        parts.append(_missing(name, command))
    else:
        from kvspec.model.outcome import RunStatus
        from kvspec.report.mutants import KillMatrixFile, render_matrix

        result = KillMatrixFile.parse(data)
        rows = result.mutants
        _settings_agree(command, {"--vllm": result.vllm, "--max-examples": result.max_examples,
                                  "--seed": result.seed})
        killed = sum(r.status == "killed" for r in rows)
        parts += [f"Status: {RunStatus(result.status).value}; {killed} of {len(rows)} killed, "
                  f"{sum(r.status == 'equivalent' for r in rows)} equivalent, {result.seconds} s in all "
                  f"(`{result.schema}`, [the file](../results/{name})).",
                  "```\n" + render_matrix(rows) + "\n```"]
    return _page("Kill matrix", f"`docs/results/{name}`, rendered by `kvspec.report.mutants`", *parts)


PAGES: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli,
    "reference/exit-codes.md": exit_codes,
    "reference/theorems.md": theorems,
    "reference/invariants.md": invariants,
    "reference/deployments.md": deployments,
    "reference/known-bugs.md": known_bugs,
    "reference/mutants.md": mutants,
    "reference/history.md": history,
    "reference/kill-matrix.md": kill_matrix,
}


def pages() -> dict[str, str]:
    """Every generated page: its path under docs/ and its Markdown."""
    return {path: make() for path, make in PAGES.items()}


def on_files(files: Any, config: Any) -> Any:
    """The MkDocs hook: the generated pages join the site's files."""
    from mkdocs.structure.files import File

    for path, text in pages().items():
        files.append(File.generated(config, path, content=text))
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write kvspec's generated reference pages as Markdown.")
    parser.add_argument("out", type=Path, help="a directory; the pages go under OUT/reference/")
    args = parser.parse_args(argv)
    for path, text in pages().items():
        target = args.out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
