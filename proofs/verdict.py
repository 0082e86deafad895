"""Verdicts: what a proof run can say, and nothing more."""

from __future__ import annotations

import enum
from typing import Any

import attrs

__all__ = ["Status", "Counterexample", "VacuityCheck", "TheoremResult"]


class Status(str, enum.Enum):
    # The claim holds for every input satisfying the assumptions (solver: unsat).
    PROVED = "PROVED"
    # A concrete input satisfies the assumptions and violates the claim, and
    # replaying it through the integer semantics confirmed it.
    REFUTED = "REFUTED"
    # Timeout, solver gave up, or a model that did not replay: no conclusion.
    UNKNOWN = "UNKNOWN"


@attrs.frozen
class Counterexample:
    values: dict[str, Any]  # the solver's model, decoded to ints and bools
    replayed: bool  # integer semantics confirm: assumptions hold, claim fails
    minimal: bool  # no smaller cost satisfies the same query (confirmed unsat)
    cost: int
    domain: dict[str, Any]  # the example in vLLM's vocabulary (config, n, per-group values)

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen
class VacuityCheck:
    assumptions_satisfiable: Status  # PROVED means: a witness exists; UNKNOWN: budget ran out
    refuted_by: tuple[str, ...]  # catalogued wrong subjects that refute the claim
    not_refuted_by: tuple[str, ...]  # listed refuters the claim was PROVED for: vacuous
    note: str = ""
    # Listed refuters whose search ran out of budget: no conclusion either way.
    unknown_refuters: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """No sign of vacuity: the assumptions have a witness (or ran out of
        budget) and no listed refuter was proved to satisfy the claim."""
        return self.assumptions_satisfiable is not Status.REFUTED and not self.not_refuted_by

    @property
    def unknown(self) -> bool:
        """Part of the check ran out of budget: the theorem's verdict cannot be vouched for."""
        return self.assumptions_satisfiable is Status.UNKNOWN or bool(self.unknown_refuters)

    def as_dict(self) -> dict[str, Any]:
        d = attrs.asdict(self)
        d["ok"] = self.ok
        d["unknown"] = self.unknown
        return d


@attrs.frozen
class TheoremResult:
    name: str
    category: str
    statement: str
    assumptions: str
    expected: Status
    status: Status
    seconds: float
    counterexample: Counterexample | None = None
    vacuity: VacuityCheck | None = None
    detail: str = ""
    # The budget each solver check had, and the resource units spent (the
    # most one check took, and all checks together): the same on any machine.
    budget: dict[str, Any] | None = None
    resources: dict[str, int] | None = None

    @property
    def as_expected(self) -> bool:
        vacuity_ok = self.vacuity is None or self.vacuity.ok
        return self.status is self.expected and vacuity_ok

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "category": self.category,
            "statement": self.statement,
            "assumptions": self.assumptions,
            "expected": self.expected.value,
            "status": self.status.value,
            "as_expected": self.as_expected,
            "seconds": round(self.seconds, 4),
            "counterexample": None if self.counterexample is None else self.counterexample.as_dict(),
            "vacuity": None if self.vacuity is None else self.vacuity.as_dict(),
            "detail": self.detail,
            "budget": self.budget,
            "resources": self.resources,
        }
