"""kvspec's model: the domain and the registration-boundary specification.

Data flows one way: ``model`` imports nothing of kvspec outside itself, and no vLLM.

The names below are loaded on first use (PEP 562), so importing a submodule
such as ``kvspec.model.outcome`` -- as the command line does to build its
parser -- does not import Z3 through the arithmetic interface.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers and editors: the same names, eagerly
    from .arith import INT, Arith, IntArith, Z3Arith
    from .domain import CoordinatorConfig, GroupKind, GroupRegistration, InvalidGeometry, KVCacheGroup
    from .spec import BoundaryInputs, evaluate_config, registration_bound
    from .variants import VARIANTS, Variant, variant

# Each public name and the submodule that defines it.
_WHERE = {
    "INT": "arith", "Arith": "arith", "IntArith": "arith", "Z3Arith": "arith",
    "CoordinatorConfig": "domain", "GroupKind": "domain", "GroupRegistration": "domain",
    "InvalidGeometry": "domain", "KVCacheGroup": "domain",
    "BoundaryInputs": "spec", "evaluate_config": "spec", "registration_bound": "spec",
    "VARIANTS": "variants", "Variant": "variants", "variant": "variants",
}

__all__ = [
    "INT", "Arith", "IntArith", "Z3Arith",
    "CoordinatorConfig", "GroupKind", "GroupRegistration", "InvalidGeometry",
    "KVCacheGroup",
    "BoundaryInputs", "evaluate_config", "registration_bound",
    "VARIANTS", "Variant", "variant",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
