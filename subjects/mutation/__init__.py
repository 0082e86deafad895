"""Mutation operators: known-wrong rules re-introduced into real vLLM trees
by source transformation, to test kvspec against buggy subjects it has never
seen (``registration``, ``lookup`` and ``state`` operators; ``trees`` makes and checks
the mutant trees)."""

from __future__ import annotations

from .lookup import LOOKUP_MUTANTS
from .operator import (COORDINATOR_FILE, MANAGER_FILE, MutationError, MutationOperator,
                       MutationTargetNotFound)
from .registration import REGISTRATION_MUTANTS
from .state import BLOCK_POOL_FILE, STATE_MUTANTS
from .trees import MARKER_FILE, ensure_mutant_tree, make_mutant_tree, mutant_tree_differences

__all__ = ["ALL_MUTANTS", "REGISTRATION_MUTANTS", "LOOKUP_MUTANTS", "STATE_MUTANTS", "BLOCK_POOL_FILE", "MutationError", "MutationOperator",
           "MutationTargetNotFound", "mutant", "ensure_mutant_tree", "make_mutant_tree",
           "mutant_tree_differences", "COORDINATOR_FILE", "MANAGER_FILE", "MARKER_FILE"]

ALL_MUTANTS = REGISTRATION_MUTANTS + LOOKUP_MUTANTS + STATE_MUTANTS
_BY_NAME = {op.name: op for op in ALL_MUTANTS}


def mutant(name: str) -> MutationOperator:
    """The operator named ``name``; a UsageError naming the known ones otherwise."""
    from kvspec.model.errors import UsageError

    try:
        return _BY_NAME[name]
    except KeyError:
        raise UsageError(f"unknown mutation operator {name!r}; known: {', '.join(_BY_NAME)}") from None
