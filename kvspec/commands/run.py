"""``kvspec run``: one geometry on demand, on real vLLM, beside the spec.

Runs one named corpus case (``model/corpus.py``), a deployment profile's
configuration as the release's own code derives it (``--profile``; ``--profiles``
prints every profile's derivation, called and modelled steps), or a
configuration and step list given as JSON (a ``Case``: ``{"config": {...}, "prompt_len": N,
"steps": [...]}``, inline or in a file) through the subject's own
``KVCacheManager`` and prints, at every ``cache_blocks`` call, each group's
bound and registered full blocks beside the spec's, the regime both sides
chose, and under which hash scheme the run holds.  The hash scheme is the
release's default unless ``--hash-scheme`` says otherwise: lookahead block
hashes on 0.33+ (the scheduler then builds the manager with
``use_eagle=False``, so the EAGLE branch of the bound is not live), legacy
hashes before.  ``--engine-program`` runs one engine program (a stored
engine finding's, or one written by hand) through vLLM's real ``Scheduler``,
built by the release's own configuration code, and prints every operation
with what vLLM answered and what the state invariants said of it.

Exit codes: 0 vLLM agrees with the spec, 1 it differs, 2 usage or setup error,
4 an engine program stopped before its last operation.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kvspec.arguments import positive_int, writable
from kvspec.model.errors import UsageError
from kvspec.model.outcome import Outcome

HELP = "run one corpus case or configuration on real vLLM and print it beside the spec"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vllm", metavar="VERSION", help="a vLLM release from PyPI")
    parser.add_argument("--vllm-src", metavar="PATH", help="a directory holding the vllm package")
    parser.add_argument("--mutant", metavar="NAME", help="apply this mutation to the --vllm release first")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--case", metavar="NAME", help="a corpus case (model/corpus.py), e.g. seed_52419")
    what.add_argument("--config", metavar="JSON", help="a case as JSON, inline or a file name")
    what.add_argument("--profile", metavar="NAME",
                      help="a deployment profile (model/deployments.py): its configuration as the release's "
                           "own code derives it, then one request of --prompt tokens")
    what.add_argument("--profiles", action="store_true",
                      help="print every deployment profile's derivation on the release (called and modelled "
                           "steps) and run nothing")
    what.add_argument("--engine-program", metavar="JSON",
                      help="an engine program (a stored engine finding, or its inputs' engine_program, inline "
                           "or a file): built by the release's own configuration code and driven through vLLM's "
                           "real Scheduler, every operation printed with what vLLM answered and checked")
    parser.add_argument("--prompt", type=positive_int, default=None, metavar="N",
                        help="with --profile: the request's prompt (default 2.5 scheduler blocks)")
    parser.add_argument("--hash-scheme", choices=("lookahead", "legacy"), default=None,
                        help="block hashes to run under (default: the release's own default: lookahead "
                             "on 0.33+, legacy before)")
    parser.add_argument("--json", metavar="FILE", help="write the per-call record")


def _subject(args: argparse.Namespace):
    from kvspec.subjects.mutation import mutant
    from kvspec.subjects.subject import mutant_subject, release, source_tree

    if bool(args.vllm) == bool(args.vllm_src):
        raise UsageError("name one subject: --vllm VERSION or --vllm-src PATH")
    if args.mutant:
        if not args.vllm:
            raise UsageError("--mutant applies to a release: use --vllm VERSION")
        mutant(args.mutant)
        return mutant_subject(args.vllm, args.mutant)
    return release(args.vllm) if args.vllm else source_tree(args.vllm_src)


def _json_argument(text: str, option: str) -> Any:
    """Inline JSON, or the JSON of the file it names."""
    if not text.lstrip().startswith(("{", "[")):  # not inline JSON: a file name
        try:
            text = Path(text).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"{option} {text}: neither inline JSON nor a file kvspec can read "
                             f"({exc.strerror or exc})") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{option}: not JSON ({exc})") from None


def _case(args: argparse.Namespace):
    """The case to run and what the corpus says of it (None for --config)."""
    from kvspec.model.case import Case, prefill
    from kvspec.model.corpus import CORPUS

    if args.case:
        named = {c.name: c for c in CORPUS}
        if args.case not in named:
            raise UsageError(f"no corpus case {args.case!r}; known: {', '.join(named)}")
        entry = named[args.case]
        return Case(entry.config, entry.n, (prefill(entry.n),)), entry
    data = _json_argument(args.config, "--config")
    if not isinstance(data, dict):
        raise UsageError("--config: expected a JSON object with config, prompt_len and steps")
    return Case.from_dict(data), None


def _derived(subject, version: str):
    from kvspec.subjects.drivers.deployments import derivations
    from kvspec.subjects.subject import release

    probed_on = release(subject.version) if subject.kind in ("release", "mutant") else subject
    return derivations(probed_on, version)


def _print_profiles(subject, version: str) -> Outcome:
    from kvspec.model.deployments import profile

    print(f"kvspec run: the deployment profiles on vLLM {version}, derived by {subject.label}'s configuration code")
    for d in _derived(subject, version):
        p = profile(d.profile)
        print(f"{p.describe()} -- {'legacy hashes asked' if d.legacy_hashes else 'defaults'}")
        print(f"  {d.summary()}")
        config = d.coordinator_config()
        print(f"  kvspec configuration: {config.describe() if config else 'none: ' + str(d.in_scope)}")
        print(f"  called: {', '.join(d.called) or 'nothing'}; modelled: {', '.join(d.modelled) or 'nothing'}")
        for step in d.steps:
            if step.note and step.step == "release_code":
                print(f"  {step.note}")
    return Outcome.OK


def _profile_case(subject, version: str, name: str, scheme: str | None, prompt: int | None):
    """The profile's derived configuration (under legacy hashes when asked)
    and one request: a prompt in server-sized chunks, then two decodes."""
    from kvspec.model.case import Case, Step, decode
    from kvspec.model.deployments import profile

    profile(name)  # a known name, or a usage error below
    chosen = [d for d in _derived(subject, version) if d.profile == name
              and d.legacy_hashes == (scheme == "legacy")]
    if not chosen:
        chosen = [d for d in _derived(subject, version) if d.profile == name]
    derived = chosen[0]
    config = derived.coordinator_config()
    if config is None:
        raise UsageError(f"profile {name} on vLLM {version}: {derived.in_scope or 'no hybrid coordinator'}")
    S = config.scheduler_block_size
    n = prompt if prompt is not None else 2 * S + S // 2 + 1
    steps = tuple(Step("prefill", tokens=min(2048, n - i)) for i in range(0, n, 2048)) + (decode(), decode(2, 1))
    return Case(config, n, steps), derived


def _with_scheme(case, scheme: str):
    import attrs

    return attrs.evolve(case, config=attrs.evolve(case.config, hash_scheme=scheme))


def _scheme_text(case, regime) -> str:
    config = case.config
    if regime.num_hash_lookahead_tokens:
        return (f"lookahead block hashes (num_hash_lookahead_tokens = {regime.num_hash_lookahead_tokens}): the "
                "scheduler builds KVCacheManager(use_eagle=False), so the EAGLE branch of the bound is NOT "
                "live (groups stay flagged, none drops); --hash-scheme legacy runs it")
    if not config.any_eagle:
        return "legacy hashes; no group is EAGLE, so the EAGLE branch is not live under any hash scheme"
    flagged = [i for i, e in enumerate(regime.eagle) if e]
    return (f"legacy hashes: the EAGLE branch of the bound IS live (use_eagle=True; EAGLE groups {flagged}); "
            "on 0.33+ this is what a KV connector without lookahead-hash support or "
            "disable_lookahead_block_hashes gets")


def _engine_program(text: str):
    """The engine program of ``--engine-program``: a program object, a stored
    engine finding (or a stateful one reproduced through the engine), or a
    one-finding list as ``--findings-dir`` and ``--json`` keep them."""
    from kvspec.model.case import InvalidCase
    from kvspec.model.engine import EngineProgram

    data = _json_argument(text, "--engine-program")
    if isinstance(data, list) and len(data) == 1:
        data = data[0]
    if isinstance(data, dict) and isinstance(data.get("inputs"), dict):
        # An engine finding's program, or the one that reproduced a stateful finding through the engine.
        reproduction = data["inputs"].get("engine_reproduction")
        data = data["inputs"].get("engine_program") or (
            reproduction.get("engine_program") if isinstance(reproduction, dict) else None)
    if not isinstance(data, dict):
        raise UsageError("--engine-program: expected an engine program (setup and ops) or an engine finding")
    try:
        return EngineProgram.from_dict(data)
    except (InvalidCase, KeyError, TypeError, ValueError) as exc:
        raise UsageError(f"--engine-program: not a valid engine program ({exc})") from None


def _run_engine_program(subject, text: str, json_path) -> Outcome:
    from kvspec.diff_tests.engine import drive_engine_program
    from kvspec.model.engine import ENGINE_BUILT, MODELLED_STEPS
    from kvspec.model.state import scope_text
    from kvspec.report.engine_program import step_line
    from kvspec.report.files import write_text
    from kvspec.subjects.process import SubjectProcess

    program = _engine_program(text)
    bounds: list[Any] = []
    with SubjectProcess(subject) as proc:
        # Every cache_blocks call is held to the registration bound as the state to its invariants.
        records = list(drive_engine_program(proc, program, bound_out=bounds))
        version = proc.identity.get("vllm_version")
    print(f"kvspec run: {subject.label} (vLLM {version}), one engine program through vLLM's real Scheduler")
    print(f"  {program.setup.model} with `{program.setup.cli_flags() or 'the release defaults'}`; {ENGINE_BUILT}")
    print(f"  modelled: {'; '.join(MODELLED_STEPS)}")
    derived: dict[str, Any] = {}
    if records and records[0].op["do"] == "open" and not records[0].found:
        derived = records[0].reply.payload.derived
        print("  engine settings vLLM built and ran: "
              + "; ".join(f"{k}: {v}" for k, v in sorted(derived.items()) if not isinstance(v, (dict, list)))
              + "; groups: " + ", ".join(f"{g.get('kind')}[{g.get('block_size')}]" for g in derived.get("groups", ())))
        records = records[1:]
    broken = None
    for number, record in enumerate(records, 1):
        print(f"{number:3d}. {step_line(record)}")
        if record.found:
            broken = record
            for d in record.found:
                print(f"     BROKEN {d.category.value}: {d.summary()}")
    checked = len(records) - (broken is not None)
    if broken is None and len(records) == len(program.ops):
        bound = bounds[0] if bounds else None
        also = ""
        if bound is not None and bound.live:
            also = f" and each of the {bound.checked} cache_blocks calls within the registration bound"
        print(f"RESULT: no state invariant broken{also} after any of the {len(records)} operations ({scope_text()})")
        outcome = Outcome.OK
    elif broken is None:
        print(f"RESULT: INCOMPLETE: {len(records)} of {len(program.ops)} operations ran and were checked")
        outcome = Outcome.INCOMPLETE
    else:
        print(f"RESULT: DISCREPANCY at operation {len(records)} ({checked} before it held every rule)")
        outcome = Outcome.FINDING
    if json_path is not None:
        write_text(json_path, json.dumps({
            "subject": subject.label, "vllm_version": version, "engine_program": program.as_dict(),
            "engine_settings": derived,
            "operations": [{"op": r.op, "answer": r.record,
                            "broken": [{"category": d.category.value, "detail": d.summary()} for d in r.found]}
                           for r in records],
            "outcome": outcome.name}, indent=2, sort_keys=True) + "\n")
    return outcome


def run(args: argparse.Namespace) -> Outcome:
    from kvspec.model.capabilities import expected_regime
    from kvspec.model.replies import record_of
    from kvspec.oracles.registration import compare, expected_calls
    from kvspec.report.files import write_text
    from kvspec.subjects.process import SubjectProcess
    from kvspec.model.requests import Run

    json_path = writable(args.json, "--json")
    subject = _subject(args)
    if args.engine_program:
        return _run_engine_program(subject, args.engine_program, json_path)
    derived = None
    if args.profiles or args.profile:
        version = subject.version
        if version is None:
            raise UsageError("--profile and --profiles name a release: use --vllm VERSION")
        if args.profiles:
            return _print_profiles(subject, version)
        try:
            case, derived = _profile_case(subject, version, args.profile, args.hash_scheme, args.prompt)
        except KeyError as exc:
            raise UsageError(str(exc.args[0])) from None
        entry = None
    else:
        case, entry = _case(args)
    with SubjectProcess(subject) as proc:
        caps = proc.capabilities
        scheme = args.hash_scheme or ("lookahead" if caps.lookahead_block_hashes else "legacy")
        if scheme == "lookahead" and not caps.lookahead_block_hashes:
            raise UsageError(f"{subject.label} has no lookahead block hashes (0.33+); use --hash-scheme legacy")
        if derived is None:
            case = _with_scheme(case, scheme)
        else:  # the profile's own scheme, as derived (legacy when asked and the release offers it)
            scheme = case.config.hash_scheme.value
        reply = proc.run(Run.of(case))
        version = proc.identity.get("vllm_version")
    regime = expected_regime(case.config, caps)
    lines = [f"kvspec run: {subject.label} (vLLM {version})"]
    if entry is not None:
        lines.append(f"case {entry.name}: {entry.source}")
        lines.append("  corpus expects, per group at n = " + str(entry.n) + ": "
                     + "; ".join(f"{name} {list(tokens)}" for name, tokens in entry.expected.items()))
    if derived is not None:
        lines.append(f"profile {derived.profile}: {derived.summary()}")
        lines.append(f"  derivation: called {', '.join(derived.called) or 'nothing'}; "
                     f"modelled {', '.join(derived.modelled) or 'nothing'}")
    lines.append(f"configuration: {case.describe()}")
    lines.append(f"hash scheme: {_scheme_text(case, regime)}")
    record: dict[str, Any] = {"subject": subject.as_dict(), "vllm_version": version, "case": case.as_dict(),
                              "corpus_case": entry.name if entry else None, "hash_scheme": scheme,
                              "profile": derived.as_dict() if derived is not None else None,
                              "eagle_branch_live": regime.eagle_branch_live, "reply": record_of(reply),
                              "not_covered": list(caps.not_covered())}
    if not reply.ok:
        lines.append(f"vLLM raised ({reply.error.kind.value}): {reply.error.message}")
        found = compare(case, caps, reply)
        lines.append("VERDICT: DIFFERS: " + "; ".join(d.summary() for d in found))
        print("\n".join(lines))
        if json_path is not None:
            write_text(json_path, json.dumps({**record, "verdict": "differs"}, indent=2, sort_keys=True))
        return Outcome.FINDING
    seen = reply.regime
    lines.append(f"regime: partial hash hits spec {regime.partial_hash_hits}, vLLM {seen.partial_hash_hits}; "
                 f"per-group use_eagle spec {list(regime.eagle)}, vLLM {list(seen.use_eagle)}")
    predicted = expected_calls(case, regime, reply["calls"])
    calls = []
    for index, (call, (tokens, blocks, _)) in enumerate(zip(reply["calls"], predicted)):
        step = case.steps[index].label() if index < len(case.steps) else "?"
        lines.append(f"call {index} ({step}): n = {call['n']}, hashed tokens {call['hashed_tokens']}")
        lines.append(f"  {'group':<34} {'spec tokens':>11} {'vLLM tokens':>11} {'spec blocks':>11} "
                     f"{'vLLM blocks':>11}")
        for g, group in enumerate(case.config.groups):
            mark = "" if (tokens[g], blocks[g]) == (call["num_tokens"][g], call["registered_blocks"][g]) else "  <-"
            lines.append(f"  {g} {group.label():<32} {tokens[g]:>11} {str(call['num_tokens'][g]):>11} "
                         f"{blocks[g]:>11} {str(call['registered_blocks'][g]):>11}{mark}")
        calls.append({"n": call["n"], "spec_tokens": list(tokens), "vllm_tokens": call["num_tokens"],
                      "spec_blocks": list(blocks), "vllm_blocks": call["registered_blocks"]})
    if calls:
        last = calls[-1]
        lines.append(f"per-group tokens at the last call: spec {last['spec_tokens']}, vLLM {last['vllm_tokens']}")
    found = compare(case, caps, reply)
    verdict = ("AGREES with the spec" if not found
               else "DIFFERS: " + "; ".join(d.summary() for d in found))
    lines += [f"not covered: {item}" for item in caps.not_covered()]
    lines.append(f"VERDICT ({scheme} hashes): {verdict}")
    print("\n".join(lines))
    if json_path is not None:
        write_text(json_path, json.dumps({**record, "calls": calls, "verdict": "agrees" if not found else "differs",
                                          "discrepancies": [d.summary() for d in found]},
                                         indent=2, sort_keys=True))
    return Outcome.FINDING if found else Outcome.OK
