"""One root for every error kvspec raises on purpose.

Each error is a one-line cause (and what to do); its class says which
``Outcome`` it means, so the command line catches ``KvspecError`` once and
exits with that outcome's code.  Anything else escaping is a kvspec bug and
keeps its traceback.
"""

from __future__ import annotations

from .outcome import Outcome

__all__ = ["KvspecError", "UsageError", "InputError", "SetupError", "InfrastructureError", "UnknownName"]


class KvspecError(Exception):
    """Root of kvspec's errors: ``str(error)`` is the one line shown."""

    outcome: Outcome = Outcome.USAGE


class UsageError(KvspecError):
    """The command line asks for something kvspec cannot do."""


class UnknownName(UsageError, KeyError):
    """A name not in its catalog (a theorem, a deployment profile, a model
    variant): a usage error, and still a ``KeyError`` to code that looks names up."""

    def __str__(self) -> str:  # KeyError's own would quote the line
        return str(self.args[0]) if self.args else ""


class InputError(KvspecError):
    """A file or value handed to kvspec is malformed or outside the model's domain."""


class SetupError(KvspecError):
    """A subject cannot be provisioned, started or imported, or is not one kvspec models."""


class InfrastructureError(KvspecError):
    """The machine failed, not vLLM: a worker killed from outside or hung, again after a restart."""

    outcome = Outcome.INFRASTRUCTURE
