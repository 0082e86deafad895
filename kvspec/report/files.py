"""Writing what a command produces: whole files, replaced atomically, so a
reader (or an interrupted run) never leaves half a report."""

from __future__ import annotations

import os
from pathlib import Path

from kvspec.model.errors import UsageError

__all__ = ["write_text", "append_step_summary"]


def write_text(path: str | os.PathLike, text: str) -> None:
    target = Path(path)
    partial = target.with_name(target.name + ".partial")
    partial.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
    os.replace(partial, target)


def append_step_summary(text: str) -> None:
    """Append to ``$GITHUB_STEP_SUMMARY`` when a CI job set it; a one-line
    ``UsageError`` when it cannot be appended to (a directory, read-only)."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if path:
        try:
            with open(path, "a", encoding="utf-8") as summary:
                summary.write(text if text.endswith("\n") else text + "\n")
        except OSError as exc:
            raise UsageError(f"GITHUB_STEP_SUMMARY={path}: cannot append the summary there "
                             f"({exc.strerror or exc}); the reports named on the command line were written") from None
