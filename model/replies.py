"""What a worker answers, typed: whether it succeeded and, when it did not,
one ``WorkerError`` of one ``ErrorKind``.

The worker (``subjects/vllm_side/``) runs in vLLM's runtime, without attrs,
and answers in JSON; ``subjects/process.py`` parses every reply once, as it
reads it, into a ``Reply`` (a malformed one is kvspec's error, never a vLLM
finding).  A ``Reply`` is also the read-only mapping of the JSON object the
worker sent (``record``): the payload -- a case's ``calls`` and ``regime``, a
machine's ``answers`` and states -- is read by key, and ``record`` is what a
finding keeps as its observations.  Where a payload is read by key in more
than one place, it is parsed once too, by the request that asks for it
(``Reply.parse(record, op)``, ``PAYLOADS``): the reply's ``payload`` is then
typed (a ``MachineOpened``, an ``EngineOpened``, the ``PrefillChunking`` of
each prompt, a hit-rate replay's ``SessionAnswer`` per action).  Here, rather than in ``subjects``, so that the oracles, which
take replies, may import it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs

__all__ = ["PAYLOADS", "EngineOpened", "ErrorKind", "MachineOpened", "MalformedReply", "ObservedRegime",
           "PrefillChunking", "Reply", "SessionAnswer", "Started", "Stepped", "WorkerError", "record_of",
           "session_answers"]


class ErrorKind(str, enum.Enum):
    """Why a worker's reply is not ``ok`` (its ``error_kind`` on the wire)."""

    # This vLLM cannot do what was asked (a missing keyword, method or
    # attribute): said, never a finding.
    UNSUPPORTED = "unsupported"
    # vLLM refused the configuration (a manager, a machine, an engine): a
    # precondition finding when the model accepts it.
    CONSTRUCT = "construct"
    # vLLM raised while it was driven: a crash finding (``origin`` says whose
    # frames raised).
    DRIVE = "drive"
    # The worker process exited during the case, and again on a fresh worker
    # (``subjects/process.py`` says so, the worker cannot).
    CRASHED = "crashed"
    # kvspec asked what it should not have (no machine open, an operation on
    # a request that is not there, an exception in kvspec's own frames): a
    # kvspec bug, never vLLM's.
    KVSPEC = "kvspec"
    # The runtime lacks a module vLLM imports: a setup error.
    ENVIRONMENT = "environment"
    # vLLM cannot be imported at all (the hello).
    FATAL = "fatal"


class MalformedReply(ValueError):
    """A reply that is not one the protocol allows: a one-line cause."""


@attrs.frozen
class WorkerError:
    kind: ErrorKind
    message: str
    traceback: str | None = None
    origin: str | None = None  # whose frames raised: "vllm", "kvspec" or "unknown"
    where: str | None = None  # "file.py:line in function" of that frame
    index: int | None = None  # the operation of a batch that raised

    @property
    def in_kvspecs_code(self) -> bool:
        """Raised in kvspec's own worker code: kvspec's bug, never vLLM's."""
        return self.origin == "kvspec"


@attrs.frozen
class ObservedRegime:
    """The regime vLLM's coordinator chose for a case (a case reply's
    ``regime``), compared with the one the model derives
    (``model.capabilities.ExpectedRegime``)."""

    coordinator: str
    partial_hash_hits: bool
    use_eagle: tuple[bool, ...]  # per group manager
    block_sizes: tuple[int, ...]
    num_reprefillable_tokens: int

    @classmethod
    def parse(cls, value: Any) -> "ObservedRegime":
        try:
            regime = cls(value["coordinator"], value["partial_hash_hits"], tuple(value["use_eagle"]),
                         tuple(value["block_sizes"]), value["num_reprefillable_tokens"])
        except (KeyError, TypeError) as exc:
            raise MalformedReply(f"a case reply's regime names the coordinator, partial hash hits, EAGLE and "
                                 f"block sizes per group and the reprefillable tokens, this one {_short(value)} "
                                 f"({type(exc).__name__}: {exc})") from None
        if not (isinstance(regime.coordinator, str) and isinstance(regime.partial_hash_hits, bool)
                and all(isinstance(e, bool) for e in regime.use_eagle)
                and all(_count(b) for b in regime.block_sizes) and _count(regime.num_reprefillable_tokens)):
            raise MalformedReply(f"a case reply's regime has a value of the wrong type: {_short(value)}")
        return regime


@attrs.frozen
class MachineOpened:
    """A manager opened for the stateful differential (an ``open_machine``
    reply): its first state as the worker sent it (what
    ``model.state.ManagerState.from_dict`` reads), and what this vLLM lets the
    machine do."""

    state: Mapping[str, Any] = attrs.field(repr=False)
    groups: int
    can_evict: bool  # the manager has evict_blocks
    can_reset: bool  # the manager has reset_prefix_cache
    retention_interval: int | None  # the retention the coordinator took (None: it has none)

    @classmethod
    def parse(cls, record: Mapping[str, Any]) -> "MachineOpened":
        try:
            operations = record["operations"]
            opened = cls(record["state"], record["groups"], operations["evict"], operations["reset"],
                         record["retention_interval"])
        except (KeyError, TypeError) as exc:
            raise MalformedReply(f"an open_machine reply carries the state, the groups, the operations it allows "
                                 f"and the retention interval, this one {_short(record)} "
                                 f"({type(exc).__name__}: {exc})") from None
        if not (isinstance(opened.state, dict) and _count(opened.groups) and isinstance(opened.can_evict, bool)
                and isinstance(opened.can_reset, bool)
                and (opened.retention_interval is None or _count(opened.retention_interval))):
            raise MalformedReply(f"an open_machine reply has a value of the wrong type: {_short(record)}")
        return opened


@attrs.frozen
class EngineOpened:
    """A real Scheduler built for the engine differential (an ``open_engine``
    reply): what vLLM's configuration code derived (read by
    ``model.engine.derived_config`` and ``retention_layout``) and the
    manager's first state, as the worker sent them."""

    derived: Mapping[str, Any] = attrs.field(repr=False)
    state: Mapping[str, Any] = attrs.field(repr=False)

    @classmethod
    def parse(cls, record: Mapping[str, Any]) -> "EngineOpened":
        derived, state = record.get("derived"), record.get("state")
        if not (isinstance(derived, dict) and isinstance(state, dict)):
            raise MalformedReply(f"an open_engine reply carries what vLLM derived and the manager's state, "
                                 f"this one {_short(record)}")
        return cls(derived, state)


@attrs.frozen
class PrefillChunking:
    """vLLM's scheduler chunking of one prompt (a ``prefill_chunks`` reply's
    ``results``): the chunks it scheduled, and where it stalled (None: the
    prompt was computed)."""

    prompt: int
    chunks: tuple[int, ...]
    stalled_at: int | None = None

    @classmethod
    def parse_all(cls, record: Mapping[str, Any]) -> tuple["PrefillChunking", ...]:
        try:
            found = tuple(cls(r["prompt"], tuple(r["chunks"]), r["stalled_at"]) for r in record["results"])
        except (KeyError, TypeError) as exc:
            raise MalformedReply(f"a prefill_chunks reply carries each prompt's chunks and where it stalled, "
                                 f"this one {_short(record)} ({type(exc).__name__}: {exc})") from None
        for chunking in found:
            if not (_count(chunking.prompt) and all(_count(c) for c in chunking.chunks)
                    and (chunking.stalled_at is None or _count(chunking.stalled_at))):
                raise MalformedReply(f"a prefill_chunks reply has a value of the wrong type: {_short(record)}")
        return found


@attrs.frozen
class Started:
    """A replayed request's lookup (a session action ``start``'s answer): its
    hit and its tokens."""

    hit: int
    tokens: int


@attrs.frozen
class Stepped:
    """A replayed request's step (a session action ``step``'s answer): its
    computed tokens after it, and each group's ``num_tokens`` that reached
    ``cache_blocks`` in it (None: the group was handed none)."""

    computed: int
    num_tokens: tuple[int | None, ...]


# What each action of a hit-rate replay answers (``new_step`` and ``free``: nothing).
SessionAnswer = Started | Stepped | None


def session_answers(record: Mapping[str, Any]) -> tuple[SessionAnswer, ...]:
    """A ``session_actions`` reply's answers, one per action, typed: the same
    values the spec's ideal cache (``oracles.ideal_cache``) answers with."""
    sent = record.get("answers")
    if not isinstance(sent, list):
        raise MalformedReply(f"a session_actions reply carries its answers, this one {_short(record)}")
    answers: list[SessionAnswer] = []
    for answer in sent:
        if answer == {}:
            answers.append(None)
        elif isinstance(answer, dict) and answer.keys() == {"hit", "tokens"} and _count(answer["hit"]) \
                and _count(answer["tokens"]):
            answers.append(Started(answer["hit"], answer["tokens"]))
        elif isinstance(answer, dict) and answer.keys() == {"computed", "num_tokens"} and _count(answer["computed"]) \
                and isinstance(answer["num_tokens"], list) \
                and all(n is None or _count(n) for n in answer["num_tokens"]):
            answers.append(Stepped(answer["computed"], tuple(answer["num_tokens"])))
        else:
            raise MalformedReply(f"a session_actions reply answers each action with nothing, a hit and its tokens, "
                                 f"or the computed tokens and each group's num_tokens, this one {_short(record)}")
    return tuple(answers)


# The payloads parsed once, by the op of the request they answer (an ok reply's).
PAYLOADS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "open_machine": MachineOpened.parse,
    "open_engine": EngineOpened.parse,
    "prefill_chunks": PrefillChunking.parse_all,
    "session_actions": session_answers,
}


@attrs.frozen
class Reply(Mapping):
    """One reply, parsed: ``error`` is None when it is ``ok``; ``regime``, a
    case reply's; ``payload``, what an ok reply to a request of ``PAYLOADS``
    carries, typed."""

    record: Mapping[str, Any] = attrs.field(repr=False)
    error: WorkerError | None = None
    regime: ObservedRegime | None = None
    payload: Any = attrs.field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.error is None

    def failed_as(self, kind: ErrorKind) -> bool:
        """Whether the reply failed, for this reason."""
        return self.error is not None and self.error.kind is kind

    @classmethod
    def parse(cls, record: Any, op: str | None = None) -> "Reply":
        """The reply the JSON object ``record`` is, to a request of ``op``
        (None: a case's, or one whose payload is read whole); ``MalformedReply``
        if it is not one the protocol allows."""
        if not isinstance(record, dict):
            raise MalformedReply(f"a reply is a JSON object, not {type(record).__name__}")
        ok = record.get("ok")
        if not isinstance(ok, bool):
            raise MalformedReply(f"a reply says ok true or false, this one {_short(record)}")
        if ok:
            if "error_kind" in record:
                raise MalformedReply(f"an ok reply carries no error_kind, this one {_short(record)}")
            payload = PAYLOADS[op](record) if op in PAYLOADS else None
            return cls(record, regime=ObservedRegime.parse(record["regime"]) if "regime" in record else None,
                       payload=payload)
        kind, message = record.get("error_kind"), record.get("error")
        try:
            kind = ErrorKind(kind)
        except ValueError:
            raise MalformedReply(f"an error reply names one of the error kinds "
                                 f"({', '.join(k.value for k in ErrorKind)}), this one {_short(record)}") from None
        if not isinstance(message, str):
            raise MalformedReply(f"an error reply says its error in words, this one {_short(record)}")
        index = record.get("index")
        if index is not None and not _count(index):
            raise MalformedReply(f"an error reply's index is an operation's position, this one {_short(record)}")
        fields = {name: record.get(name) for name in ("traceback", "origin", "where")}
        for name, value in fields.items():
            if value is not None and not isinstance(value, str):
                raise MalformedReply(f"an error reply's {name} is text, this one {_short(record)}")
        return cls(record, WorkerError(kind, message, index=index, **fields))

    def __getitem__(self, key: str) -> Any:
        return self.record[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.record)

    def __len__(self) -> int:
        return len(self.record)


def record_of(reply: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON object a reply (or an answer of one) is: what a finding keeps."""
    return dict(reply.record) if isinstance(reply, Reply) else reply


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _short(record: dict[str, Any], limit: int = 160) -> str:
    text = repr(record)
    return text if len(text) <= limit else text[:limit] + "..."
