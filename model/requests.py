"""What kvspec asks a worker, typed: one frozen class per request.

Each class names its ``op`` and holds that request's fields; ``to_wire`` is
the JSON object sent (``model.wire.OPS`` lists each op's fields, and the
worker parses them with ``model.wire.parse_request``, stdlib only), and
``request_of`` parses one back through that same parse (a request is
checked by it when it is made: one the worker would refuse cannot be built).  The payloads are
the model's own wire forms: a case's ``case_message``, a program's
``machine_case``, an engine setup's ``message``, operations as plain dicts
(``model.program``).  ``SubjectProcess`` (``subjects/process.py``) takes
these and nothing else: ``run``/``stream`` a ``Run``/``Stream``, ``session``
every request for an open machine, engine or replay.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import attrs

from .case import Case
from .wire import OPS, MalformedRequest, parse_request

__all__ = [
    "EngineOps", "MachineOps", "MachineTrace", "MalformedRequest", "MambaLayerCheckpointFields", "OpenEngine",
    "OpenMachine", "OpenSession", "PrefillChunks", "Quit", "Request", "Run", "SessionActions", "Stats", "Stream",
    "case_message", "request_of",
]

_Json = Mapping[str, Any]


@attrs.frozen
class Request:
    """A request: its ``op``; ``opens`` what a later request acts on, or
    ``needs`` what an earlier one opened (a ``machine``, ``engine`` or
    ``replay``, which lives in one worker and cannot move)."""

    op: ClassVar[str] = ""
    opens: ClassVar[bool] = False
    needs: ClassVar[str | None] = None

    def __attrs_post_init__(self) -> None:
        # What the worker would refuse is refused where it is made: a kvspec
        # bug at its source, never a request sent and answered with an error.
        parse_request(self.to_wire())

    def to_wire(self) -> dict[str, Any]:
        """The JSON object sent (arrays as lists, as the worker reads them)."""
        wire: dict[str, Any] = {"op": self.op}
        for field in OPS[self.op]:
            value = getattr(self, field.name)
            wire[field.name] = list(value) if field.type is list else value
        return wire


@attrs.frozen
class Run(Request):
    """One case, the retry of a stream's case on a fresh worker."""

    op: ClassVar[str] = "run"
    case: _Json

    @classmethod
    def of(cls, case: Case) -> "Run":
        return cls(case_message(case))


@attrs.frozen
class Stream(Request):
    """Cases, each answered as it is done, then an end marker."""

    op: ClassVar[str] = "stream"
    cases: tuple[_Json, ...] = attrs.field(converter=tuple)

    @classmethod
    def of(cls, cases: Iterable[Case]) -> "Stream":
        return cls(case_message(case) for case in cases)


@attrs.frozen
class OpenSession(Request):
    """A manager for a hit-rate replay (``subjects/drivers/hitrate.py``'s ``session_case``)."""

    op: ClassVar[str] = "open_session"
    opens: ClassVar[bool] = True
    case: _Json


@attrs.frozen
class SessionActions(Request):
    """Scheduler actions on the open replay, answered each."""

    op: ClassVar[str] = "session_actions"
    needs: ClassVar[str | None] = "replay"
    actions: tuple[_Json, ...] = attrs.field(converter=tuple)


@attrs.frozen
class PrefillChunks(Request):
    """vLLM's scheduler chunking of each prompt length on one geometry (a ``case_message``)."""

    op: ClassVar[str] = "prefill_chunks"
    case: _Json
    prompts: tuple[int, ...] = attrs.field(converter=tuple)


@attrs.frozen
class MambaLayerCheckpointFields(Request):
    """What the release's Mamba2 layer declares."""

    op: ClassVar[str] = "mamba_layer_checkpoint_fields"


@attrs.frozen
class OpenMachine(Request):
    """A manager for the stateful differential (``Program.machine_case``)."""

    op: ClassVar[str] = "open_machine"
    opens: ClassVar[bool] = True
    case: _Json


@attrs.frozen
class _Operations(Request):
    """Operations on an open machine or engine, answered each; ``observe``:
    the manager's state read and sent after each (off: the benchmark's
    unchecked baseline)."""

    ops: tuple[_Json, ...] = attrs.field(converter=tuple)
    observe: bool = True


@attrs.frozen
class MachineOps(_Operations):
    """Operations on the open machine, answered each with its result and the
    manager's state after it."""

    op: ClassVar[str] = "machine_ops"
    needs: ClassVar[str | None] = "machine"


@attrs.frozen
class MachineTrace(Request):
    """The vLLM calls the open machine's operations made."""

    op: ClassVar[str] = "machine_trace"
    needs: ClassVar[str | None] = "machine"


@attrs.frozen
class OpenEngine(Request):
    """A real Scheduler built by the release's configuration code (``EngineSetup.message``)."""

    op: ClassVar[str] = "open_engine"
    opens: ClassVar[bool] = True
    setup: _Json


@attrs.frozen
class EngineOps(_Operations):
    """Operations on the open engine, answered each with what the step observed
    and the manager's state after it."""

    op: ClassVar[str] = "engine_ops"
    needs: ClassVar[str | None] = "engine"


@attrs.frozen
class Stats(Request):
    """The worker's counters: cases run, managers built, whether reuse is on."""

    op: ClassVar[str] = "stats"


@attrs.frozen
class Quit(Request):
    """The end of the worker."""

    op: ClassVar[str] = "quit"


_CLASSES: dict[str, type[Request]] = {cls.op: cls for cls in (
    Run, Stream, OpenSession, SessionActions, PrefillChunks, MambaLayerCheckpointFields, OpenMachine, MachineOps,
    MachineTrace, OpenEngine, EngineOps, Stats, Quit)}


def request_of(record: Any) -> Request:
    """The request a JSON object is, through the worker's own parse;
    ``MalformedRequest`` if it is not one."""
    parsed = parse_request(record)
    return _CLASSES[parsed.op](*parsed)


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
