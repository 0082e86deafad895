"""Run by ``test_script_fidelity.py`` in a fresh process on a release's
runtime (stdlib and vLLM only; kvspec's worker code on the engine side): one
side builds schedulers as kvspec's engine worker does, the other as the
upstream script does (its rendered engine code, VLLM_TARGET_DEVICE=empty as
the script sets it), and each prints, per setup, what the scheduler was
built with, what each engine step scheduled, what passed between the
scheduler and its KV connector (``watch_connector``) and, under speculative
decoding, between the scheduler and the played model runner and drafter
(``watch_speculation``).

    python scheduler_fidelity.py engine KVSPEC_DIR CASES.json
    python scheduler_fidelity.py script CASES.json

CASES.json: engine, a list of {"setup": worker setup message, "ops": engine
ops}; script, a list of {"code": the rendered engine code}.  The last line
of output is the JSON list of {"fingerprint": ..., "steps": ..., "connector":
..., "speculation": ...} (and, on the engine side, "derived": the settings a finding records,
the script's source).
"""

import dataclasses
import enum
import json
import os
import sys
import tempfile
import types

_SCALARS = (int, float, str, bool, type(None))


def _value(value):
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(x, _SCALARS) for x in value):
        return sorted(value, key=repr) if isinstance(value, (set, frozenset)) else list(value)
    return ...  # not a plain value: left out


def _fields(obj, prefix, out):
    items = ({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj)
             else vars(obj))
    for name, value in items.items():
        if callable(value) and not isinstance(value, enum.Enum):
            continue  # kvspec's observation wrappers, methods
        plain = _value(value)
        if plain is not ...:
            out[f"{prefix}.{name}"] = plain


def fingerprint(scheduler):
    """Every plain value the scheduler, its configuration, its KV cache
    manager, coordinator, group managers and their specs hold."""
    out = {"scheduler.class": type(scheduler).__name__}
    _fields(scheduler, "scheduler", out)
    vc = scheduler.vllm_config
    for part in ("scheduler_config", "cache_config", "parallel_config", "speculative_config", "kv_transfer_config"):
        obj = getattr(vc, part, None)
        out[part] = None if obj is None else type(obj).__name__
        if obj is not None:
            _fields(obj, part, out)
    for name in ("num_hash_lookahead_tokens", "num_prefill_lookahead_tokens", "num_speculative_tokens",
                 "num_lookahead_tokens", "max_concurrent_batches"):
        value = _value(getattr(vc, name, None))
        out[f"vllm_config.{name}"] = None if value is ... else value
    _fields(scheduler.kv_cache_config, "kv_cache_config", out)
    manager = scheduler.kv_cache_manager
    _fields(manager, "manager", out)
    out["coordinator.class"] = type(manager.coordinator).__name__
    _fields(manager.coordinator, "coordinator", out)
    for index, group in enumerate(manager.coordinator.single_type_managers):
        out[f"group{index}.class"] = type(group).__name__
        _fields(group, f"group{index}", out)
        out[f"group{index}.spec.class"] = type(group.kv_cache_spec).__name__
        _fields(group.kv_cache_spec, f"group{index}.spec", out)
    out["connector"] = None if scheduler.connector is None else type(scheduler.connector).__name__
    return out


def watch_connector(scheduler):
    """What the scheduler asked its KV connector and what the worker side
    answered, in order: each get_num_new_matched_tokens (request, local hit,
    its answer), update_state_after_alloc (request, block ids, external
    tokens), each output's KVConnectorOutput (finished_recving,
    invalid_block_ids) and each evict_blocks (block ids)."""
    seen = []
    connector, manager = scheduler.connector, scheduler.kv_cache_manager
    if connector is not None:
        matched, alloc = connector.get_num_new_matched_tokens, connector.update_state_after_alloc

        def get_num_new_matched_tokens(request, num_computed_tokens, *args):
            out = matched(request, num_computed_tokens, *args)
            seen.append(["matched", request.request_id, num_computed_tokens, list(out)])
            return out

        def update_state_after_alloc(request, blocks, num_external_tokens, *args):
            ids = [list(group) for group in blocks.get_block_ids()] if blocks is not None else None
            seen.append(["alloc", request.request_id, ids, num_external_tokens])
            return alloc(request, blocks, num_external_tokens, *args)

        connector.get_num_new_matched_tokens = get_num_new_matched_tokens
        connector.update_state_after_alloc = update_state_after_alloc
    update = scheduler.update_from_output

    def update_from_output(scheduler_output, model_runner_output):
        out = getattr(model_runner_output, "kv_connector_output", None)
        if out is not None:
            seen.append(["output", sorted(out.finished_recving or ()), sorted(out.invalid_block_ids or ())])
        return update(scheduler_output, model_runner_output)

    scheduler.update_from_output = update_from_output
    evict = getattr(manager, "evict_blocks", None)
    if evict is not None:
        def evict_blocks(block_ids, *args, **kwargs):
            seen.append(["evict", sorted(block_ids)])
            return evict(block_ids, *args, **kwargs)

        manager.evict_blocks = evict_blocks
    return seen


def watch_speculation(scheduler):
    """What passed between the scheduler and the (played) model runner and
    drafter, in order: each schedule()'s drafts scheduled for verification
    (request: count), each update_from_output's sampled tokens (request:
    count) and each update_draft_token_ids (requests, drafts each)."""
    seen = []
    schedule, update = scheduler.schedule, scheduler.update_from_output
    propose = getattr(scheduler, "update_draft_token_ids", None)

    def scheduled(*args, **kwargs):
        output = schedule(*args, **kwargs)
        spec = getattr(output, "scheduled_spec_decode_tokens", None) or {}
        seen.append(["schedule", {rid: len(tokens) for rid, tokens in spec.items()}])
        return output

    def update_from_output(scheduler_output, model_runner_output):
        sampled = model_runner_output.sampled_token_ids
        seen.append(["sampled", {rid: len(sampled[i]) for i, rid in enumerate(model_runner_output.req_ids)}])
        return update(scheduler_output, model_runner_output)

    scheduler.schedule, scheduler.update_from_output = scheduled, update_from_output
    if propose is not None:
        def update_draft_token_ids(draft_token_ids, *args, **kwargs):
            seen.append(["drafts", list(draft_token_ids.req_ids),
                         [len(d) for d in draft_token_ids.draft_token_ids]])
            return propose(draft_token_ids, *args, **kwargs)

        scheduler.update_draft_token_ids = update_draft_token_ids
    return seen


def _engine(kvspec_dir, cases):
    # kvspec's worker code, as its worker process loads it.
    namespace = types.ModuleType("kvspec")
    namespace.__path__ = [kvspec_dir]
    sys.modules["kvspec"] = namespace
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from kvspec.subjects.vllm_side.engine import EngineMachine

    out = []
    for case in cases:
        machine = EngineMachine(case["setup"])
        printed = fingerprint(machine.scheduler)
        seen = watch_connector(machine.scheduler)
        speculation = watch_speculation(machine.scheduler)
        steps = []
        for op in case["ops"]:
            answer = machine.apply(op)
            if op["do"] == "step" and answer.get("scheduled"):
                steps.append(answer["scheduled"]["result"]["scheduled"])
        out.append({"fingerprint": printed, "steps": steps, "connector": seen, "speculation": speculation,
                    "derived": machine.derived})
    return out


def _script(cases):
    out = []
    for case in cases:
        # A module of its own, as the script runs: a connector written in it
        # is imported by vLLM from kv_connector_module_path (its __name__).
        module = types.ModuleType("repro")
        sys.modules["repro"] = module
        names = module.__dict__
        exec(compile(case["code"], "repro.py", "exec"), names)
        with tempfile.TemporaryDirectory() as model_dir:
            scheduler = names["make_scheduler"](model_dir)
        printed = fingerprint(scheduler)
        seen = watch_connector(scheduler)
        steps = []
        schedule = scheduler.schedule

        def recorded(*args, _schedule=schedule, **kwargs):
            output = _schedule(*args, **kwargs)
            steps.append(dict(output.num_scheduled_tokens))
            return output

        scheduler.schedule = recorded
        speculation = watch_speculation(scheduler)
        names["drive"](scheduler, names["OPS"])
        out.append({"fingerprint": printed, "steps": steps, "connector": seen, "speculation": speculation})
    return out


def main():
    side = sys.argv[1]
    if side == "engine":
        result = _engine(sys.argv[2], json.loads(open(sys.argv[3]).read()))
    else:
        os.environ["VLLM_TARGET_DEVICE"] = "empty"  # as the script sets it
        os.environ["HF_HUB_OFFLINE"] = "1"
        result = _script(json.loads(open(sys.argv[2]).read()))
    print(json.dumps(result, default=str))


if __name__ == "__main__":
    main()
