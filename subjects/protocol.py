"""The wire between kvspec and a worker: one JSON object per line each way.

Requests are ``model.requests`` classes, one per ``op``, each sent as its
``to_wire`` form; ``model.wire.OPS`` lists every op's fields, and the worker
parses each line once with ``model.wire.parse_request`` (stdlib only) and
answers it through the handler its ``op`` names (``vllm_side/loop.py``).
The ops: ``stream`` (cases, each answered as it is done, then an end marker)
and ``run`` (one case: the retry on a fresh worker), a case being sent as
its ``case_message``; ``open_session`` / ``session_actions`` (the hit-rate
replay); ``open_machine`` (a ``model.program.Program``'s ``machine_case``) /
``machine_ops`` (operations, answered each with its result and the manager's
state after it) / ``machine_trace`` (the vLLM calls they made), for the
stateful differential; ``open_engine`` / ``engine_ops`` (a real Scheduler,
for the engine differential); ``prefill_chunks`` (vLLM's scheduler chunking
of prompts on one geometry) and ``mamba_layer_checkpoint_fields`` (what the
release's Mamba2 layer declares), for the MTP search; ``stats``; ``quit``.
A line that is not a request the protocol allows (not JSON, an unknown op, a
field missing, unknown or of the wrong JSON type) is answered with a
``kvspec`` error: kvspec's bug, never vLLM's.

A case's reply carries ``ok``, then the observations (``calls``, ``regime``,
``probe``).  An error reply says why in one key, ``error_kind``
(``model.replies.ErrorKind``: ``construct``, vLLM refused the
configuration; ``drive``, vLLM raised; ``unsupported``, ``kvspec``,
``environment``, ``fatal``), with the ``error`` in words and, where vLLM
raised, the ``traceback`` and whose frames raised it (``origin``, ``where``).
The worker's first line is its hello: ``ok``, the introspected
``capabilities`` and where ``vllm`` came from.  ``subjects/process.py``
parses every reply once into a ``model.replies.Reply``, and its payload too
where ``model.replies.PAYLOADS`` names the request's op (``open_machine``,
``open_engine``, ``prefill_chunks``, ``session_actions``, and ``machine_ops``
and ``engine_ops``, whose error replies carry the answers before the failing
operation: one ``OpAnswer`` per operation).
"""

from __future__ import annotations

# Where a case's wire form lived before the requests were typed: kept for
# callers not yet moved to ``model.requests``.
from kvspec.model.requests import case_message

__all__ = ["case_message"]
