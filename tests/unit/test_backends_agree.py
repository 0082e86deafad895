"""The integer and Z3 backends give the same value for the subject and every variant."""

import pytest
from hypothesis import given, settings

from kvspec.model.arith import INT
from kvspec.model.variants import VARIANTS

from tests.support import boundary_inputs, z3_value


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
