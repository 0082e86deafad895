"""A mutation operator: one named rewrite of a vLLM source file, checked.

``apply`` returns the mutated text only when the result parses and exactly
the one method the operator targets differs from the original (compared by
``ast.dump``); anything else is an error, never a silent no-op.
"""

from __future__ import annotations

from typing import Callable

import attrs

from kvspec.model.errors import SetupError

from .source import Edit, Missing, Source, function_dumps, parse

__all__ = ["MutationError", "MutationTargetNotFound", "MutationOperator", "Rewrite",
           "COORDINATOR_FILE", "MANAGER_FILE"]

COORDINATOR_FILE = "vllm/v1/core/kv_cache_coordinator.py"
MANAGER_FILE = "vllm/v1/core/single_type_kv_cache_manager.py"

# A rewrite returns (qualified name of the method it changes, edits).
Rewrite = Callable[[Source], tuple[str, list[Edit]]]


class MutationError(SetupError):
    """A mutation could not be applied: a one-line cause."""


class MutationTargetNotFound(MutationError):
    """The code an operator rewrites is absent or ambiguous in this source."""


@attrs.frozen
class MutationOperator:
    name: str
    summary: str  # one line
    models_variant: str  # the name of the wrong variant in model.variants
    rewrite: Rewrite = attrs.field(repr=False, eq=False)
    target_file: str = COORDINATOR_FILE  # relative to a tree root
    side: str = "registration"  # or "lookup": caught by the hit-length differential

    def mutated_method(self, source: str) -> str:
        """The qualified name of the one method this operator rewrites in ``source``."""
        try:
            qualname, _ = self.rewrite(Source(source))
        except Missing as e:
            raise MutationTargetNotFound(f"{self.name}: {self.target_file}: {e}") from None
        return qualname

    def apply(self, source: str) -> str:
        """The mutated text of ``target_file``.

        Raises ``MutationTargetNotFound`` when the code to rewrite is absent
        or ambiguous, ``MutationError`` if the result is not the intended
        single-method change.
        """
        try:
            src = Source(source)
            qualname, edits = self.rewrite(src)
        except Missing as e:
            raise MutationTargetNotFound(f"{self.name}: {self.target_file}: {e}") from None
        out = src.apply(edits)
        if out == source:
            raise MutationError(f"{self.name}: {self.target_file}: the rewrite changed nothing")
        try:
            after = parse(out)
        except SyntaxError as e:
            raise MutationError(
                f"{self.name}: {self.target_file}: the result does not parse ({e.msg}, line {e.lineno})"
            ) from None
        before_dumps, after_dumps = function_dumps(src.tree), function_dumps(after)
        changed = sorted(
            k for k in before_dumps.keys() | after_dumps.keys()
            if before_dumps.get(k) != after_dumps.get(k)
        )
        if changed != [qualname]:
            raise MutationError(
                f"{self.name}: {self.target_file}: expected a change in {qualname} only, "
                f"changed: {', '.join(changed) or 'nothing'}"
            )
        return out
