"""The state oracle: every observed transition of the manager held to
``model.state``'s invariants, one discrepancy per broken invariant (a
category each)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvspec.model.capabilities import Capabilities, expected_regime
from kvspec.model.finding import Category
from kvspec.model.program import describe_op
from kvspec.model.replies import LookupSeen, OpAnswer, WorkerError
from kvspec.model.retention import RetentionLayout, RetentionLedger
from kvspec.model.state import Allocation, Lookup, ManagerState, Transition, check_transition

from .registration import Discrepancy

__all__ = ["StateOracle"]


class StateOracle:
    """Follows one program: the last state seen, and each answer checked."""

    def __init__(self, program, capabilities: Capabilities, state: Mapping[str, Any], config=None,
                 retention: RetentionLayout | None = None):
        """``state``: the manager's state as the worker sent it when the machine
        or engine opened (``MachineOpened.state``, an ``open_engine`` reply's)."""
        self.program = program
        # The geometry: the program's own, or (engine programs) what vLLM's configuration code built.
        self.config = program.config if config is None else config
        self.capabilities = capabilities
        self.regime = expected_regime(self.config, capabilities)
        self.state = ManagerState.from_dict(state)
        self.compact: Mapping[str, Any] = state  # the last state as the worker sent it, whole
        self.running: dict[str, int] = {}
        self.peaks: dict[str, int] = {}  # running requests -> most computed tokens since they started running
        self.state_checked = False  # the opened state is never a transition's after: held to nothing yet
        # Engine programs: the history retention's owed hits are read from.
        self.ledger = None if retention is None else RetentionLedger(retention)
        self.owed_lookups = 0  # lookups the retention model owed a hit (how often retention_hit bit)
        self.lookups_seen: list[Lookup] = []  # every lookup checked, with its owed hit (kvspec.findings.impact reads them)
        self._entries_memo: tuple[Any, frozenset] | None = None

    def check(self, op: dict[str, Any], answer: OpAnswer) -> list[Discrepancy]:
        """The discrepancies of one operation's answer (the oracle moves on)."""
        return self.checked(op, answer)[1]

    def checked(self, op: dict[str, Any], answer: OpAnswer) -> tuple[OpAnswer, list[Discrepancy]]:
        """One operation's answer with its state made whole (the parts the
        worker sent as unchanged filled in from the answer before: what a
        finding keeps), and its discrepancies (the oracle moves on)."""
        result = answer.result
        if self.ledger is not None and op["do"] == "arrive":
            self.ledger.arrive(op["id"], op["tokens"])
        gone = result.preempted + result.freed
        if op["do"] in ("finish", "preempt"):
            gone += (op["id"],)
        allocations = tuple(Allocation(a.request, a.estimates, a.free_before, a.free_after, a.taken)
                            for a in result.allocations)
        sent = answer.state
        assert sent is not None, "an answer sent unobserved (its state not read) is never checked"
        same = sent.get("same", ())
        if same:  # parts equal to the previous answer's: a new answer, made whole for whoever keeps it
            sent = {**{part: self.compact[part] for part in same}, **{k: v for k, v in sent.items() if k != "same"}}
            answer = answer.with_state(sent)
        after = ManagerState.from_dict(sent, previous=self.state, same=same)
        lookups = tuple(self._lookup(lk, after) for lk in result.lookups)
        self.compact = sent
        # A request freed or preempted by the operation starts again from what it has now.
        peaks = {r: n if r in gone else max(n, self.peaks.get(r, 0)) for r, n in answer.running.items()}
        self.running, self.peaks = dict(answer.running), peaks
        # A prompt counts as computed after the step whose schedule() took its
        # last token (vLLM keys the blocks there; under async scheduling the
        # output may still be in flight, and a later lookup reads them anyway).
        # Until then every state seen counts: blocks registered by an earlier
        # chunk may leave the map before the prompt completes.
        if self.ledger is not None:
            self.ledger.preempted(result.preempted)
            self.ledger.progress(self.running, self._entries(after), settled=op["do"] != "step")
        transition = Transition(
            op=_OPS.get(op["do"], op["do"]), request=op.get("id"), before=self.state, after=after, config=self.config,
            regime=self.regime, capabilities=self.capabilities, running=self.running, lookups=lookups, gone=gone,
            reset_succeeded=result.reset, handed_for_zeroing=answer.handed_for_zeroing,
            allocations=allocations, evicted=result.evicted, peaks=peaks, loading=result.loading)
        found = check_transition(transition, before_checked=self.state_checked)
        self.state, self.state_checked = after, not found
        return answer, [Discrepancy(invariant.category, None, None,
                                    detail=f"{invariant.name}: {violation.message} (after {describe_op(op)})",
                                    group_kinds=violation.group_kinds)
                        for invariant, violation in found]

    def _lookup(self, lk: LookupSeen, after: ManagerState) -> Lookup:
        owed, why = 0, ""
        if self.ledger is not None:
            # Entries lost within the operation may have left before the lookup: only those kept throughout count.
            owed, why = self.ledger.owed(lk.request, lk.num_tokens, self._entries(self.state) & self._entries(after))
            self.ledger.lookup_made(lk.request, lk.junction)
            self.owed_lookups += owed > 0
        lookup = Lookup(request=lk.request, hit=lk.hit, num_tokens=lk.num_tokens, group_blocks=lk.group_blocks,
                        before=lk.before, after=lk.after, external=lk.external, mapped=lk.mapped, owed=owed,
                        owed_why=why, diverged=lk.diverged)
        self.lookups_seen.append(lookup)
        return lookup

    def _entries(self, state: ManagerState) -> frozenset:
        memo = self._entries_memo
        if memo is not None and memo[0] is state.hash_map:
            return memo[1]
        entries = frozenset(state.hash_map)
        self._entries_memo = (state.hash_map, entries)
        return entries

    @staticmethod
    def refused(error: WorkerError) -> Discrepancy:
        """vLLM would not build a manager the constructor's own validators accept."""
        return Discrepancy(Category.PRECONDITION, None, None, detail=f"vLLM refused the geometry: {error.message}")

    @staticmethod
    def crash(op: dict[str, Any] | None, error: WorkerError) -> Discrepancy:
        where = f" during {describe_op(op)}" if op else ""
        return Discrepancy(Category.SUBJECT_CRASH, None, None, detail=f"vLLM raised{where}: {error.message}")


# An engine operation in the state model's words (model.program.OPERATIONS).
_OPS = {"step": "schedule", "abort": "finish"}

