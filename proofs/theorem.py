"""What a theorem is: a claim over named symbols, a subject, and its checks."""

from __future__ import annotations

from typing import Any, Callable

import attrs

from model.arith import Arith

from .encoding import Vars
from .verdict import Status

__all__ = ["Subject", "Theorem"]


@attrs.frozen
class Subject:
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
    # assume(ar, v) -> bool term; claim(ar, v, subject_fn) -> bool term.
    assume: Callable[[Arith, Vars], Any]
    claim: Callable[[Arith, Vars, Callable[..., Any]], Any]
    subject: Subject
    expected: Status = Status.PROVED
    # Known-wrong subjects that must refute the claim (the vacuity check).
    refuters: tuple[Subject, ...] = ()
    # Why no refuter is listed, when none is.
    no_refuter_reason: str = ""
    # Lemma instances (already proved on their own) added as hints.
    hints: Callable[[Arith, Vars], list[Any]] | None = None
    # Symbols whose sum is minimised in a counterexample.
    cost: tuple[str, ...] = ()
    # Renders a decoded counterexample in vLLM's vocabulary.
    explain: Callable[[dict[str, Any]], dict[str, Any]] | None = None
