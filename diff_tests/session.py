"""The pytest session's subjects, for tests that cannot take fixtures (the
stateful differential's unittest-style classes in ``test_differential``).

The plugin (``kvspec.pytest_plugin``, a layer above) fills this in when pytest
is configured; it imports only the standard library, so the plugin stays
import-light.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["configure", "subject_ids", "live", "label"]

_subject_ids: list[str] = []
_open: list[Callable[[str], Any]] = []
_label: list[Callable[[str], str]] = []


def configure(subject_ids: list[str], open_subject: Callable[[str], Any], label_of: Callable[[str], str]) -> None:
    _subject_ids[:] = subject_ids
    _open[:] = [open_subject]
    _label[:] = [label_of]


def subject_ids() -> list[str]:
    """The subjects this session tests (none outside a configured pytest session)."""
    return list(_subject_ids)


def live(subject_id: str) -> Any:
    """The session's live worker for ``subject_id``, started on first use."""
    if not _open:
        raise RuntimeError("kvspec: no pytest session has configured its subjects")
    return _open[0](subject_id)


def label(subject_id: str) -> str:
    """A subject's label, without starting its worker."""
    if not _label:
        raise RuntimeError("kvspec: no pytest session has configured its subjects")
    return _label[0](subject_id)
