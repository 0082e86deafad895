"""The wire between kvspec and a worker: one JSON object per line each way.

Requests (``op``): ``stream`` (cases, each answered as it is done, then an
end marker) and ``run`` (one case: the retry on a fresh worker),
``open_session`` / ``session_actions`` (the hit-rate replay), ``open_machine``
(a ``model.program.Program``'s ``machine_case``) / ``machine_ops``
(operations, answered each with its result and the manager's state after it)
/ ``machine_trace`` (the vLLM calls they made), for the stateful
differential, ``open_engine`` / ``engine_ops`` (a real Scheduler, for the
engine differential), ``prefill_chunks`` (vLLM's scheduler chunking of
prompts on one geometry: ``case`` and ``prompts``) and
``mamba_layer_checkpoint_fields`` (what the release's Mamba2 layer declares),
for the MTP search, ``stats``, ``quit``; the worker answers each through the
handler its ``op`` names (``vllm_side/loop.py``).  A case is sent as
``case_message``; its reply carries ``ok``, then the observations
(``calls``, ``regime``, ``probe``).  An error reply says why in one key,
``error_kind`` (``model.replies.ErrorKind``: ``construct``, vLLM refused the
configuration; ``drive``, vLLM raised; ``unsupported``, ``kvspec``,
``environment``, ``fatal``), with the ``error`` in words and, where vLLM
raised, the ``traceback`` and whose frames raised it (``origin``, ``where``).
The worker's first line is its hello: ``ok``, the introspected
``capabilities`` and where ``vllm`` came from.  ``subjects/process.py``
parses every reply once into a ``model.replies.Reply``.
"""

from __future__ import annotations

from typing import Any

from kvspec.model.case import Case

__all__ = ["case_message"]


def case_message(case: Case) -> dict[str, Any]:
    """A case as the worker takes it (written out rather than attrs.asdict:
    this runs for every case fuzzed)."""
    c = case.config
    message = {
        "groups": [
            {"kind": g.kind.value, "block_size": g.block_size, "eagle": g.eagle,
             "sliding_window": g.sliding_window}
            for g in c.groups
        ],
        "scheduler_block_size": c.scheduler_block_size,
        "hash_block_size": c.hash_block_size,
        "enable_caching": c.enable_caching,
        "num_prefill_lookahead": c.num_prefill_lookahead,
        "dcp_world_size": c.dcp_world_size,
        # Lookahead block hashes (0: legacy); the worker then builds the
        # manager with use_eagle=False, as vLLM's scheduler does.
        "num_hash_lookahead_tokens": c.num_hash_lookahead_tokens,
        "max_model_len": case.max_model_len,
        "num_blocks": case.num_blocks,
        "prompt_len": case.prompt_len,
        "steps": [{"kind": s.kind, "tokens": s.tokens, "drafts": s.drafts, "accepted": s.accepted}
                  for s in case.steps],
    }
    if case.probe is not None:
        message["probe"] = {"shared": case.probe.shared, "extra": case.probe.extra}
    return message
