"""``kvspec hitrate``: the prefix-cache hit rate of real vLLM on a synthetic
workload, next to the spec's ideal (``oracles.ideal_cache``).

Each subject (a release, and that release with each ``--mutant`` applied)
replays the same multi-turn, concurrent workload through its own
``KVCacheManager``; the spec's ideal replays it with ``model.spec``'s
registration and ``model.lookup``'s hits; for a mutant, the model of its rule
(the wrong variant it implements) replays it too, so the report can say
whether the loss is exactly what the rule predicts and where it lands.

Exit codes: 0 every subject's hits equal the ideal's request by request,
1 some subject loses (or gains) hits against the ideal, 2 usage or setup error.
"""

from __future__ import annotations

import argparse
import json

from kvspec.arguments import add_mutant_argument, add_subject_arguments, positive_int, subjects, writable
from kvspec.model.errors import KvspecError, UsageError
from kvspec.model.outcome import Outcome
from kvspec.model.workload import LAYOUTS

HELP = "prefix-cache hit rate of real vLLM on a workload vs the spec's ideal"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_subject_arguments(parser)
    add_mutant_argument(parser, "replay")
    parser.add_argument("--layout", choices=LAYOUTS, default="mamba-hybrid",
                        help="mamba-hybrid (partial hash hits; mutants are held to their release) or "
                             "full-attention (held to the spec's exact ideal)")
    parser.add_argument("--scheduler-block-size", default="256", metavar="S[,S...]",
                        help="the scheduler block (the Mamba page); several values sweep it (default 256)")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="workload seed (default 0)")
    parser.add_argument("--conversations", type=positive_int, default=24, metavar="N")
    parser.add_argument("--turns", type=positive_int, default=4, metavar="N")
    parser.add_argument("--concurrency", type=positive_int, default=16, metavar="N")
    parser.add_argument("--json", metavar="FILE", help="write the versioned result")
    parser.add_argument("--svg", metavar="FILE", help="write the plot")


def run(args: argparse.Namespace) -> Outcome:
    from kvspec.usecases.hitrate import compare_with_reference, hitrate_row
    from kvspec.model.about import SCHEMAS
    from kvspec.model.workload import Workload, layout
    from kvspec.report.files import write_text
    from kvspec.report.hitrate import HitrateFile, ReplayFailed, SubjectHits, render_text, verdict
    from kvspec.report.hitrate_plot import render_svg
    from kvspec.subjects.mutation import mutant

    json_path = writable(args.json, "--json")
    svg_path = writable(args.svg, "--svg")
    plan = subjects(args, mutants=True)
    if not plan:
        raise UsageError("name a subject: --vllm 0.34.0 (a release) or --vllm-src PATH (a tree)")
    try:
        workload = Workload(seed=args.seed, conversations=args.conversations, turns=args.turns,
                            concurrency=args.concurrency)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        block_sizes = [int(x) for x in args.scheduler_block_size.split(",")]
        configs = [layout(args.layout, S) for S in block_sizes]
    except ValueError as exc:
        raise UsageError(f"--scheduler-block-size {args.scheduler_block_size}: {exc}") from None
    rows, errors = [], []
    for config in configs:
        for subject in plan:
            label = subject.label
            print(f"{label} (S={config.scheduler_block_size}): replaying {len(workload.requests())} requests",
                  flush=True)
            variant_name = mutant(subject.mutant).models_variant if subject.kind == "mutant" else None
            try:
                rows.append(hitrate_row(subject, label, config, workload, variant_name).as_dict())
            except KvspecError as exc:
                if exc.outcome is not Outcome.USAGE:
                    raise
                errors.append({"label": label, "error": str(exc).splitlines()[0]})
    compare_with_reference(rows)
    text, outcome = verdict([SubjectHits.parse(r) for r in rows], [ReplayFailed(**e) for e in errors])
    first = block_sizes[0]
    described = (configs[0].describe().replace(f"block {first})", "block S)")
                 .replace(f"S={first} ", "S=" + ",".join(map(str, block_sizes)) + " ", 1))
    doc = {"schema": SCHEMAS["hitrate"], "verdict": text, "layout": described,
           "workload": {"text": workload.describe(), "seed": workload.seed,
                        "conversations": workload.conversations, "turns": workload.turns,
                        "concurrency": workload.concurrency},
           "subjects": rows, "errors": errors}
    result = HitrateFile.parse(doc)
    print(render_text(result))
    if json_path is not None:
        write_text(json_path, json.dumps(doc, indent=2, sort_keys=True))
    if svg_path is not None and rows:
        write_text(svg_path, render_svg(result))
    return outcome
