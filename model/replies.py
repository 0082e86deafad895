"""What a worker answers, typed: whether it succeeded and, when it did not,
one ``WorkerError`` of one ``ErrorKind``.

The worker (``subjects/vllm_side/``) runs in vLLM's runtime, without attrs,
and answers in JSON; ``subjects/process.py`` parses every reply once, as it
reads it, into a ``Reply`` (a malformed one is kvspec's error, never a vLLM
finding).  A ``Reply`` is also the read-only mapping of the JSON object the
worker sent (``record``): the payload -- a case's ``calls`` and ``regime``, a
machine's ``answers`` and states -- is read by key, and ``record`` is what a
finding keeps as its observations.  Here, rather than in ``subjects``, so that
the oracles, which take replies, may import it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

__all__ = ["ErrorKind", "MalformedReply", "ObservedRegime", "Reply", "WorkerError", "record_of"]


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
class Reply(Mapping):
    """One reply, parsed: ``error`` is None when it is ``ok``; ``regime``, a
    case reply's."""

    record: Mapping[str, Any] = attrs.field(repr=False)
    error: WorkerError | None = None
    regime: ObservedRegime | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def failed_as(self, kind: ErrorKind) -> bool:
        """Whether the reply failed, for this reason."""
        return self.error is not None and self.error.kind is kind

    @classmethod
    def parse(cls, record: Any) -> "Reply":
        """The reply the JSON object ``record`` is; ``MalformedReply`` if it is
        not one the protocol allows."""
        if not isinstance(record, dict):
            raise MalformedReply(f"a reply is a JSON object, not {type(record).__name__}")
        ok = record.get("ok")
        if not isinstance(ok, bool):
            raise MalformedReply(f"a reply says ok true or false, this one {_short(record)}")
        if ok:
            if "error_kind" in record:
                raise MalformedReply(f"an ok reply carries no error_kind, this one {_short(record)}")
            return cls(record, regime=ObservedRegime.parse(record["regime"]) if "regime" in record else None)
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
