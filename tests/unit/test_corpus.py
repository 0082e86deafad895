"""The named corpus, run against both backends."""

import pytest

from kvspec.model.corpus import CORPUS
from kvspec.model.spec import evaluate_config, inputs_for_group
from kvspec.model.variants import variant

from tests.support import z3_value


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.name)
def test_integer_backend(case):
    for name, expected in case.expected.items():
        regs = evaluate_config(case.config, case.n, case.total_tokens or case.n, variant(name).rule)
        assert tuple(r.tokens_to_cache for r in regs) == expected, (name, case.source)


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.name)
def test_z3_backend(case):
    for name, expected in case.expected.items():
        got = tuple(
            z3_value(variant(name).rule, inputs_for_group(case.config, group, case.n))
            for group in range(len(case.config.groups))
        )
        assert got == expected, (name, case.source)
