"""kvspec's model: the domain and the registration-boundary specification.

Data flows one way: ``model`` imports nothing of kvspec outside itself, and no vLLM.
"""

from .arith import INT, Arith, IntArith, Z3Arith
from .domain import (
    CoordinatorConfig,
    GroupKind,
    GroupRegistration,
    InvalidGeometry,
    KVCacheGroup,
)
from .spec import BoundaryInputs, evaluate_config, registration_bound
from .variants import VARIANTS, Variant, variant

__all__ = [
    "INT", "Arith", "IntArith", "Z3Arith",
    "CoordinatorConfig", "GroupKind", "GroupRegistration", "InvalidGeometry",
    "KVCacheGroup",
    "BoundaryInputs", "evaluate_config", "registration_bound",
    "VARIANTS", "Variant", "variant",
]
