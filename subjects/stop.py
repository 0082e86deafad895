"""A request to stop the run, kept until the run ends.

kvspec's stop signals (SIGINT, SIGTERM, SIGHUP; ``kvspec.cli``) raise
KeyboardInterrupt where the main thread is.  When that is inside a finalizer
(a ``__del__`` or a weakref callback the garbage collector runs), Python
prints "Exception ignored" and goes on: the interrupt is lost and the run
would finish as if none had come.  So the request is also kept here, and
every new request to a worker (``subjects/process.py``) raises it again:
a run never starts more work after it was asked to stop.
"""

from __future__ import annotations

__all__ = ["request_stop", "clear", "raise_if_requested", "requested"]

_requested: list[str] = []


def request_stop(name: str) -> None:
    """Record that the run was asked to stop (by the signal ``name``)."""
    _requested.append(name)


def requested() -> list[str]:
    """The stop requests received since the run began, first first."""
    return list(_requested)


def clear() -> None:
    """A new run begins (kvspec may be called in-process more than once)."""
    _requested.clear()


def raise_if_requested() -> None:
    """KeyboardInterrupt if the run was asked to stop."""
    if _requested:
        raise KeyboardInterrupt(f"stopped by {_requested[0]}")
