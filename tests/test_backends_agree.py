"""The integer and Z3 backends give the same value for the spec and every variant."""

import pytest
import z3
from hypothesis import given, settings

from model.arith import INT, Z3Arith
from model.spec import BoundaryInputs
from model.variants import VARIANTS

from tests.strategies import boundary_inputs


def z3_value(rule, p: BoundaryInputs) -> int:
    ar = Z3Arith()
    ctx = ar.ctx
    symbolic = BoundaryInputs(
        n=z3.IntVal(p.n, ctx), S=z3.IntVal(p.S, ctx), H=z3.IntVal(p.H, ctx),
        B=z3.IntVal(p.B, ctx), L=z3.IntVal(p.L, ctx),
        eagle=z3.BoolVal(p.eagle, ctx), partial=z3.BoolVal(p.partial, ctx),
    )
    term = z3.simplify(rule(ar, symbolic))
    assert z3.is_int_value(term), f"did not reduce to a numeral: {term}"
    return term.as_long()


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
@settings(max_examples=60, deadline=None)
@given(p=boundary_inputs())
def test_backends_agree(variant, p):
    assert z3_value(variant.rule, p) == variant.rule(INT, p)


def test_int_backend_rejects_non_positive_divisor():
    with pytest.raises(ZeroDivisionError):
        INT.div(5, 0)
    with pytest.raises(ZeroDivisionError):
        INT.mod(5, -2)
