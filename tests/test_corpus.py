"""The named corpus, run against both backends."""

import pytest
import z3

from model.arith import Z3Arith
from model.corpus import CORPUS
from model.spec import BoundaryInputs, evaluate_config, inputs_for_group
from model.variants import variant


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.name)
def test_integer_backend(case):
    for name, expected in case.expected.items():
        regs = evaluate_config(case.config, case.n, case.total_tokens or case.n, variant(name).rule)
        assert tuple(r.tokens_to_cache for r in regs) == expected, (name, case.source)


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.name)
def test_z3_backend(case):
    for name, expected in case.expected.items():
        got = []
        for group in range(len(case.config.groups)):
            p = inputs_for_group(case.config, group, case.n)
            ar = Z3Arith()
            term = variant(name).rule(ar, BoundaryInputs(
                n=ar.const(p.n), S=ar.const(p.S), H=ar.const(p.H), B=ar.const(p.B),
                L=ar.const(p.L), eagle=z3.BoolVal(p.eagle, ar.ctx),
                partial=z3.BoolVal(p.partial, ar.ctx)))
            got.append(z3.simplify(term).as_long())
        assert tuple(got) == expected, (name, case.source)
