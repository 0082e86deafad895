"""``kvspec mtp``: the question #52419 left open, answered with proofs and real vLLM.

vLLM refuses ``scheduler_block_size < num_prefill_lookahead`` with EAGLE
groups and prefix caching, because "hits land on scheduler-block boundaries,
so the excluded tail is scheduler_block_size".  Under partial hash hits hits
land on hash-block boundaries and the EAGLE drop is one hash unit.  This
command runs the ``mtp.*`` theorems, then looks for stale draft-KV reuse on
each subject under each hash scheme it has (``oracles.mtp``), and prints one
verdict; ``--markdown`` writes it as a finding a reviewer can post upstream.

The writer's prompt is prefilled as the release's own scheduler chunks it
(``Scheduler._mamba_block_aligned_split`` and ``_reserve_prefill_lookahead``,
with the Mamba group declaring the release's prefill-checkpoint blocks): a
Mamba state -- where a hit can land -- exists only where a chunk ended, so a
single-chunk writer hid stale reuse the model predicts (S=4, H=2, L=3, B=4:
0 before, 16 of 332 lookups on 0.33.0 now).  Each subject's deployment
profiles (its own configuration code) say who can reach it.

Exit codes: 0 no stale reuse anywhere, 6 hardening (stale reuse exactly where
the model says: it affects speculative acceptance only), 1 a theorem not as
expected, the model disagreeing with vLLM, or stale reuse under lookahead
hashes, 2 usage or setup error, 3 a theorem timed out.
"""

from __future__ import annotations

import argparse
import json

from kvspec.arguments import add_subject_arguments, subjects, writable
from kvspec.model.errors import KvspecError, UsageError
from kvspec.model.outcome import Outcome, RunStatus, worst

HELP = "multi-module MTP: can a hit keep stale draft KV? (proofs and real vLLM)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_subject_arguments(parser)
    parser.add_argument("--json", metavar="FILE", help="write the versioned result")
    parser.add_argument("--markdown", metavar="FILE", help="write the verdict as a finding to post upstream")


def run(args: argparse.Namespace) -> Outcome:
    from kvspec.usecases.mtp import mtp_model_side, mtp_subject_side
    from kvspec.model.about import SCHEMAS
    from kvspec.report.files import write_text
    from kvspec.report.mtp import render_markdown, render_text, verdict

    json_path = writable(args.json, "--json")
    markdown_path = writable(args.markdown, "--markdown")
    named = subjects(args)
    if not named:
        raise UsageError("name a subject: --vllm 0.34.0 (a release) or --vllm-src PATH (a tree)")
    theorems = [t.as_dict() for t in mtp_model_side()]
    found = []
    error = None
    try:
        for subject in named:
            found.append(mtp_subject_side(subject).as_dict())
    except KvspecError as exc:
        error = exc
    text, outcome = verdict(theorems, found)
    command = "kvspec mtp " + " ".join([f"--vllm {v}" for v in args.vllm or []]
                                       + [f"--vllm-src {p}" for p in args.vllm_src or []])
    doc = {"schema": SCHEMAS["mtp"], "verdict": text, "command": command.strip(),
           "status": RunStatus.COMPLETE.value if error is None else f"{RunStatus.INCOMPLETE.value} ({error})",
           "theorems": theorems, "subjects": found}
    print(render_text(doc))
    if json_path is not None:
        write_text(json_path, json.dumps(doc, indent=2, sort_keys=True))
    if markdown_path is not None:
        write_text(markdown_path, render_markdown(doc))
    if error is not None:
        print(f"kvspec: error: {error} (results so far were written)")
        return worst([outcome, error.outcome])
    return outcome
