"""Run by ``test_script_fidelity.py`` in a fresh process on a release's
runtime (stdlib and vLLM only; kvspec's worker code on the engine side): one
side builds schedulers as kvspec's engine worker does, the other as the
upstream script does (its rendered engine code, VLLM_TARGET_DEVICE=empty as
the script sets it), and each prints, per setup, what the scheduler was
built with and what each engine step scheduled.

    python scheduler_fidelity.py engine KVSPEC_DIR CASES.json
    python scheduler_fidelity.py script CASES.json

CASES.json: engine, a list of {"setup": worker setup message, "ops": engine
ops}; script, a list of {"code": the rendered engine code}.  The last line
of output is the JSON list of {"fingerprint": ..., "steps": ...} (and, on the
engine side, "derived": the settings a finding records, the script's source).
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
        steps = []
        for op in case["ops"]:
            answer = machine.apply(op)
            if op["do"] == "step" and answer.get("scheduled"):
                steps.append(answer["scheduled"]["result"]["scheduled"])
        out.append({"fingerprint": printed, "steps": steps, "derived": machine.derived})
    return out


def _script(cases):
    out = []
    for case in cases:
        names = {"__name__": "repro"}
        exec(compile(case["code"], "repro.py", "exec"), names)
        with tempfile.TemporaryDirectory() as model_dir:
            scheduler = names["make_scheduler"](model_dir)
        printed = fingerprint(scheduler)
        steps = []
        schedule = scheduler.schedule

        def recorded(*args, _schedule=schedule, **kwargs):
            output = _schedule(*args, **kwargs)
            steps.append(dict(output.num_scheduled_tokens))
            return output

        scheduler.schedule = recorded
        names["drive"](scheduler, names["OPS"])
        out.append({"fingerprint": printed, "steps": steps})
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
