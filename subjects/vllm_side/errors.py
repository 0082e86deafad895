"""The worker's exceptions and its word on whose code raised (stdlib only).

``Unsupported``: this release cannot do what was asked (said, never guessed;
the engine driver and the deployment probe raise it too, through
``planning``); ``BadOperation``: kvspec sent an operation it should not have;
``Rejected``: vLLM refused to build a manager for the configuration.
"""

import os
import sys
import traceback

__all__ = ["Unsupported", "BadOperation", "Rejected", "exception_origin"]


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
