"""What a worker answers, typed: whether it succeeded and, when it did not,
one ``WorkerError`` of one ``ErrorKind``.

The worker (``subjects/vllm_side/``) runs in vLLM's runtime, without attrs,
and answers in JSON; ``subjects/process.py`` parses every reply once, as it
reads it, into a ``Reply`` (a malformed one is kvspec's error, never a vLLM
finding).  A ``Reply`` is also the read-only mapping of the JSON object the
worker sent (``record``), which is what a finding keeps as its observations.
A case's ``calls`` are read by key (by the oracles that compare them); every
payload read in more than one place is parsed once, by the request that asks
for it (``Reply.parse(record, op)``, ``PAYLOADS``): the reply's ``payload``
is then typed (a ``MachineOpened``, an ``EngineOpened``, the
``PrefillChunking`` of each prompt, a hit-rate replay's ``SessionAnswer``
per action, and for ``machine_ops``/``engine_ops``, error replies included,
an ``Operated``: one ``OpAnswer`` per operation, with its ``OpResult``,
``LookupSeen`` and ``AllocationSeen``).  An ``OpAnswer`` keeps its JSON
object too (``record_of``); where the state oracle makes an answer's state
whole it returns a new answer (``OpAnswer.with_state``) and the record sent
stays as it was.  Here, rather than in ``subjects``, so that the oracles,
which take replies, may import it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs

__all__ = ["PAYLOADS", "AllocationSeen", "EngineOpened", "ErrorKind", "LookupSeen", "MachineOpened", "MalformedReply",
           "ObservedRegime", "OpAnswer", "OpResult", "Operated", "PrefillChunking", "Reply", "SessionAnswer", "Started",
           "Stepped", "WorkerError", "record_of", "session_answers"]


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


# -- the answers of machine_ops and engine_ops: one per operation ----------------------------------

def _ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _counts(value: Any) -> bool:
    return isinstance(value, list) and all(_count(v) for v in value)


def _per_request(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and _count(n) for k, n in value.items())


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


def _objects(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) for v in value)


def _checked(value: Any, what: str, required: Mapping[str, Callable[[Any], bool]],
             optional: Mapping[str, Callable[[Any], bool]] = {}) -> Mapping[str, Any]:
    """``value`` if it is a JSON object with every ``required`` key, no key
    neither names, and each value of the type its check wants; else
    ``MalformedReply`` saying ``what`` it should carry."""
    if not isinstance(value, dict):
        raise MalformedReply(f"{what}, this one {_short(value)}")
    missing = [k for k in required if k not in value]
    unknown = [k for k in value if k not in required and k not in optional]
    if missing or unknown:
        raise MalformedReply(f"{what}, this one {'lacks ' + ', '.join(missing) if missing else ''}"
                             f"{'; ' if missing and unknown else ''}{'has ' + ', '.join(unknown) if unknown else ''}: "
                             f"{_short(value)}")
    wrong = [k for k, check in {**required, **optional}.items() if k in value and not check(value[k])]
    if wrong:
        raise MalformedReply(f"{what}, this one has a value of the wrong type ({', '.join(wrong)}): {_short(value)}")
    return value


@attrs.frozen
class LookupSeen:
    """One ``get_computed_blocks`` the manager answered within an operation
    (a result's ``lookups``), as the worker observed it: the request, its hit
    and tokens, each group's blocks, the pool's digest before and after, the
    tokens a KV connector added, which of its block hashes the map held (one
    group only), and the shared-prefix junction the scheduler pinned (0.30+)."""

    request: str
    hit: int
    num_tokens: int
    group_blocks: tuple[tuple[int, ...], ...]
    before: tuple[Any, ...] = ()
    after: tuple[Any, ...] = ()
    external: int = 0
    mapped: tuple[Any, ...] | None = None
    junction: int | None = None
    # A connector's lookup whose groups ended at different points (0.27+
    # get_computed_blocks_for_connector): the hit is full attention's.
    diverged: bool = False

    @classmethod
    def parse(cls, value: Any) -> "LookupSeen":
        v = _checked(value, "a lookup names its request, hit, tokens and each group's blocks",
                     {"request": lambda x: isinstance(x, str), "hit": _count, "num_tokens": _count,
                      "group_blocks": lambda x: isinstance(x, list) and all(_counts(g) for g in x)},
                     {"before": _optional(lambda x: isinstance(x, list)), "after": _optional(lambda x: isinstance(x, list)),
                      "external": _count, "mapped": _optional(lambda x: isinstance(x, list)),
                      "junction": _optional(lambda x: isinstance(x, int)),
                      "diverged": lambda x: isinstance(x, bool)})
        return cls(v["request"], v["hit"], v["num_tokens"], tuple(tuple(g) for g in v["group_blocks"]),
                   _frozen(v.get("before")), _frozen(v.get("after")), v.get("external", 0),
                   None if v.get("mapped") is None else tuple(v["mapped"]), v.get("junction"),
                   v.get("diverged", False))


@attrs.frozen
class AllocationSeen:
    """One ``allocate_slots`` call within an engine operation (a result's
    ``allocations``; an engine crash's): each group's last block estimate,
    the free blocks before and after (None: it raised), the blocks each
    group asked the pool for, and whether it allocated.  An estimate is
    vLLM's own answer, negative where it gives one (0.28's Mamba 'align'
    manager subtracts the blocks a request already holds from those it
    needs and returns the difference as it is)."""

    request: str
    estimates: tuple[int | None, ...]
    free_before: int
    free_after: int | None
    taken: tuple[int, ...] = ()
    allocated: bool | None = None

    @classmethod
    def parse(cls, value: Any) -> "AllocationSeen":
        v = _checked(value, "an allocation names its request, each group's estimate and the free blocks before and "
                            "after",
                     {"request": lambda x: isinstance(x, str),
                      "estimates": lambda x: isinstance(x, list) and all(e is None or _integer(e) for e in x),
                      "free_before": _count, "free_after": _optional(_count)},
                     {"taken": _counts, "allocated": lambda x: isinstance(x, bool)})
        return cls(v["request"], tuple(v["estimates"]), v["free_before"], v["free_after"], tuple(v.get("taken", ())),
                   v.get("allocated"))


@attrs.frozen
class OpResult:
    """What one operation returned (an answer's ``result``; every field
    empty where the operation has none): a step's requests scheduled (their
    tokens), preempted and finished, its lookups, allocations and
    ``cache_blocks`` calls (``registrations``, as the registration
    differential records calls: read by ``oracles.registration``), the blocks
    evicted, the requests whose blocks were given back (``freed``) or that
    wait on a KV load (``loading``), and whether a reset succeeded (None: no
    reset)."""

    scheduled: Mapping[str, int] = attrs.field(factory=dict)
    preempted: tuple[str, ...] = ()
    finished: tuple[str, ...] = ()
    lookups: tuple[LookupSeen, ...] = ()
    allocations: tuple[AllocationSeen, ...] = ()
    registrations: tuple[Mapping[str, Any], ...] = ()
    evicted: tuple[int, ...] = ()
    freed: tuple[str, ...] = ()
    loading: tuple[str, ...] = ()
    reset: bool | None = None

    @classmethod
    def parse(cls, value: Any) -> "OpResult":
        v = _checked(value, "an operation's result holds what it scheduled, preempted, finished, looked up, "
                            "allocated, registered, evicted, freed, left loading or reset", {},
                     {"scheduled": _per_request, "preempted": _ids, "finished": _ids, "lookups": _objects,
                      "allocations": _objects,
                      "registrations": lambda x: _objects(x) and all(isinstance(c.get("request"), str) for c in x),
                      "evicted": _counts, "freed": _ids, "loading": _ids, "reset": lambda x: isinstance(x, bool)})
        return cls(dict(v.get("scheduled", {})), tuple(v.get("preempted", ())), tuple(v.get("finished", ())),
                   tuple(LookupSeen.parse(lk) for lk in v.get("lookups", ())),
                   tuple(AllocationSeen.parse(a) for a in v.get("allocations", ())),
                   tuple(v.get("registrations", ())), tuple(v.get("evicted", ())), tuple(v.get("freed", ())),
                   tuple(v.get("loading", ())), v.get("reset"))


@attrs.frozen
class OpAnswer:
    """One operation's answer on an open machine or engine: what it
    returned, the blocks handed out for zeroing, the running requests (their
    computed tokens) and the waiting ones, and the manager's state after it
    as sent (``state``: a delta whose ``same`` names the parts unchanged
    since the answer before, None when not observed), and for an engine step
    the answer of its ``schedule()`` alone (``scheduled``).  ``record`` is
    the JSON object sent: what a finding keeps (``record_of``)."""

    record: Mapping[str, Any] = attrs.field(repr=False, eq=False)
    result: OpResult
    running: Mapping[str, int]
    waiting: tuple[str, ...]
    state: Mapping[str, Any] | None = attrs.field(repr=False)
    handed_for_zeroing: tuple[int, ...] = ()
    scheduled: "OpAnswer | None" = None

    @classmethod
    def parse(cls, value: Any) -> "OpAnswer":
        v = _checked(value, "an operation's answer carries its result, the running and waiting requests and the "
                            "state after it",
                     {"result": lambda x: isinstance(x, dict), "running": _per_request, "waiting": _ids,
                      "state": _optional(lambda x: isinstance(x, dict))},
                     {"handed_for_zeroing": _counts, "scheduled": lambda x: isinstance(x, dict)})
        return cls(v, OpResult.parse(v["result"]), dict(v["running"]), tuple(v["waiting"]), v["state"],
                   tuple(v.get("handed_for_zeroing", ())),
                   None if v.get("scheduled") is None else cls.parse(v["scheduled"]))

    def with_state(self, state: Mapping[str, Any]) -> "OpAnswer":
        """This answer with ``state`` for the one sent, its record too (the
        oracle's state made whole): the record sent stays as it was."""
        return attrs.evolve(self, record={**self.record, "state": state}, state=state)

    def with_scheduled(self, scheduled: "OpAnswer") -> "OpAnswer":
        """This step's answer with ``scheduled`` for its schedule()'s, its record too."""
        return attrs.evolve(self, record={**self.record, "scheduled": scheduled.record}, scheduled=scheduled)

    def parts(self) -> tuple["OpAnswer", ...]:
        """The answers within, in order: a step's schedule()'s, then its own."""
        return (self.scheduled, self) if self.scheduled is not None else (self,)


@attrs.frozen
class Operated:
    """A ``machine_ops`` or ``engine_ops`` reply, typed: one answer per
    operation applied (up to the one that failed, on an error reply), and on
    an engine crash the failing operation's ``allocate_slots`` calls."""

    answers: tuple[OpAnswer, ...] = ()
    allocations: tuple[AllocationSeen, ...] = ()

    @classmethod
    def parse(cls, record: Mapping[str, Any]) -> "Operated":
        sent = record.get("answers", None if record["ok"] else [])  # an error before any answer carries none
        if not isinstance(sent, list):
            raise MalformedReply(f"an operations reply carries its answers, this one {_short(record)}")
        allocations = record.get("allocations", [])
        if not _objects(allocations):
            raise MalformedReply(f"an engine crash's allocations are a list, this one {_short(record)}")
        return cls(tuple(OpAnswer.parse(a) for a in sent), tuple(AllocationSeen.parse(a) for a in allocations))


# The payloads parsed once, by the op of the request they answer (an ok reply's).
PAYLOADS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "open_machine": MachineOpened.parse,
    "open_engine": EngineOpened.parse,
    "prefill_chunks": PrefillChunking.parse_all,
    "session_actions": session_answers,
    "machine_ops": Operated.parse,
    "engine_ops": Operated.parse,
}
# An error reply to these carries a payload too: the answers before the operation that failed.
_PAYLOADS_ON_ERROR = frozenset({"machine_ops", "engine_ops"})


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
        payload = PAYLOADS[op](record) if op in _PAYLOADS_ON_ERROR else None
        return cls(record, WorkerError(kind, message, index=index, **fields), payload=payload)

    def with_answers(self, answers: Iterable[OpAnswer]) -> "Reply":
        """This ``machine_ops``/``engine_ops`` reply with ``answers`` for the
        ones it carries (the oracle's, their states made whole), its record
        too: what a finding keeps.  The record sent stays as it was."""
        answers = tuple(answers)
        record = dict(self.record)
        if "answers" in record:
            record["answers"] = [dict(answer.record) for answer in answers]
        return attrs.evolve(self, record=record, payload=attrs.evolve(self.payload, answers=answers))

    def __getitem__(self, key: str) -> Any:
        return self.record[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.record)

    def __len__(self) -> int:
        return len(self.record)


def record_of(reply: Any) -> dict[str, Any]:
    """The JSON object a reply (or an answer of one) is: what a finding keeps."""
    return dict(reply.record) if isinstance(reply, (Reply, OpAnswer)) else reply


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: Any) -> bool:
    return _integer(value) and value >= 0


def _frozen(value: Any) -> tuple[Any, ...]:
    if value is None:
        return ()
    return tuple(tuple(v) if isinstance(v, list) else v for v in value)


def _short(record: Any, limit: int = 160) -> str:
    text = repr(record)
    return text if len(text) <= limit else text[:limit] + "..."
