"""What a theorem is: a claim over named symbols, its target, and its checks."""

from __future__ import annotations

from typing import Any, Callable

import attrs

from kvspec.model.arith import Arith

from .encoding import Vars
from .verdict import Status

__all__ = ["Target", "Theorem"]


@attrs.frozen
class Target:
    """The thing a claim is about: a registration rule or a condition."""

    name: str
    fn: Callable[..., Any]


@attrs.frozen
class Theorem:
    name: str
    category: str
    statement: str  # in words
    assumptions_text: str
    ints: tuple[str, ...]
    bools: tuple[str, ...]
    # assume(ar, v) -> bool term; claim(ar, v, target_fn) -> bool term.
    assume: Callable[[Arith, Vars], Any]
    claim: Callable[[Arith, Vars, Callable[..., Any]], Any]
    target: Target
    expected: Status = Status.PROVED
    # Known-wrong targets that must refute the claim (the vacuity check).
    refuters: tuple[Target, ...] = ()
    # Why no refuter is listed, when none is.
    no_refuter_reason: str = ""
    # Lemma instances (already proved on their own) added as hints.
    hints: Callable[[Arith, Vars], list[Any]] | None = None
    # Symbols whose sum is minimised in a counterexample.
    cost: tuple[str, ...] = ()
    # Renders a decoded counterexample in vLLM's vocabulary.
    explain: Callable[[dict[str, Any]], dict[str, Any]] | None = None
