"""``kvspec prove``'s use case: the theorem catalog over unbounded integers."""

from __future__ import annotations

from typing import Any, Callable

import attrs

from kvspec.model.outcome import Outcome

__all__ = ["ProveRun", "prove"]


@attrs.frozen
class ProveRun:
    results: tuple  # proofs.verdict.TheoremResult, in catalog order
    settings: dict[str, Any]

    @property
    def outcome(self) -> Outcome:
        from kvspec.proofs.verdict import Status

        if any(not r.as_expected and r.status is not Status.UNKNOWN for r in self.results):
            return Outcome.FINDING
        if any(r.status is Status.UNKNOWN or (r.vacuity is not None and r.vacuity.unknown)
               for r in self.results):
            return Outcome.UNKNOWN
        return Outcome.OK


def prove(names: list[str] | None = None, *, budget=None, seed: int = 0,
          progress: Callable | None = None) -> ProveRun:
    """The theorem catalog (or the named theorems) over unbounded integers,
    each solver check within ``budget`` (``proofs.runner.Budget``: resource
    units, the same verdict on any machine)."""
    from kvspec.model.errors import UsageError
    from kvspec.proofs.catalog import CATALOG, names as catalog_names, theorem
    from kvspec.proofs.runner import Budget, run_catalog

    if names:
        unknown = [n for n in names if n not in catalog_names()]
        if unknown:
            raise UsageError(f"unknown theorem {unknown[0]!r}; `kvspec prove --list` shows the catalog")
        chosen = [theorem(n) for n in names]
    else:
        chosen = list(CATALOG)
    budget = budget or Budget()
    results = run_catalog(chosen, budget=budget, seed=seed, progress=progress)
    return ProveRun(tuple(results), {**budget.as_dict(), "seed": seed})

