"""kvspec's own KV connector, written against vLLM's public ``KVConnectorBase_V1``.

Passed to the engine as a user passes an out-of-tree connector:
``--kv-transfer-config '{"kv_connector": "KvspecConnector",
"kv_connector_module_path": "kvspec.subjects.vllm_side.connector", ...}'``.
Its scheduler side serves *drawn* behaviour, per request, carried by the
request's own ``kv_transfer_params`` (``SamplingParams.extra_args``, the way a
client asks a P/D connector for a remote prefill) under ``"kvspec_load"``:

- ``offer``: how many leading prompt tokens the external store holds
  (``get_num_new_matched_tokens`` answers what lies past the local hit);
- ``async``: whether the load is asynchronous (the request waits for remote
  KVs until the engine driver reports ``finished_recving``);
- ``delay``: executed steps before an asynchronous load finishes;
- ``fail``: the loaded block, counted from the first, whose load fails (None:
  the load succeeds): the driver reports it in ``invalid_block_ids`` so vLLM's
  own recovery runs (``_handle_invalid_blocks``, ``evict_blocks``).

The worker side (the forward pass) does not run here: the engine driver
(``engine.EngineMachine``) reads the loads each step started from this
connector's metadata and builds the ``KVConnectorOutput`` a worker would.
Standard library and vLLM only.

An upstream script or regression test cannot import this module: it carries
the same behaviour as ``ExternalStoreConnector`` (``upstream_repro.CONNECTOR_CODE``).
A change here is a change there: ``tests/unit/test_script_connector.py`` and
``tests/integration/test_script_fidelity.py`` compare the two.
"""

# SupportsHMA (every release 0.22+): without it vLLM turns the hybrid KV-cache
# manager off for the connector, and hybrid layouts would not be driven.
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata, SupportsHMA

__all__ = ["KvspecConnector", "KvspecConnectorMetadata", "MODULE_PATH", "PLAN_KEY"]

MODULE_PATH = __name__
PLAN_KEY = "kvspec_load"


class KvspecConnectorMetadata(KVConnectorMetadata):
    """What one step hands the worker: the loads the scheduler started in it,
    each ``{"request", "async", "blocks", "tokens", "delay", "fail"}``
    (``blocks``: the ids the external tokens are written to, first group)."""

    def __init__(self, loads):
        self.loads = loads


class KvspecConnector(KVConnectorBase_V1, SupportsHMA):
    """Scheduler side only; the worker-side hooks are never called on a CPU."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        groups = list(getattr(kv_cache_config, "kv_cache_groups", ()) or ())
        # vLLM maps invalid_block_ids back to requests only on one-group
        # layouts (0.31+ raises otherwise; before, its unpacking fails): a
        # failing load is reported only there, and the plan is recorded as is.
        self.one_group = len(groups) == 1
        self.block_size = groups[0].kv_cache_spec.block_size if groups else 1
        self.asked = {}  # request id -> (local tokens presented, external tokens offered, asynchronous)
        self.started = []  # loads started since the last build_connector_meta

    # -- the drawn plan -------------------------------------------------------
    @staticmethod
    def plan(request):
        params = getattr(request, "kv_transfer_params", None) or {}
        return params.get(PLAN_KEY)

    # -- scheduler side ------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        plan = self.plan(request)
        if not plan:
            return 0, False
        load_async = bool(plan.get("async"))
        # The store holds prompt tokens only.  A synchronous load leaves the
        # last token to compute (as DecodeBenchConnector does); an asynchronous
        # one may cover the whole prompt (the P/D idiom: the scheduler then
        # recomputes the last token itself).
        limit = min(int(plan.get("offer", 0)), request.num_prompt_tokens,
                    request.num_tokens - (0 if load_async else 1))
        external = max(0, limit - num_computed_tokens)
        self.asked[request.request_id] = (num_computed_tokens, external, load_async and external > 0)
        return external, load_async and external > 0

    def may_load_async(self, request):  # 0.33+: only requests whose plan loads asynchronously
        plan = self.plan(request)
        return bool(plan and plan.get("async"))

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        if num_external_tokens <= 0:
            return  # the second call for an asynchronous load, or nothing to load
        plan = self.plan(request) or {}
        local, _, load_async = self.asked.get(request.request_id, (0, num_external_tokens, False))
        ids = blocks.get_block_ids()[0] if blocks is not None else []
        size = self.block_size
        first, end = local // size, -(-(local + num_external_tokens) // size)
        loaded = list(ids[first:end])
        fail = plan.get("fail")
        failing = None
        if fail is not None and self.one_group and loaded:
            failing = loaded[int(fail) % len(loaded)]
        self.started.append({"request": request.request_id, "async": load_async, "blocks": loaded,
                             "tokens": num_external_tokens, "delay": int(plan.get("delay", 0)),
                             "failing": failing})

    def build_connector_meta(self, scheduler_output):
        started, self.started = self.started, []
        return KvspecConnectorMetadata(started)

    def request_finished(self, request, block_ids):
        self.asked.pop(request.request_id, None)
        return False, None  # nothing is sent: the blocks are freed at once

    def request_finished_all_groups(self, request, block_ids):
        return self.request_finished(request, block_ids)

    # -- worker side: never run on a CPU (the driver plays the worker) --------
    def start_load_kv(self, forward_context, **kwargs):
        return None

    def wait_for_layer_load(self, layer_name):
        return None

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        return None

    def wait_for_save(self):
        return None
