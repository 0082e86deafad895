"""The worker's requests on the wire, and their one parse (standard library
only: the worker imports this module inside vLLM's runtime, which has no
attrs, on whatever Python that runtime pins).

Each request is a JSON object naming its ``op`` and the fields ``OPS`` lists
for it, each of one JSON type (an optional one has its default).  The parent
builds requests as ``model.requests`` classes, whose wire form this is; the
worker parses every line once with ``parse_request`` and dispatches on the
parsed request's ``op`` (``subjects/vllm_side/loop.py``).  A request that is
not one of these is ``MalformedRequest``: kvspec's error, never vLLM's.
"""

from __future__ import annotations

from collections import namedtuple

__all__ = ["OPS", "Field", "MalformedRequest", "parse_request"]

# A field of a request: its name, its JSON type (``dict``: an object, ``list``:
# an array, ``bool``), the JSON type of each item of an array (None: any) and
# whether it may be left out (then it is ``default``).
Field = namedtuple("Field", "name type items optional default", defaults=(None, False, None))

# Every request the worker takes, by ``op``, with its fields in order.
OPS = {
    # One case (a ``case_message``): the retry of a stream's case on a fresh worker.
    "run": (Field("case", dict),),
    # Cases, each answered as it is done, then an end marker.
    "stream": (Field("cases", list, dict),),
    # The hit-rate replay: a manager for a workload, then scheduler actions.
    "open_session": (Field("case", dict),),
    "session_actions": (Field("actions", list, dict),),
    # vLLM's scheduler chunking of prompt lengths on one geometry (the MTP search).
    "prefill_chunks": (Field("case", dict), Field("prompts", list, int)),
    # What the release's Mamba2 layer declares (the MTP search).
    "mamba_layer_checkpoint_fields": (),
    # The stateful differential: a manager (``Program.machine_case``), the
    # operations applied to it, the vLLM calls they made.
    "open_machine": (Field("case", dict),),
    "machine_ops": (Field("ops", list, dict), Field("observe", bool, optional=True, default=True)),
    "machine_trace": (),
    # The engine differential: a real Scheduler (``EngineSetup.message``), the operations.
    "open_engine": (Field("setup", dict),),
    "engine_ops": (Field("ops", list, dict), Field("observe", bool, optional=True, default=True)),
    # The worker's counters; the end of the worker.
    "stats": (),
    "quit": (),
}


class MalformedRequest(ValueError):
    """A request that is not one the protocol allows: a one-line cause."""


# The parsed form of each op's request: its fields as attributes, ``op`` beside them.
_PARSED = {op: namedtuple("Parsed_" + op, [f.name for f in fields]) for op, fields in OPS.items()}
for _op, _type in _PARSED.items():
    _type.op = _op


def parse_request(record):
    """The request the JSON object ``record`` is (its fields as attributes,
    ``op`` beside them); ``MalformedRequest`` if it is not one of ``OPS``."""
    if not isinstance(record, dict):
        raise MalformedRequest("a request is a JSON object, not %s" % type(record).__name__)
    op = record.get("op")
    if op not in OPS:
        raise MalformedRequest("unknown request %r" % (op,))
    unknown = sorted(set(record) - {"op"} - {f.name for f in OPS[op]})
    if unknown:
        raise MalformedRequest("a %s request has no field %s" % (op, ", ".join(unknown)))
    values = []
    for field in OPS[op]:
        if field.name not in record:
            if not field.optional:
                raise MalformedRequest("a %s request needs its %s" % (op, field.name))
            values.append(field.default)
            continue
        value = record[field.name]
        if not _is(value, field.type) or (
                field.items is not None and not all(_is(item, field.items) for item in value)):
            raise MalformedRequest("a %s request's %s is %s, not %s" % (
                op, field.name, _json_type(field.type, field.items), _short(value)))
        values.append(value)
    return _PARSED[op](*values)


def _is(value, kind):
    # JSON has no bool among its numbers: True is not an int here.
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


def _json_type(kind, items):
    name = {dict: "an object", list: "an array", bool: "true or false", int: "an integer"}[kind]
    return name if items is None else "%s of %ss" % (name, _json_type(items, None).split(" ", 1)[1])


def _short(value, limit=80):
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
