"""A known vLLM bug's release range, by a targeted search through the engine on each release.

One replay of one shrunk program says whether that program shows the bug on
a release, which depends on the pool size and the prompt lengths as much as
on the code.  Here each release is asked, within a fixed, deterministic
budget, whether vLLM's real ``Scheduler`` (built by the release's own
configuration code, ``diff_tests/engine.py``) can be made to show the bug's
mechanism at all:

1. the bug's example engine program, replayed as it is (the explicit example);
2. the same program around it (``variants``): the pool a few blocks smaller
   and larger, and every prompt a token shorter or longer, or a block longer;
3. the engine machine's own rules over the setups of (2) (the reproduction's
   targeted search, ``diff_tests.reproduce.targeted_search``: ``SEARCH_EXAMPLES``
   programs from seed ``SEARCH_SEED``, no example database, no shrinking).

A discrepancy is the bug when ``model.known`` recognises it as that bug (its
category, its words, the kinds of the groups its rule names), whichever
release range the entry now says.  Each release's answer is "shown" (with
the program that showed it and how), "not shown" (the whole budget ran),
"not expressible" (vLLM's configuration code refused every setup, or built
none with the group kinds the bug needs: a mechanism the engine's flags
cannot reach on that release says nothing of the code), or "unknown" (the
search did not run to its end).

The known bugs no engine toy reaches (a layout no toy model builds, or not
on the releases concerned) are dated the same way at the manager level: an
example that is a stateful ``Program`` or a registration/lookup ``Case``
(kvspec built its KVCacheConfig by hand) goes to ``diff_tests/ranges_manager.py``,
and its record and rows say ``level: "manager (hand-built KVCacheConfig)"``,
never engine reach; the engine's say ``level: "engine"``.

Run it (the command is recorded with the ranges it gives)::

    python -m kvspec.diff_tests.ranges --bug NAME --example FILE --vllm 0.23.0 ... --json OUT
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import attrs

from kvspec.model.about import release_key
from kvspec.model.engine import EngineProgram
from kvspec.model.case import Case, InvalidCase
from kvspec.model.errors import InfrastructureError, KvspecError
from kvspec.model.known import KNOWN_BUGS, KnownBug, recognise
from kvspec.model.nearest_engine import Target
from kvspec.model.program import Program

from .engine import as_the_release_takes, drive_engine_program, not_drawn
from .ranges_manager import (resized_arrival, CASE_SEARCH_CASES, ENGINE_LEVEL, MANAGER_LEVEL, search_release_case,
                             search_release_program)
from .reproduce import SEARCH_EXAMPLES, SEARCH_SEED, SEARCH_STEPS, targeted_search

__all__ = ["POOL_DELTAS", "LENGTH_DELTAS", "variants", "needed_kinds", "search_release", "release_range",
           "read_example", "main"]

POOL_DELTAS = (0, -2, 2, 8, 32)  # blocks added to the example's pool
LENGTH_DELTAS = (0, -1, 1, 16)  # tokens added to every prompt of the example


def variants(example: EngineProgram) -> list[EngineProgram]:
    """The example, then the same operations around it: every pool of
    ``POOL_DELTAS`` (at least one block) with every prompt-length change of
    ``LENGTH_DELTAS`` (a prompt keeps at least one token; added tokens are
    distinct and the same for every request, so shared prefixes and resends
    stay shared)."""
    out: list[EngineProgram] = []
    for pool in POOL_DELTAS:
        for delta in LENGTH_DELTAS:
            blocks = max(1, example.setup.num_gpu_blocks + pool)
            ops = tuple(resized_arrival(op, delta) for op in example.ops)
            program = EngineProgram(attrs.evolve(example.setup, num_gpu_blocks=blocks), ops)
            if program not in out:
                out.append(program)
    return out


def needed_kinds(bug: KnownBug) -> frozenset[str]:
    """The group kinds the bug's mechanism needs (empty: it names none)."""
    return frozenset(k.value for k in bug.group_kinds or ())


def _replay(proc, program: EngineProgram, bug: KnownBug, needs: frozenset[str]) -> str:
    """What ``program`` shows on ``proc``: "shown" (the bug), "other" (another
    discrepancy first), "held" (nothing broke), "refused" (vLLM's
    configuration code refused the setup, or this release does not take a
    flag of it) or "no layout" (vLLM built none of the group kinds
    ``needs``, or a layout kvspec's state model does not know)."""
    try:
        for record in drive_engine_program(proc, program):
            if record.op["do"] == "open":
                if record.found:
                    return "refused"
                kinds = {g["kind"] for g in (record.record.get("derived") or {}).get("groups", ())}
                if needs and not needs <= kinds:
                    return "no layout"
                continue
            if record.found:
                return "shown" if recognise((bug,), record.found) is not None else "other"
    except InvalidCase:
        return "no layout"
    except InfrastructureError as error:
        if str(error).startswith("this subject cannot build the engine"):
            return "refused"
        raise
    return "held"


def search_release(proc, bug: KnownBug, example: EngineProgram,
                   needs: frozenset[str] | None = None) -> dict[str, Any]:
    """One release's answer for ``bug`` (module docstring), within the fixed
    budget; ``needs``: the group kinds a setup must build to express the
    mechanism (default: the kinds the bug names)."""
    needs = needed_kinds(bug) if needs is None else needs
    started = time.perf_counter()
    # The example's setup as this release takes it (its hybrids aligned before 0.28), as the draw does.
    example = attrs.evolve(example, setup=as_the_release_takes(example.setup, not_drawn(proc)))
    answers: dict[str, int] = {}
    buildable = []
    row: dict[str, Any] = {"release": proc.describe().get("vllm_version"), "level": ENGINE_LEVEL}
    try:
        for index, program in enumerate(variants(example)):
            answer = _replay(proc, program, bug, needs)
            answers[answer] = answers.get(answer, 0) + 1
            if answer == "shown":
                how = "the example as it is" if index == 0 else "a variant of the example (pool, prompt lengths)"
                return {**row, "status": "shown", "how": how, "program": program.describe(),
                        "engine_program": program.as_dict(), "replays": answers,
                        "seconds": round(time.perf_counter() - started, 1)}
            if answer in ("held", "other") and program.setup not in buildable:
                buildable.append(program.setup)
        if not buildable:
            why = ("vLLM built none of the groups the bug needs" if "no layout" in answers
                   else "vLLM's configuration code refused every setup")
            return {**row, "status": "not expressible", "why": why, "replays": answers,
                    "seconds": round(time.perf_counter() - started, 1)}
        others: dict[str, int] = {}
        found, _ = targeted_search(proc, buildable, Target(bug.category.value), (), others,
                                   shows=lambda found, reply, derived: recognise((bug,), found) is not None)
    except KvspecError as error:
        return {**row, "status": "unknown", "why": f"{type(error).__name__}: {error}", "replays": answers,
                "seconds": round(time.perf_counter() - started, 1)}
    row.update(replays=answers, search_others=others, seconds=round(time.perf_counter() - started, 1))
    if found is not None:
        return {**row, "status": "shown", "how": "the targeted engine search", "program": found.describe(),
                "engine_program": found.as_dict()}
    return {**row, "status": "not shown"}


def release_range(rows: list[dict[str, Any]], bug: KnownBug) -> dict[str, Any]:
    """The range the rows give, beside the one ``model/known.py`` records:
    the first and last releases shown, whether every release between them
    showed it, and whether the entry agrees on the releases the search could
    decide (shown or not shown)."""
    shown = [r["release"] for r in rows if r["status"] == "shown"]
    decided = {r["release"]: r["status"] == "shown" for r in rows if r["status"] in ("shown", "not shown")}
    disagree = sorted((v for v, s in decided.items() if s != bug.carried_by(v)), key=release_key)
    return {"first_shown": min(shown, key=release_key) if shown else None,
            "last_shown": max(shown, key=release_key) if shown else None,
            "shown": shown, "not_shown": [v for v, s in decided.items() if not s],
            "undecided": [r["release"] for r in rows if r["release"] not in decided],
            "known_entry": {"first": bug.first, "fixed_in": bug.fixed_in},
            "agrees_with_known_entry": not disagree, "disagrees_on": disagree}


def read_example(path: Path) -> EngineProgram | Program | Case:
    """The example an engine program (searched through the engine) or a
    manager-level stateful ``Program`` (searched at the manager level,
    ``diff_tests/ranges_manager.py``), or a stored finding naming either."""
    data = json.loads(path.read_text())
    if "inputs" in data:  # a stored finding: the program it names
        inputs = data["inputs"]
        data = (inputs.get("engine_program") or (inputs.get("engine_reproduction") or {}).get("engine_program")
                or inputs.get("program") or inputs.get("case"))
    if isinstance(data, dict) and "config" in data and "num_blocks" in data:
        return Program.from_dict(data)
    if isinstance(data, dict) and "config" in data and "prompt_len" in data:
        return Case.from_dict(data)
    return EngineProgram.from_dict(data)


def main(argv: list[str] | None = None) -> int:
    from kvspec.subjects.process import SubjectProcess
    from kvspec.subjects.subject import release

    parser = argparse.ArgumentParser(prog="python -m kvspec.diff_tests.ranges", description=__doc__.split("\n")[0])
    parser.add_argument("--bug", required=True, choices=[b.name for b in KNOWN_BUGS])
    parser.add_argument("--example", required=True, type=Path,
                        help="an engine program, a manager-level stateful program (kvspec builds the KVCacheConfig), "
                             "or a stored finding naming one, that shows the bug")
    parser.add_argument("--vllm", action="append", required=True, metavar="VERSION")
    parser.add_argument("--needs-kind", action="append", default=[], metavar="KIND",
                        help="a group kind a setup must build to express the mechanism (repeatable; default: the "
                             "kinds the bug names)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    bug = next(b for b in KNOWN_BUGS if b.name == args.bug)
    needs = frozenset(args.needs_kind) or needed_kinds(bug)
    example = read_example(args.example)
    manager = isinstance(example, (Program, Case))
    rows = []
    for version in sorted(args.vllm, key=release_key):
        with SubjectProcess(release(version)) as proc:
            if isinstance(example, Program):
                row = search_release_program(proc, bug, example, POOL_DELTAS, LENGTH_DELTAS)
            elif isinstance(example, Case):
                row = search_release_case(proc, bug, example, LENGTH_DELTAS)
            else:
                row = search_release(proc, bug, example, needs)
        rows.append(row)
        print(f"{version}: {row['status']} ({row.get('how') or row.get('why') or 'the whole budget ran'}; "
              f"{row['seconds']} s)", flush=True)
    document = {"bug": bug.name, "category": bug.category.value,
                "command": " ".join(["python -m kvspec.diff_tests.ranges"] + [
                    a if " " not in a else repr(a) for a in (argv if argv is not None else sys.argv[1:])]),
                "level": MANAGER_LEVEL if manager else ENGINE_LEVEL,
                "example": example.as_dict(), "example_describe": example.describe(),
                "needs_kinds": [] if manager else sorted(needs),
                "example_kind": ("registration/lookup case" if isinstance(example, Case) else
                                 "stateful program" if manager else "engine program"),
                "budget": ({"length_deltas": list(LENGTH_DELTAS), "search_cases": CASE_SEARCH_CASES,
                            "search_seed": SEARCH_SEED} if isinstance(example, Case) else
                           {"pool_deltas": list(POOL_DELTAS), "length_deltas": list(LENGTH_DELTAS),
                            "search_examples": SEARCH_EXAMPLES, "search_seed": SEARCH_SEED,
                            "search_steps": SEARCH_STEPS}),
                "range": release_range(rows, bug), "releases": rows}
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    print(json.dumps(document["range"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
