"""The one place text from a finding is made safe for a reader.

A finding may come from a file kvspec did not write (a CI artifact, a pull
request), so every field shown is untrusted text and must stay text: in
Markdown no link, image, HTML or new block; on a terminal no escape
sequence; in a command nothing but validated values.  Every renderer uses
these functions, none escapes on its own.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["md_inline", "code_span", "fence", "terminal", "path_safe", "PATH_SAFE"]

# ANSI/ECMA-48 sequences (CSI, OSC up to BEL or ST, any other ESC pair), then
# every other C0/C1 control and DEL; newline and tab are dealt with by each format.
_ESCAPE_SEQUENCE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]?|\x9b[0-?]*[ -/]*[@-~]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Markdown's own punctuation that can start a link, an image, code or a
# table cell, and the backslash (so a field cannot undo an escape):
# backslash-escaped.  HTML's < > & become entities.  Emphasis is harmless.
_MARKDOWN = re.compile(r"([\\`\[\]!|])")
# A file name or relative path a command may carry: no space, no shell
# character, no scheme, no parent step, not absolute.
PATH_SAFE = re.compile(r"(?!/)(?!.*\.\./)(?!.*://)[\w.+/-]+")


def _no_controls(text: str) -> str:
    return _CONTROL.sub("", _ESCAPE_SEQUENCE.sub("", text))


def terminal(text: Any) -> str:
    """``text`` for a terminal: escape sequences and control characters
    removed (newlines and tabs kept)."""
    return _no_controls(str(text).replace("\r\n", "\n").replace("\r", "\n"))


def md_inline(text: Any) -> str:
    """``text`` inline in Markdown: one line, no HTML, no link or image, no
    code span, no table cell break."""
    flat = _no_controls(str(text).replace("\r", " ").replace("\n", " ").replace("\t", " "))
    flat = flat.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MARKDOWN.sub(r"\\\1", flat)


def code_span(text: Any) -> str:
    """``text`` as one inline code span (nothing inside one is interpreted)."""
    body = _no_controls(str(text).replace("\r", " ").replace("\n", " ").replace("\t", " "))
    ticks = "`" * (max((len(m) for m in re.findall(r"`+", body)), default=0) + 1)
    pad = " " if body.startswith("`") or body.endswith("`") else ""
    return f"{ticks}{pad}{body}{pad}{ticks}"


def fence(text: Any, lang: str = "") -> list[str]:
    """A fenced block no line of ``text`` can close early (its fence is
    longer than any run of backticks in it); controls removed."""
    body = terminal(text).rstrip()
    ticks = "`" * max(3, max((len(m) for m in re.findall(r"`+", body)), default=0) + 1)
    return [f"{ticks}{lang}", body, ticks]


def path_safe(text: Any) -> str | None:
    """``text`` if it is a path a command may carry as it is, else None."""
    return text if isinstance(text, str) and PATH_SAFE.fullmatch(text) else None
