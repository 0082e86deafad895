"""The worker's exceptions and its word on whose code raised (stdlib only).

``Unsupported``: this release cannot do what was asked (said, never guessed;
the engine driver and the deployment probe raise it too, through
``planning``); ``BadOperation``: kvspec sent an operation it should not have;
``Rejected``: vLLM refused to build a manager for the configuration.

Every error reply is made by ``error_reply`` and says why in one key,
``error_kind``: one of the kinds ``kvspec.model.replies.ErrorKind`` names
(this side has no attrs, so it spells them; the parent parses every reply
once into that enum and refuses one it does not know).
"""

import os
import sys
import traceback

__all__ = ["Unsupported", "BadOperation", "Rejected", "exception_origin", "error_reply", "raised"]

# The error kinds this side sends (``kvspec.model.replies.ErrorKind``).
UNSUPPORTED, CONSTRUCT, DRIVE, KVSPEC, ENVIRONMENT, FATAL = (
    "unsupported", "construct", "drive", "kvspec", "environment", "fatal")


class Unsupported(Exception):
    """A configuration or a call this release cannot express (said, never guessed)."""


class BadOperation(Exception):
    """An operation kvspec should not have sent (a request that is not there)."""


class Rejected(Exception):
    """vLLM refused to build a manager for this configuration."""


# kvspec's own code on the worker's side: ``subjects/worker.py`` and this
# package beside it.
_OURS = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep


def exception_origin(exc):
    """Whose code raised ``exc``: the innermost traceback frame that is in
    either vLLM's package or kvspec's worker code decides ("vllm" or
    "kvspec"; frames of other libraries, such as torch under vLLM, are passed
    over), and where."""
    vllm = sys.modules.get("vllm")
    roots = [os.path.realpath(p) + os.sep for p in getattr(vllm, "__path__", ())]
    for frame, line in reversed(list(traceback.walk_tb(exc.__traceback__))):
        path = os.path.realpath(frame.f_code.co_filename)
        if any(path.startswith(root) for root in roots):
            return {"origin": "vllm", "where": f"{os.path.basename(path)}:{line} in {frame.f_code.co_name}"}
        if path.startswith(_OURS):
            return {"origin": "kvspec", "where": f"{os.path.basename(path)}:{line} in {frame.f_code.co_name}"}
    return {"origin": "unknown"}


def error_reply(kind, message, **extra):
    """The reply that says the request failed, and why (``kind``)."""
    return {"ok": False, "error_kind": kind, "error": message, **extra}


def raised(exc):
    """What an exception's reply says of it: its type and words."""
    return f"{type(exc).__name__}: {exc}"
