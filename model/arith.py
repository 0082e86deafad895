"""The small arithmetic interface the specification is written against.

The specification and its variants never use Python's ``if``, ``min``,
``max`` or ``//`` on values: they call these operations instead, so that the
same function runs on Python integers (``IntArith``, the executable oracle)
and builds Z3 terms (``Z3Arith``, the proofs).  ``+``, ``-``, ``*`` and the
comparisons are used directly: both ints and Z3 terms overload them with the
same meaning.

Division is floor division for a *positive* divisor.  SMT's ``div``/``mod``
are Euclidean and agree with Python's ``//``/``%`` exactly there; the domain
validators and the proof assumptions keep every divisor positive, and the
integer backend refuses a non-positive one rather than silently disagreeing.
"""

from __future__ import annotations

from typing import Any

import z3

__all__ = ["Arith", "IntArith", "Z3Arith", "INT"]


class Arith:
    """Operations the specification may use.  Subclasses give them meaning."""

    name = "abstract"

    def const(self, value: int) -> Any:
        raise NotImplementedError

    def true(self) -> Any:
        raise NotImplementedError

    def false(self) -> Any:
        raise NotImplementedError

    def ite(self, cond: Any, then: Any, otherwise: Any) -> Any:
        raise NotImplementedError

    def and_(self, *conds: Any) -> Any:
        raise NotImplementedError

    def or_(self, *conds: Any) -> Any:
        raise NotImplementedError

    def not_(self, cond: Any) -> Any:
        raise NotImplementedError

    def implies(self, cond: Any, then: Any) -> Any:
        return self.or_(self.not_(cond), then)

    def iff(self, a: Any, b: Any) -> Any:
        return self.and_(self.implies(a, b), self.implies(b, a))

    def div(self, x: Any, d: Any) -> Any:
        """Floor division by a positive divisor."""
        raise NotImplementedError

    def mod(self, x: Any, d: Any) -> Any:
        """Remainder of floor division by a positive divisor."""
        raise NotImplementedError

    # Derived operations: defined once here, in terms of the primitives.
    def min(self, a: Any, b: Any) -> Any:
        return self.ite(a <= b, a, b)

    def max(self, a: Any, b: Any) -> Any:
        return self.ite(a >= b, a, b)

    def round_down(self, x: Any, unit: Any) -> Any:
        """Largest multiple of ``unit`` not above ``x`` (vLLM's ``round_down``)."""
        return self.div(x, unit) * unit


class IntArith(Arith):
    """Concrete semantics on Python ints and bools: the executable oracle."""

    name = "int"

    def const(self, value: int) -> int:
        return int(value)

    def true(self) -> bool:
        return True

    def false(self) -> bool:
        return False

    def ite(self, cond: bool, then: Any, otherwise: Any) -> Any:
        return then if cond else otherwise

    def and_(self, *conds: bool) -> bool:
        return all(conds)

    def or_(self, *conds: bool) -> bool:
        return any(conds)

    def not_(self, cond: bool) -> bool:
        return not cond

    def div(self, x: int, d: int) -> int:
        if d <= 0:
            raise ZeroDivisionError(f"divisor must be positive, got {d}")
        return x // d

    def mod(self, x: int, d: int) -> int:
        if d <= 0:
            raise ZeroDivisionError(f"divisor must be positive, got {d}")
        return x % d


class Z3Arith(Arith):
    """Symbolic semantics: builds Z3 terms in one ``z3.Context``.

    Every proof gets its own context (solver time depends on history), so the
    backend is bound to one and coerces Python constants into it.
    """

    name = "z3"

    def __init__(self, ctx: z3.Context | None = None):
        self.ctx = ctx if ctx is not None else z3.Context()

    def _int(self, value: Any) -> Any:
        if isinstance(value, bool):
            raise TypeError("a bool where an integer term was expected")
        if isinstance(value, int):
            return z3.IntVal(value, self.ctx)
        return value

    def _bool(self, value: Any) -> Any:
        if isinstance(value, bool):
            return z3.BoolVal(value, self.ctx)
        return value

    def const(self, value: int) -> Any:
        return z3.IntVal(int(value), self.ctx)

    def true(self) -> Any:
        return z3.BoolVal(True, self.ctx)

    def false(self) -> Any:
        return z3.BoolVal(False, self.ctx)

    def ite(self, cond: Any, then: Any, otherwise: Any) -> Any:
        cond = self._bool(cond)
        if isinstance(then, bool) or isinstance(otherwise, bool) or z3.is_bool(then):
            return z3.If(cond, self._bool(then), self._bool(otherwise), self.ctx)
        return z3.If(cond, self._int(then), self._int(otherwise), self.ctx)

    def and_(self, *conds: Any) -> Any:
        return z3.And([self._bool(c) for c in conds] or [self.true()])

    def or_(self, *conds: Any) -> Any:
        return z3.Or([self._bool(c) for c in conds] or [self.false()])

    def not_(self, cond: Any) -> Any:
        return z3.Not(self._bool(cond), self.ctx)

    def div(self, x: Any, d: Any) -> Any:
        # z3's integer ``/`` is SMT div: Euclidean, equal to floor for d > 0.
        return self._int(x) / self._int(d)

    def mod(self, x: Any, d: Any) -> Any:
        return self._int(x) % self._int(d)

    def var(self, name: str) -> Any:
        return z3.Int(name, self.ctx)

    def bool_var(self, name: str) -> Any:
        return z3.Bool(name, self.ctx)


INT = IntArith()
